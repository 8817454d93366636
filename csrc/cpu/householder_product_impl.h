// CPU implementation of the gated / multi-step delta rule shared by the ops `gated_delta`
// (Gated DeltaNet, Yang, Kautz, Hatamizadeh, ICLR 2025, Eq. 10: alpha given, nh = 1) and
// `delta_product` (DeltaProduct, Siems et al., NeurIPS 2025, Sec. 3: alpha == nullptr, nh
// Householder steps per input). One (batch, head) pair per task, plain loops.
//
// Per input t (after the reset of step t), with the state W [dv][dk] row-major:
//   P_0 = alpha_t W_{t-1};  for j = 1..nh:  vb_j = P_{j-1} k_j,  u_j = beta_j (v_j - vb_j),
//   P_j = P_{j-1} + u_j (x) k_j;   W_t = P_nh,  y_t = W_t q_t.
// Every row of W evolves on its own within a step (row i needs only row i): the backward's
// recomputation makes one pass over the rows per step; the forward works on columns instead
// (see product_forward_task).
//
// D > 0: dk == dv == D known at compile time (16, 32, 64: the row loops unroll and vectorise);
// D == 0: any sizes.
//
// Backward of step t with G = dL/dW_t (updated in place to dL/dW_{t-1}):
//   G += gy (x) q;  gq = W_t^T gy = P_{nh-1}^T gy + k_nh (u_nh . gy);
//   for j = nh..1 (G = dL/dP_j):  gu = G k_j;  gv_j = beta_j gu;  gbeta_j = gu . (v_j - vb_j);
//     gvb = -beta_j gu;  gk_j = G^T u_j + P_{j-1}^T gvb;  G += gvb (x) k_j   (now dL/dP_{j-1});
//   galpha_t = <G, W_{t-1}>;  G = alpha_t G;  and G = 0 across a reset at t.
// The backward recomputes, inside one checkpoint chunk at a time, W_{t-1} (after the reset)
// and P_1..P_{nh-1} of every step (nh matrices per step; P_0 = alpha W_{t-1} is formed on the
// fly) with the u_j and v_j - vb_j.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../fastweight_params.h"
#include "fastweight_cpu_impl.h"

namespace rfwp {
namespace cpu {

// Offsets of step t's j-th key / value / beta of a task: [T, B, H, nh, len].
struct ProductTask : Task {
  int nh;
  ProductTask(const Dims& n, int bh_, int nh_) : Task(n, bh_), nh(nh_) {}
  size_t sub(int t, int j, int len) const { return vec(t, nh * len) + static_cast<size_t>(j) * len; }
  size_t sub_scal(int t, int j) const { return vec(t, nh) + j; }
};

// One input step on the rows of W (in place): decay, nh delta-rule steps, read with q.
// When `keep` is not null it receives P_1..P_{nh-1} (matrices 1..nh-1 of its nh slots; slot 0
// is the caller's copy of W_{t-1}) and `uv` the u_j and v_j - vb_j ([nh][2][dv]).
template <typename S, int D>
inline void product_step(const ProductFwdArgs<S>& a, const ProductTask& tk, int t, S* W,
                         S* keep, S* uv, S* y) {
  const int dk = D > 0 ? D : a.n.dk, dv = D > 0 ? D : a.n.dv, nh = a.nh;
  const size_t mat = static_cast<size_t>(dv) * dk;
  const S alpha = a.alpha != nullptr ? a.alpha[tk.scal(t)] : S(1);
  for (int i = 0; i < dv; ++i) {
    S* Wi = W + static_cast<size_t>(i) * dk;
    if (a.alpha != nullptr)                            // Gated DeltaNet Eq. 10: the decay
      for (int c = 0; c < dk; ++c) Wi[c] *= alpha;
    for (int j = 0; j < nh; ++j) {
      if (keep != nullptr && j > 0) copy_n(Wi, dk, keep + j * mat + static_cast<size_t>(i) * dk);
      const S* k = a.k + tk.sub(t, j, dk);
      const S diff = a.v[tk.sub(t, j, dv) + i] - dot(Wi, k, dk);   // v - vb, vb = P k
      const S u = a.beta[tk.sub_scal(t, j)] * diff;                 // the delta rule
      axpy(u, k, Wi, dk);                                            // P += u (x) k
      if (uv != nullptr) {
        uv[(2 * j) * dv + i] = u;
        uv[(2 * j + 1) * dv + i] = diff;
      }
    }
    if (y != nullptr) y[i] = dot(Wi, a.q + tk.vec(t, dk), dk);      // y = W_t q
  }
}

// The forward keeps W column-major, WT [dk][dv] (column c contiguous): every read
// r = W c = Σ_c c_c W[:, c] and every write W = s W + u (x) k are vector multiply-adds over
// the rows without horizontal sums, and the write of sub-step j is applied in the same pass as
// the read of sub-step j + 1 (or of y = W q): 1 + nh passes over W per input.
template <typename S, int D>
void product_forward_task(const ProductFwdArgs<S>& a, int bh, AlignedVector<S>& buf) {
  const Dims& n = a.n;
  const ProductTask tk(n, bh, a.nh);
  const int dk = D > 0 ? D : n.dk, dv = D > 0 ? D : n.dv, nh = a.nh;
  const size_t mat = static_cast<size_t>(dv) * dk;
  buf.resize(mat + 2 * static_cast<size_t>(dv));
  S* WT = buf.data();
  S* r = WT + mat;
  S* u = r + dv;
  transpose(a.W0 + tk.mat(mat), dv, dk, WT);
  for (int t = 0; t < n.T; ++t) {
    if (n.chunk > 0 && t % n.chunk == 0) transpose(WT, dk, dv, a.ckpt + tk.ckpt(t / n.chunk, mat));
    if (tk.reset(a.reset, t)) zero_n(WT, mat);
    const S alpha = a.alpha != nullptr ? a.alpha[tk.scal(t)] : S(1);
    const S* k0 = a.k + tk.sub(t, 0, dk);
    zero_n(r, dv);
    for (int c = 0; c < dk; ++c) axpy(k0[c], WT + static_cast<size_t>(c) * dv, r, dv);   // W k_1
    for (int j = 0; j < nh; ++j) {
      const S sc = j == 0 ? alpha : S(1);              // Gated DeltaNet Eq. 10: the decay
      const S beta = a.beta[tk.sub_scal(t, j)];
      const S* v = a.v + tk.sub(t, j, dv);
#pragma omp simd
      for (int i = 0; i < dv; ++i) u[i] = beta * (v[i] - sc * r[i]);   // the delta rule
      const S* k = a.k + tk.sub(t, j, dk);
      const S* next = j + 1 < nh ? a.k + tk.sub(t, j + 1, dk) : a.q + tk.vec(t, dk);
      zero_n(r, dv);
      for (int c = 0; c < dk; ++c) {                    // W = s W + u (x) k_j; r = W next
        S* __restrict__ w = WT + static_cast<size_t>(c) * dv;
        const S kc = k[c], nc = next[c];
#pragma omp simd
        for (int i = 0; i < dv; ++i) {
          w[i] = sc * w[i] + kc * u[i];
          r[i] += nc * w[i];
        }
      }
    }
    copy_n(r, dv, a.y + tk.vec(t, dv));                 // y_t = W_t q_t
  }
  transpose(WT, dk, dv, a.W + tk.mat(mat));
}

template <typename S>
struct ProductScratch {
  AlignedVector<S> G, states, uv, acc;
};

template <typename S, int D>
void product_backward_task(const ProductBwdArgs<S>& a, int bh, ProductScratch<S>& s) {
  const Dims& n = a.n;
  const int dk = D > 0 ? D : n.dk, dv = D > 0 ? D : n.dv, nh = a.nh, C = n.chunk;
  const ProductTask tk(n, bh, nh);
  const size_t mat = static_cast<size_t>(dv) * dk;
  s.G.resize(mat);
  s.states.resize(static_cast<size_t>(C > 0 ? C : 1) * nh * mat + mat);   // + the running state
  s.uv.resize(static_cast<size_t>(C > 0 ? C : 1) * nh * 2 * dv);
  s.acc.resize(2 * static_cast<size_t>(dk));
  S* G = s.G.data();
  S* run = s.states.data() + static_cast<size_t>(C > 0 ? C : 1) * nh * mat;
  S* gq_acc = s.acc.data();
  S* gk_acc = s.acc.data() + dk;
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(mat), mat, G);
  else zero_n(G, mat);
  // the forward's step function, for the recomputation
  const ProductFwdArgs<S> f{a.q, a.k, a.v, a.alpha, a.beta, nullptr, a.reset, nullptr, nullptr,
                            nullptr, n, nh};
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = t0 + C < n.T ? t0 + C : n.T;
    copy_n(a.ckpt + tk.ckpt(c, mat), mat, run);
    for (int t = t0; t < t1; ++t) {   // recompute W_{t-1}, P_1..P_{nh-1}, u, v - vb
      S* keep = s.states.data() + static_cast<size_t>(t - t0) * nh * mat;
      if (tk.reset(a.reset, t)) zero_n(run, mat);
      copy_n(run, mat, keep);
      product_step<S, D>(f, tk, t, run, keep, s.uv.data() + static_cast<size_t>(t - t0) * nh * 2 * dv,
                   static_cast<S*>(nullptr));
    }
    for (int t = t1 - 1; t >= t0; --t) {
      const S* keep = s.states.data() + static_cast<size_t>(t - t0) * nh * mat;
      const S* uv = s.uv.data() + static_cast<size_t>(t - t0) * nh * 2 * dv;
      const S alpha = a.alpha != nullptr ? a.alpha[tk.scal(t)] : S(1);
      const S* q = a.q + tk.vec(t, dk);
      const S* gy = a.gy + tk.vec(t, dv);
      zero_n(gq_acc, dk);
      S ugy = 0, galpha = 0;
      for (int j = nh - 1; j >= 0; --j) {
        const S* k = a.k + tk.sub(t, j, dk);
        const S* u = uv + (2 * j) * dv;
        const S* diff = uv + (2 * j + 1) * dv;
        const S beta = a.beta[tk.sub_scal(t, j)];
        const bool last = j == nh - 1;
        // P_{j}: a kept matrix, or P_0 = alpha W_{t-1} (slot 0) scaled on the fly
        const S* P = keep + static_cast<size_t>(j) * mat;
        const S pscale = j == 0 ? alpha : S(1);
        zero_n(gk_acc, dk);
        S gbeta = 0;
        for (int i = 0; i < dv; ++i) {
          S* Gi = G + static_cast<size_t>(i) * dk;
          const S* Pi = P + static_cast<size_t>(i) * dk;
          if (last) {                                   // the read y_t = W_t q_t
            axpy(gy[i], q, Gi, dk);
            axpy(gy[i] * pscale, Pi, gq_acc, dk);
            ugy += u[i] * gy[i];
          }
          const S gu = dot(Gi, k, dk);
          const S gvb = -beta * gu;
          a.gv[tk.sub(t, j, dv) + i] = beta * gu;
          gbeta += gu * diff[i];
          axpy(u[i], Gi, gk_acc, dk);                   // G^T u
          axpy(gvb * pscale, Pi, gk_acc, dk);           // P^T gvb
          axpy(gvb, k, Gi, dk);                         // now dL/dP_{j-1}
          if (j == 0 && a.alpha != nullptr) {           // P_0 = alpha W_{t-1}
            galpha += dot(Gi, Pi, dk);
            for (int col = 0; col < dk; ++col) Gi[col] *= alpha;
          }
        }
        a.gbeta[tk.sub_scal(t, j)] = gbeta;
        copy_n(gk_acc, dk, a.gk + tk.sub(t, j, dk));
        if (last) {
          const S* kl = a.k + tk.sub(t, nh - 1, dk);
          S* gq = a.gq + tk.vec(t, dk);
          for (int col = 0; col < dk; ++col) gq[col] = gq_acc[col] + kl[col] * ugy;
        }
      }
      if (a.alpha != nullptr) a.galpha[tk.scal(t)] = galpha;
      if (tk.reset(a.reset, t)) zero_n(G, mat);          // no gradient crosses a reset
    }
  }
  copy_n(G, mat, a.gW0 + tk.mat(mat));
}

}  // namespace cpu
}  // namespace rfwp
