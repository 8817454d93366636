// CPU implementation of the gated / multi-step delta rule shared by the ops `gated_delta`
// (Gated DeltaNet, Yang, Kautz, Hatamizadeh, ICLR 2025, Eq. 10: alpha given, nh = 1) and
// `delta_product` (DeltaProduct, Siems et al., NeurIPS 2025, Sec. 3: alpha == nullptr, nh
// Householder steps per input). One (batch, head) pair per task, plain loops.
//
// Per input t (after the reset of step t), with the state W [dv][dk] row-major:
//   P_0 = alpha_t W_{t-1};  for j = 1..nh:  vb_j = P_{j-1} k_j,  u_j = beta_j (v_j - vb_j),
//   P_j = P_{j-1} + u_j (x) k_j;   W_t = P_nh,  y_t = W_t q_t.
// The forward works on W column-major (product_forward_task); the backward recomputes the states
// row-major and runs the delta rule's backward step once per sub-step.
//
// D > 0: dk == dv == D known at compile time (16, 32, 64: the row loops unroll and vectorise);
// D == 0: any sizes.
//
// Backward of step t with G = dL/dW_t (updated in place to dL/dW_{t-1}):
//   G += gy (x) q;  gq = W_t^T gy = P_{nh-1}^T gy + k_nh (u_nh . gy);
//   for j = nh..1 (G = dL/dP_j):  gu = G k_j;  gv_j = beta_j gu;  gbeta_j = gu . (v_j - vb_j);
//     gvb = -beta_j gu;  gk_j = G^T u_j + P_{j-1}^T gvb;  G += gvb (x) k_j   (now dL/dP_{j-1});
//   galpha_t = <G, W_{t-1}>;  G = alpha_t G;  and G = 0 across a reset at t.
// The backward recomputes, inside one checkpoint chunk at a time, P_0..P_{nh-1} of every step
// (and W_{t-1} with a decay) with the u_j and v_j - vb_j.
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

// Consecutive steps of a task are B*H vectors apart (a page or more): the loops over time fetch
// the vectors of the step kPrefetchSteps ahead (q and y [dk | dv], the nh keys and values [nh
// dk | nh dv]; null pointers skipped).
template <typename S>
RFWP_INLINE void prefetch_ahead(const S* q, const S* k, const S* v, const S* y, const ProductTask& tk,
                                int T, int t, int dk, int dv) {
  if (t < 0 || t >= T) return;
  if (q != nullptr) prefetch_vec(q + tk.vec(t, dk), dk);
  if (y != nullptr) prefetch_vec(y + tk.vec(t, dv), dv);
  if (k != nullptr) prefetch_vec(k + tk.vec(t, tk.nh * dk), tk.nh * dk);
  if (v != nullptr) prefetch_vec(v + tk.vec(t, tk.nh * dv), tk.nh * dv);
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
    prefetch_ahead(a.q, a.k, a.v, a.y, tk, n.T, t + kPrefetchSteps, dk, dv);
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
  AlignedVector<S> G, states, uv, run, zeros, gq, acc;
};

// The backward reuses the delta rule's recomputation and backward steps (recompute_step,
// backward_step of fastweight_cpu_impl.h: register rows for D = 16/32/64) once per sub-step.
// Per step of a chunk it keeps P_0 = alpha W_{t-1}, P_1..P_{nh-1} (the states before each
// write) and, with a decay, W_{t-1} for galpha; the running state W_t is kept apart.
template <typename S, int D>
void product_backward_task(const ProductBwdArgs<S>& a, int bh, ProductScratch<S>& s) {
  const Dims& n = a.n;
  const int dk = D > 0 ? D : n.dk, dv = D > 0 ? D : n.dv, nh = a.nh, C = n.chunk;
  const ProductTask tk(n, bh, nh);
  const size_t mat = static_cast<size_t>(dv) * dk;
  const bool decay = a.alpha != nullptr;
  const int per_step = nh + (decay ? 1 : 0);            // matrices kept per step
  const size_t slots = static_cast<size_t>(C > 0 ? C : 1);
  s.G.resize(mat);
  s.states.resize(slots * per_step * mat);
  s.uv.resize(slots * nh * 2 * dv);
  s.run.resize(mat);
  s.zeros.assign(dv, S(0));
  s.gq.resize(dk);
  s.acc.resize(2 * static_cast<size_t>(dk));
  S* G = s.G.data();
  S* run = s.run.data();
  auto P = [&](int jt, int j) { return s.states.data() + (static_cast<size_t>(jt) * per_step + j) * mat; };
  auto u_of = [&](int jt, int j) { return s.uv.data() + (static_cast<size_t>(jt) * nh + j) * 2 * dv; };
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(mat), mat, G);
  else zero_n(G, mat);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = t0 + C < n.T ? t0 + C : n.T;
    copy_n(a.ckpt + tk.ckpt(c, mat), mat, run);
    for (int t = t0; t < t1; ++t) {   // recompute the states before every write, u, v - vb
      const int jt = t - t0;
      if (t + kPrefetchSteps < t1)
        prefetch_ahead<S>(nullptr, a.k, a.v, nullptr, tk, n.T, t + kPrefetchSteps, dk, dv);
      if (tk.reset(a.reset, t)) zero_n(run, mat);
      if (decay) {                                       // Gated DeltaNet Eq. 10: P_0 = alpha W
        const S alpha = a.alpha[tk.scal(t)];
        copy_n(run, mat, P(jt, nh));
        S* p0 = P(jt, 0);
#pragma omp simd
        for (size_t e = 0; e < mat; ++e) p0[e] = alpha * run[e];
      } else {
        copy_n(run, mat, P(jt, 0));
      }
      for (int j = 0; j < nh; ++j)
        recompute_step<S, D>(P(jt, j), j + 1 < nh ? P(jt, j + 1) : run, a.k + tk.sub(t, j, dk),
                             a.v + tk.sub(t, j, dv), a.beta[tk.sub_scal(t, j)], dk, dv, u_of(jt, j),
                             u_of(jt, j) + dv);
    }
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      if (t - kPrefetchSteps >= t0) {   // read: q, k, gy; written: gq, gk, gv
        prefetch_ahead<S>(a.q, a.k, nullptr, a.gy, tk, n.T, t - kPrefetchSteps, dk, dv);
        prefetch_ahead<S>(a.gq, a.gk, a.gv, nullptr, tk, n.T, t - kPrefetchSteps, dk, dv);
      }
      for (int j = nh - 1; j >= 0; --j) {   // the read y_t = W_t q_t belongs to the last write
        const bool last = j == nh - 1;
        a.gbeta[tk.sub_scal(t, j)] = backward_step<S, D>(
            G, P(jt, j), a.k + tk.sub(t, j, dk), a.q + tk.vec(t, dk), u_of(jt, j), u_of(jt, j) + dv,
            a.beta[tk.sub_scal(t, j)], last ? a.gy + tk.vec(t, dv) : s.zeros.data(), dk, dv,
            last ? a.gq + tk.vec(t, dk) : s.gq.data(), a.gk + tk.sub(t, j, dk),
            a.gv + tk.sub(t, j, dv), s.acc.data());
      }
      if (decay) {                                       // G = dL/dP_0: galpha, then dL/dW_{t-1}
        const S alpha = a.alpha[tk.scal(t)];
        const S* Wp = P(jt, nh);
        S ga = 0;
#pragma omp simd reduction(+ : ga)
        for (size_t e = 0; e < mat; ++e) {
          ga += G[e] * Wp[e];
          G[e] *= alpha;
        }
        a.galpha[tk.scal(t)] = ga;
      }
      if (tk.reset(a.reset, t)) zero_n(G, mat);          // no gradient crosses a reset
    }
  }
  copy_n(G, mat, a.gW0 + tk.mat(mat));
}

}  // namespace cpu
}  // namespace rfwp
