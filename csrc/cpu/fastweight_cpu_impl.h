// CPU implementation of the fused fast-weight recurrences: one (batch, head) pair per task.
//
// Plain C++ (no torch): fastweight_cpu.cpp runs the tasks in parallel with at::parallel_for.
// Every task owns its (b, h) slice of every output, so the results do not depend on how the
// tasks are scheduled (deterministic for any thread count).
//
// Fast weight matrices are row-major [dv][dk] (value rows, key columns). Each time step is
// ONE pass over the rows: per row i a fused dot product (W_i . k, W_i . q) and an axpy
// (W_i += u_i k), all contiguous loops over the key dimension that the compiler vectorises
// (`#pragma omp simd`; build with -fopenmp-simd). The backward pass is one pass over the rows
// of the gradient G = dL/dW_t and of the recomputed W_{t-1} per step, with a single dot
// product per row.
//
// Backward memory: the forward stores the state every `chunk` steps; the backward recomputes
// the states inside one chunk at a time (scratch of chunk x dv x dk per task) and walks it
// backwards. Exact: the recomputation repeats the forward's arithmetic operation for operation.
//
// Equations: RFWP paper ("Going Beyond Linear Transformers with Recurrent Fast Weight
// Programmers") Eq. 6-7 (lt), Eq. 8-10 (delta rule), Eq. 12 (delta_rnn), Eq. 15-18 (rdn).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../fastweight_params.h"

namespace rfwp {
namespace cpu {

// ---------------------------------------------------------------------------- vector helpers

template <typename S>
inline S dot(const S* __restrict__ a, const S* __restrict__ b, int n) {
  S s = 0;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

// (w . x1, w . x2) in one pass over w.
template <typename S>
inline void dot2(const S* __restrict__ w, const S* __restrict__ x1, const S* __restrict__ x2,
                 int n, S& o1, S& o2) {
  S s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
  for (int j = 0; j < n; ++j) {
    s1 += w[j] * x1[j];
    s2 += w[j] * x2[j];
  }
  o1 = s1;
  o2 = s2;
}

// y += a x
template <typename S>
inline void axpy(S a, const S* __restrict__ x, S* __restrict__ y, int n) {
#pragma omp simd
  for (int j = 0; j < n; ++j) y[j] += a * x[j];
}

// out = softmax(x) over n entries (max-subtracted).
template <typename S>
inline void softmax(const S* x, S* out, int n) {
  S m = x[0];
  for (int j = 1; j < n; ++j) m = std::max(m, x[j]);
  S z = 0;
  for (int j = 0; j < n; ++j) {
    out[j] = std::exp(x[j] - m);
    z += out[j];
  }
  const S inv = S(1) / z;
  for (int j = 0; j < n; ++j) out[j] *= inv;
}

// g_in = s * (g_out - s . g_out): backward of s = softmax(x).
template <typename S>
inline void softmax_backward(const S* s, const S* g_out, S* g_in, int n) {
  const S sg = dot(s, g_out, n);
  for (int j = 0; j < n; ++j) g_in[j] = s[j] * (g_out[j] - sg);
}

template <typename S>
inline S sigmoid(S x) {
  return S(1) / (S(1) + std::exp(-x));
}

// Index helpers for one (b, h) task.
struct Task {
  int bh, b, BH, B;
  Task(const Dims& n, int bh_) : bh(bh_), b(bh_ / n.H), BH(n.B * n.H), B(n.B) {}
  std::size_t vec(int t, int len) const { return (static_cast<std::size_t>(t) * BH + bh) * len; }
  std::size_t scal(int t) const { return static_cast<std::size_t>(t) * BH + bh; }
  std::size_t mat(std::size_t size) const { return static_cast<std::size_t>(bh) * size; }
  std::size_t ckpt(int c, std::size_t size) const {
    return (static_cast<std::size_t>(c) * BH + bh) * size;
  }
  bool reset(const uint8_t* r, int t) const {
    return r != nullptr && r[static_cast<std::size_t>(t) * B + b] != 0;
  }
};

template <typename S>
inline void copy_n(const S* src, std::size_t n, S* dst) {
  std::copy(src, src + n, dst);
}
template <typename S>
inline void zero_n(S* dst, std::size_t n) {
  std::fill(dst, dst + n, S(0));
}

// ----------------------------------------------------------------- one delta-rule step (rows)

// Forward of one write + read on W' (post-reset state, updated in place to W_t):
//   v̄ = W' k;  u = β (v - v̄) (delta) or u = v (lt);  W_t = W' + u ⊗ k;  y = W_t q.
// y_i is computed as W'_i . q + u_i (k . q) (same pass). Optionally stores u and v - v̄.
template <typename S, bool DELTA>
inline void delta_step_forward(S* W, const S* k, const S* q, const S* v, S beta, int dk, int dv,
                               S* y, S* u_out, S* diff_out) {
  const S kq = q != nullptr ? dot(k, q, dk) : S(0);
  for (int i = 0; i < dv; ++i) {
    S* Wi = W + static_cast<std::size_t>(i) * dk;
    S vb = 0, wq = 0;
    if (q != nullptr) {
      dot2(Wi, k, q, dk, vb, wq);          // RFWP Eq. 10 (v̄ = W k) and W' q
    } else if (DELTA) {
      vb = dot(Wi, k, dk);
    }
    const S diff = v[i] - vb;
    const S u = DELTA ? beta * diff : v[i];  // RFWP Eq. 8 (delta) / Eq. 6 (lt)
    axpy(u, k, Wi, dk);
    if (y != nullptr) y[i] = wq + u * kq;    // RFWP Eq. 7: y = W_t q
    if (u_out != nullptr) u_out[i] = u;
    if (diff_out != nullptr) diff_out[i] = diff;
  }
}

// Backward of one step given G = dL/dW_t (updated in place to dL/dW'), the recomputed
// W' = Wp, u, v - v̄ and gy = dL/dy_t (q may be null: no read at this step).
//   gq = W_t^T gy = W'^T gy + k (u . gy)
//   gu = G k;  gv = β gu (delta) | gu (lt);  gβ = gu . (v - v̄);  gv̄ = -β gu
//   gk = G^T u + W'^T gv̄ (+ the read's contribution, none here)
//   dL/dW' = G + gv̄ ⊗ k
// gq_acc, gk_acc are dk-long scratch vectors. Returns gβ.
template <typename S, bool DELTA>
inline S delta_step_backward(S* G, const S* Wp, const S* k, const S* q, const S* u,
                             const S* diff, S beta, const S* gy, int dk, int dv, S* gq_out,
                             S* gk_out, S* gv_out, S* gq_acc, S* gk_acc) {
  zero_n(gq_acc, dk);
  zero_n(gk_acc, dk);
  S ugy = 0, gbeta = 0;
  for (int i = 0; i < dv; ++i) {
    S* __restrict__ Gi = G + static_cast<std::size_t>(i) * dk;
    const S* __restrict__ Wpi = Wp + static_cast<std::size_t>(i) * dk;
    const S g = gy[i];
    S gu = 0;
#pragma omp simd reduction(+ : gu)
    for (int j = 0; j < dk; ++j) {
      Gi[j] += g * q[j];                    // from y = W_t q
      gu += Gi[j] * k[j];
    }
    const S ui = u[i];
    gv_out[i] = DELTA ? beta * gu : gu;
    ugy += ui * g;
    if (DELTA) {
      gbeta += gu * diff[i];
      const S gvb = -beta * gu;
#pragma omp simd
      for (int j = 0; j < dk; ++j) {
        gk_acc[j] += ui * Gi[j] + gvb * Wpi[j];
        gq_acc[j] += g * Wpi[j];
        Gi[j] += gvb * k[j];
      }
    } else {
#pragma omp simd
      for (int j = 0; j < dk; ++j) {
        gk_acc[j] += ui * Gi[j];
        gq_acc[j] += g * Wpi[j];
      }
    }
  }
  for (int j = 0; j < dk; ++j) {
    gq_out[j] = gq_acc[j] + k[j] * ugy;
    gk_out[j] = gk_acc[j];
  }
  return gbeta;
}

// ------------------------------------------------------------------------------ lt / delta

template <typename S, bool DELTA>
void delta_forward_task(const DeltaFwdArgs<S>& a, int bh, std::vector<S>& W) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const std::size_t mat = static_cast<std::size_t>(n.dv) * n.dk;
  W.resize(mat);
  copy_n(a.W0 + tk.mat(mat), mat, W.data());
  for (int t = 0; t < n.T; ++t) {
    if (t % n.chunk == 0) copy_n(W.data(), mat, a.ckpt + tk.ckpt(t / n.chunk, mat));
    if (tk.reset(a.reset, t)) zero_n(W.data(), mat);
    const S beta = DELTA ? a.beta[tk.scal(t)] : S(1);
    delta_step_forward<S, DELTA>(W.data(), a.k + tk.vec(t, n.dk), a.q + tk.vec(t, n.dk),
                                 a.v + tk.vec(t, n.dv), beta, n.dk, n.dv,
                                 a.y + tk.vec(t, n.dv), nullptr, nullptr);
  }
  copy_n(W.data(), mat, a.W + tk.mat(mat));
}

template <typename S>
struct DeltaScratch {
  std::vector<S> G, Wrun, Wbuf, ubuf, dbuf, gq_acc, gk_acc;
  void resize(std::size_t mat, int chunk, int dk, int dv) {
    G.resize(mat);
    Wrun.resize(mat);
    Wbuf.resize(mat * chunk);
    ubuf.resize(static_cast<std::size_t>(chunk) * dv);
    dbuf.resize(static_cast<std::size_t>(chunk) * dv);
    gq_acc.resize(dk);
    gk_acc.resize(dk);
  }
};

// Recompute W'_t (post-reset, before the write of step t) for t in [t0, t1) from the
// checkpoint at t0, with u_t and v_t - v̄_t, into Wbuf / ubuf / dbuf.
template <typename S, bool DELTA>
inline void delta_recompute_chunk(const S* ckpt, const S* k, const S* v, const S* beta,
                                  const uint8_t* reset, const Task& tk, const Dims& n, int t0,
                                  int t1, S* Wrun, S* Wbuf, S* ubuf, S* dbuf) {
  const std::size_t mat = static_cast<std::size_t>(n.dv) * n.dk;
  copy_n(ckpt, mat, Wrun);
  for (int t = t0; t < t1; ++t) {
    const int j = t - t0;
    if (tk.reset(reset, t)) zero_n(Wrun, mat);
    copy_n(Wrun, mat, Wbuf + j * mat);
    const S b = DELTA ? beta[tk.scal(t)] : S(1);
    delta_step_forward<S, DELTA>(Wrun, k + tk.vec(t, n.dk), nullptr, v + tk.vec(t, n.dv), b,
                                 n.dk, n.dv, nullptr, ubuf + static_cast<std::size_t>(j) * n.dv,
                                 dbuf + static_cast<std::size_t>(j) * n.dv);
  }
}

template <typename S, bool DELTA>
void delta_backward_task(const DeltaBwdArgs<S>& a, int bh, DeltaScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const std::size_t mat = static_cast<std::size_t>(n.dv) * n.dk;
  s.resize(mat, n.chunk, n.dk, n.dv);
  S* G = s.G.data();
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(mat), mat, G); else zero_n(G, mat);
  for (int c = num_chunks(n.T, n.chunk) - 1; c >= 0; --c) {
    const int t0 = c * n.chunk, t1 = std::min(n.T, t0 + n.chunk);
    delta_recompute_chunk<S, DELTA>(a.ckpt + tk.ckpt(c, mat), a.k, a.v, a.beta, a.reset, tk, n,
                                    t0, t1, s.Wrun.data(), s.Wbuf.data(), s.ubuf.data(),
                                    s.dbuf.data());
    for (int t = t1 - 1; t >= t0; --t) {
      const int j = t - t0;
      const S beta = DELTA ? a.beta[tk.scal(t)] : S(1);
      const S gb = delta_step_backward<S, DELTA>(
          G, s.Wbuf.data() + j * mat, a.k + tk.vec(t, n.dk), a.q + tk.vec(t, n.dk),
          s.ubuf.data() + static_cast<std::size_t>(j) * n.dv,
          s.dbuf.data() + static_cast<std::size_t>(j) * n.dv, beta, a.gy + tk.vec(t, n.dv),
          n.dk, n.dv, a.gq + tk.vec(t, n.dk), a.gk + tk.vec(t, n.dk), a.gv + tk.vec(t, n.dv),
          s.gq_acc.data(), s.gk_acc.data());
      if (DELTA) a.gbeta[tk.scal(t)] = gb;
      if (tk.reset(a.reset, t)) zero_n(G, mat);   // no gradient crosses a reset
    }
  }
  copy_n(G, mat, a.gW0 + tk.mat(mat));
}

// ------------------------------------------------------------------------------- delta_rnn

// One step: W and R written by the delta rule, y = W_t q + R_t s with s = softmax(y_{t-1}).
// Computes y = (W' q + u (k.q)) + (R' s + ur (kr.s)).
template <typename S>
inline void delta_rnn_step_forward(S* W, S* R, const S* q, const S* k, const S* v, S beta,
                                   const S* kr, const S* vr, S beta_r, const S* s, int dk, int dv,
                                   S* y, S* u, S* diff, S* ur, S* diffr) {
  const S kq = dot(k, q, dk), krs = dot(kr, s, dv);
  for (int i = 0; i < dv; ++i) {
    S* Wi = W + static_cast<std::size_t>(i) * dk;
    S* Ri = R + static_cast<std::size_t>(i) * dv;
    S vb, wq, vrb, rs;
    dot2(Wi, k, q, dk, vb, wq);             // RFWP Eq. 10 for W
    dot2(Ri, kr, s, dv, vrb, rs);           // RFWP Eq. 10 for R
    const S d1 = v[i] - vb, d2 = vr[i] - vrb;
    const S u1 = beta * d1, u2 = beta_r * d2;   // RFWP Eq. 8
    axpy(u1, k, Wi, dk);
    axpy(u2, kr, Ri, dv);
    if (y != nullptr) y[i] = (wq + u1 * kq) + (rs + u2 * krs);   // RFWP Eq. 12
    if (u != nullptr) {
      u[i] = u1;
      diff[i] = d1;
      ur[i] = u2;
      diffr[i] = d2;
    }
  }
}

template <typename S>
void delta_rnn_forward_task(const DeltaRnnFwdArgs<S>& a, int bh, std::vector<S>& buf) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int dk = n.dk, dv = n.dv;
  const std::size_t matW = static_cast<std::size_t>(dv) * dk, matR = static_cast<std::size_t>(dv) * dv;
  buf.resize(matW + matR + 2 * dv);
  S* W = buf.data();
  S* R = W + matW;
  S* yprev = R + matR;
  S* s = yprev + dv;
  copy_n(a.W0 + tk.mat(matW), matW, W);
  copy_n(a.R0 + tk.mat(matR), matR, R);
  copy_n(a.y0 + tk.mat(dv), dv, yprev);
  for (int t = 0; t < n.T; ++t) {
    if (t % n.chunk == 0) {
      copy_n(W, matW, a.ckptW + tk.ckpt(t / n.chunk, matW));
      copy_n(R, matR, a.ckptR + tk.ckpt(t / n.chunk, matR));
    }
    if (tk.reset(a.reset, t)) {
      zero_n(W, matW);
      zero_n(R, matR);
      zero_n(yprev, dv);
    }
    softmax(yprev, s, dv);                 // recurrent query softmax(y_{t-1}) (RFWP Eq. 12)
    S* y = a.y + tk.vec(t, dv);
    delta_rnn_step_forward(W, R, a.q + tk.vec(t, dk), a.k + tk.vec(t, dk), a.v + tk.vec(t, dv),
                           a.beta[tk.scal(t)], a.kr + tk.vec(t, dv), a.vr + tk.vec(t, dv),
                           a.beta_r[tk.scal(t)], s, dk, dv, y, (S*)nullptr, (S*)nullptr,
                           (S*)nullptr, (S*)nullptr);
    copy_n(y, dv, yprev);
  }
  copy_n(W, matW, a.W + tk.mat(matW));
  copy_n(R, matR, a.R + tk.mat(matR));
}

template <typename S>
struct DeltaRnnScratch {
  std::vector<S> G, GR, Wrun, Rrun, Wbuf, Rbuf, vecs, acc;
};

template <typename S>
void delta_rnn_backward_task(const DeltaRnnBwdArgs<S>& a, int bh, DeltaRnnScratch<S>& sc) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int dk = n.dk, dv = n.dv, C = n.chunk;
  const std::size_t matW = static_cast<std::size_t>(dv) * dk, matR = static_cast<std::size_t>(dv) * dv;
  sc.G.resize(matW);
  sc.GR.resize(matR);
  sc.Wrun.resize(matW);
  sc.Rrun.resize(matR);
  sc.Wbuf.resize(matW * C);
  sc.Rbuf.resize(matR * C);
  sc.vecs.resize(static_cast<std::size_t>(C) * 4 * dv);   // u, v - v̄, ur, vr - v̄r per step
  sc.acc.resize(2 * static_cast<std::size_t>(dk) + 6 * static_cast<std::size_t>(dv));
  S* G = sc.G.data();
  S* GR = sc.GR.data();
  S* gq_acc = sc.acc.data();
  S* gk_acc = gq_acc + dk;
  S* gs_acc = gk_acc + dk;     // dv
  S* gkr_acc = gs_acc + dv;    // dv
  S* s = gkr_acc + dv;         // dv: softmax(y_{t-1})
  S* gs = s + dv;              // dv
  S* carry = gs + dv;          // dv: dL/dy_{t-1} through the recurrent query
  S* gyt = carry + dv;         // dv
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(matW), matW, G); else zero_n(G, matW);
  if (a.gR != nullptr) copy_n(a.gR + tk.mat(matR), matR, GR); else zero_n(GR, matR);
  zero_n(carry, dv);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = std::min(n.T, t0 + C);
    // recompute W'_t, R'_t and the write vectors inside the chunk
    copy_n(a.ckptW + tk.ckpt(c, matW), matW, sc.Wrun.data());
    copy_n(a.ckptR + tk.ckpt(c, matR), matR, sc.Rrun.data());
    for (int t = t0; t < t1; ++t) {
      const int j = t - t0;
      if (tk.reset(a.reset, t)) {
        zero_n(sc.Wrun.data(), matW);
        zero_n(sc.Rrun.data(), matR);
      }
      copy_n(sc.Wrun.data(), matW, sc.Wbuf.data() + j * matW);
      copy_n(sc.Rrun.data(), matR, sc.Rbuf.data() + j * matR);
      S* vj = sc.vecs.data() + static_cast<std::size_t>(j) * 4 * dv;
      // no read needed here: pass q = k and s = kr with y = null (the dots are discarded)
      delta_rnn_step_forward(sc.Wrun.data(), sc.Rrun.data(), a.k + tk.vec(t, dk),
                             a.k + tk.vec(t, dk), a.v + tk.vec(t, dv), a.beta[tk.scal(t)],
                             a.kr + tk.vec(t, dv), a.vr + tk.vec(t, dv), a.beta_r[tk.scal(t)],
                             a.kr + tk.vec(t, dv), dk, dv, (S*)nullptr, vj, vj + dv,
                             vj + 2 * dv, vj + 3 * dv);
    }
    for (int t = t1 - 1; t >= t0; --t) {
      const int j = t - t0;
      const bool rst = tk.reset(a.reset, t);
      const S* vj = sc.vecs.data() + static_cast<std::size_t>(j) * 4 * dv;
      const S* gy = a.gy + tk.vec(t, dv);
      for (int i = 0; i < dv; ++i) gyt[i] = gy[i] + carry[i];
      if (rst) {
        zero_n(gs, dv);
        softmax(gs, s, dv);                 // softmax(0): uniform
      } else {
        softmax(t > 0 ? a.y + tk.vec(t - 1, dv) : a.y0 + tk.mat(dv), s, dv);
      }
      const S beta = a.beta[tk.scal(t)], beta_r = a.beta_r[tk.scal(t)];
      a.gbeta[tk.scal(t)] = delta_step_backward<S, true>(
          G, sc.Wbuf.data() + j * matW, a.k + tk.vec(t, dk), a.q + tk.vec(t, dk), vj, vj + dv,
          beta, gyt, dk, dv, a.gq + tk.vec(t, dk), a.gk + tk.vec(t, dk), a.gv + tk.vec(t, dv),
          gq_acc, gk_acc);
      // R part: the "query" of R is s, its gradient gs = R_t^T gy
      a.gbeta_r[tk.scal(t)] = delta_step_backward<S, true>(
          GR, sc.Rbuf.data() + j * matR, a.kr + tk.vec(t, dv), s, vj + 2 * dv, vj + 3 * dv,
          beta_r, gyt, dv, dv, gs, a.gkr + tk.vec(t, dv), a.gvr + tk.vec(t, dv), gs_acc,
          gkr_acc);
      if (rst) {
        zero_n(carry, dv);
        zero_n(G, matW);
        zero_n(GR, matR);
      } else {
        softmax_backward(s, gs, carry, dv);
      }
    }
  }
  copy_n(G, matW, a.gW0 + tk.mat(matW));
  copy_n(GR, matR, a.gR0 + tk.mat(matR));
  copy_n(carry, dv, a.gy0 + tk.mat(dv));
}

// ------------------------------------------------------------------------------------- rdn

// Slow recurrent part of one rdn step (RFWP Eq. 15-18) from h = tanh(y_{t-1}):
// q = softmax(xq + Rq h), k = softmax(xk + Rk h), v = xv + Rv h, β = σ(xb + rb . h).
template <typename S>
inline S rdn_inputs(const S* xq, const S* xk, const S* xv, S xb, const S* Rq, const S* Rk,
                    const S* Rv, const S* rb, const S* h, int d, S* aq, S* ak, S* q, S* k,
                    S* v) {
  for (int i = 0; i < d; ++i) {
    const std::size_t o = static_cast<std::size_t>(i) * d;
    aq[i] = xq[i] + dot(Rq + o, h, d);    // RFWP Eq. 17
    ak[i] = xk[i] + dot(Rk + o, h, d);    // RFWP Eq. 15
    v[i] = xv[i] + dot(Rv + o, h, d);     // RFWP Eq. 16
  }
  softmax(aq, q, d);
  softmax(ak, k, d);
  return sigmoid(xb + dot(rb, h, d));     // RFWP Eq. 18
}

template <typename S>
void rdn_forward_task(const RdnFwdArgs<S>& a, int bh, std::vector<S>& buf) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int d = n.dv, h_ = bh % n.H;
  const std::size_t mat = static_cast<std::size_t>(d) * d;
  buf.resize(mat + 4 * static_cast<std::size_t>(d));
  S* W = buf.data();
  S* yprev = W + mat;
  S* h = yprev + d;
  S* aq = h + d;
  S* ak = aq + d;
  const S *Rq = a.Rq + h_ * mat, *Rk = a.Rk + h_ * mat, *Rv = a.Rv + h_ * mat,
          *rb = a.rb + static_cast<std::size_t>(h_) * d;
  copy_n(a.W0 + tk.mat(mat), mat, W);
  copy_n(a.y0 + tk.mat(d), d, yprev);
  for (int t = 0; t < n.T; ++t) {
    if (t % n.chunk == 0) copy_n(W, mat, a.ckpt + tk.ckpt(t / n.chunk, mat));
    if (tk.reset(a.reset, t)) {
      zero_n(W, mat);
      zero_n(yprev, d);
    }
    for (int j = 0; j < d; ++j) h[j] = std::tanh(yprev[j]);
    S* q = a.q + tk.vec(t, d);
    S* k = a.k + tk.vec(t, d);
    S* v = a.v + tk.vec(t, d);
    const S beta = rdn_inputs(a.xq + tk.vec(t, d), a.xk + tk.vec(t, d), a.xv + tk.vec(t, d),
                              a.xb[tk.scal(t)], Rq, Rk, Rv, rb, h, d, aq, ak, q, k, v);
    a.beta[tk.scal(t)] = beta;
    S* y = a.y + tk.vec(t, d);
    delta_step_forward<S, true>(W, k, q, v, beta, d, d, y, nullptr, nullptr);
    copy_n(y, d, yprev);
  }
  copy_n(W, mat, a.W + tk.mat(mat));
}

template <typename S>
struct RdnScratch {
  std::vector<S> G, Wrun, Wbuf, ubuf, dbuf, acc;
};

template <typename S>
void rdn_backward_task(const RdnBwdArgs<S>& a, int bh, RdnScratch<S>& sc) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int d = n.dv, C = n.chunk, h_ = bh % n.H;
  const std::size_t mat = static_cast<std::size_t>(d) * d;
  sc.G.resize(mat);
  sc.Wrun.resize(mat);
  sc.Wbuf.resize(mat * C);
  sc.ubuf.resize(static_cast<std::size_t>(C) * d);
  sc.dbuf.resize(static_cast<std::size_t>(C) * d);
  sc.acc.resize(9 * static_cast<std::size_t>(d));
  S* G = sc.G.data();
  S* gq_acc = sc.acc.data();
  S* gk_acc = gq_acc + d;
  S* gq = gk_acc + d;
  S* gk = gq + d;
  S* gv = gk + d;
  S* h = gv + d;
  S* gh = h + d;
  S* carry = gh + d;
  S* gyt = carry + d;
  const S *Rq = a.Rq + h_ * mat, *Rk = a.Rk + h_ * mat, *Rv = a.Rv + h_ * mat,
          *rb = a.rb + static_cast<std::size_t>(h_) * d;
  S *gRq = a.gRq_part + tk.mat(mat), *gRk = a.gRk_part + tk.mat(mat),
    *gRv = a.gRv_part + tk.mat(mat), *grb = a.grb_part + tk.mat(d);
  zero_n(gRq, mat);
  zero_n(gRk, mat);
  zero_n(gRv, mat);
  zero_n(grb, d);
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(mat), mat, G); else zero_n(G, mat);
  zero_n(carry, d);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = std::min(n.T, t0 + C);
    delta_recompute_chunk<S, true>(a.ckpt + tk.ckpt(c, mat), a.k, a.v, a.beta, a.reset, tk, n,
                                   t0, t1, sc.Wrun.data(), sc.Wbuf.data(), sc.ubuf.data(),
                                   sc.dbuf.data());
    for (int t = t1 - 1; t >= t0; --t) {
      const int j = t - t0;
      const bool rst = tk.reset(a.reset, t);
      const S* q = a.q + tk.vec(t, d);
      const S* k = a.k + tk.vec(t, d);
      const S beta = a.beta[tk.scal(t)];
      const S* gy = a.gy + tk.vec(t, d);
      for (int i = 0; i < d; ++i) gyt[i] = gy[i] + carry[i];
      if (rst) {
        zero_n(h, d);
      } else {
        const S* yp = t > 0 ? a.y + tk.vec(t - 1, d) : a.y0 + tk.mat(d);
        for (int i = 0; i < d; ++i) h[i] = std::tanh(yp[i]);
      }
      S* gxv = a.gxv + tk.vec(t, d);
      const S gbeta = delta_step_backward<S, true>(
          G, sc.Wbuf.data() + j * mat, k, q, sc.ubuf.data() + static_cast<std::size_t>(j) * d,
          sc.dbuf.data() + static_cast<std::size_t>(j) * d, beta, gyt, d, d, gq, gk, gxv, gq_acc,
          gk_acc);
      // back through the softmax feature maps and the sigmoid
      S* gaq = a.gxq + tk.vec(t, d);
      S* gak = a.gxk + tk.vec(t, d);
      softmax_backward(q, gq, gaq, d);
      softmax_backward(k, gk, gak, d);
      const S gab = gbeta * beta * (S(1) - beta);
      a.gxb[tk.scal(t)] = gab;
      // into h = tanh(y_{t-1}) and the recurrent slow weights (RFWP Eq. 15-18)
      for (int i = 0; i < d; ++i) gh[i] = gab * rb[i];
      axpy(gab, h, grb, d);
      for (int i = 0; i < d; ++i) {
        const std::size_t o = static_cast<std::size_t>(i) * d;
        const S aq = gaq[i], ak = gak[i], av = gxv[i];
#pragma omp simd
        for (int jj = 0; jj < d; ++jj) {
          gh[jj] += aq * Rq[o + jj] + ak * Rk[o + jj] + av * Rv[o + jj];
          gRq[o + jj] += aq * h[jj];
          gRk[o + jj] += ak * h[jj];
          gRv[o + jj] += av * h[jj];
        }
      }
      if (rst) {
        zero_n(carry, d);
        zero_n(G, mat);
      } else {
        for (int i = 0; i < d; ++i) carry[i] = gh[i] * (S(1) - h[i] * h[i]);
      }
    }
  }
  copy_n(G, mat, a.gW0 + tk.mat(mat));
  copy_n(carry, d, a.gy0 + tk.mat(d));
}

// Sum the per-(b, h) partials over b in a fixed order: element e of head h of a [H, len]
// result. Deterministic for any parallel split over (h, e).
template <typename S>
inline void sum_over_batch(const S* part, S* out, int B, int H, std::size_t len, int h,
                           std::size_t e) {
  S s = 0;
  for (int b = 0; b < B; ++b) s += part[(static_cast<std::size_t>(b) * H + h) * len + e];
  out[static_cast<std::size_t>(h) * len + e] = s;
}

}  // namespace cpu
}  // namespace rfwp
