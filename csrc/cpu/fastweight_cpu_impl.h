// CPU implementation of the fused fast-weight recurrences: one (batch, head) pair per task.
//
// Plain C++ (no torch): fastweight_cpu.cpp runs the tasks in parallel with at::parallel_for.
// Every task owns its (b, h) slice of every output, so results do not depend on how tasks are
// scheduled (bitwise deterministic for any thread count).
//
// Layouts. The FORWARD keeps the fast weights column-major, WT [dk][dv] (column j of W is
// contiguous): every read W c = Σ_j c_j W[:, j] and every write W += u ⊗ k (column j += k_j u)
// is then a sequence of vector multiply-adds without horizontal reductions, and the write of
// step t-1 is applied in the same pass as the reads of step t. The BACKWARD uses row-major
// matrices [dv][dk]: one pass over the rows of G = dL/dW_t and of the recomputed W_{t-1} per
// step, with a single dot product per row. Checkpoints are stored row-major.
//
// Head sizes 16, 32 and 64 (dk == dv) are compiled with the size as a constant and rows held
// in vector registers (simd_row.h, template parameter D > 0); any other size runs the same
// algorithm with plain loops (D == 0). Both paths are tested against the reference.
//
// Backward memory: the forward stores the state every `chunk` steps; the backward recomputes
// the states inside one chunk at a time (chunk x dv x dk scratch per task) and walks it
// backwards. The recomputation repeats the forward's writes exactly.
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
#include "simd_row.h"
#include "vec_math.h"

namespace rfwp {
namespace cpu {

using std::size_t;

// ------------------------------------------------------------------------ scalar helpers

template <typename S>
RFWP_INLINE S dot(const S* __restrict__ a, const S* __restrict__ b, int n) {
  S s = 0;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

// y += a x
template <typename S>
RFWP_INLINE void axpy(S a, const S* __restrict__ x, S* __restrict__ y, int n) {
#pragma omp simd
  for (int j = 0; j < n; ++j) y[j] += a * x[j];
}

template <typename S>
inline void copy_n(const S* src, size_t n, S* dst) {
  std::copy(src, src + n, dst);
}
template <typename S>
inline void zero_n(S* dst, size_t n) {
  std::fill(dst, dst + n, S(0));
}

// g_in = s * (g_out - s . g_out): backward of s = softmax(x).
template <typename S>
inline void softmax_backward(const S* s, const S* g_out, S* g_in, int n) {
  const S sg = dot(s, g_out, n);
  for (int j = 0; j < n; ++j) g_in[j] = s[j] * (g_out[j] - sg);
}

// Offsets of one (b, h) task.
struct Task {
  int bh, b, h, BH, B;
  Task(const Dims& n, int bh_) : bh(bh_), b(bh_ / n.H), h(bh_ % n.H), BH(n.B * n.H), B(n.B) {}
  size_t vec(int t, int len) const { return (static_cast<size_t>(t) * BH + bh) * len; }
  size_t scal(int t) const { return static_cast<size_t>(t) * BH + bh; }
  size_t mat(size_t size) const { return static_cast<size_t>(bh) * size; }
  size_t ckpt(int c, size_t size) const { return (static_cast<size_t>(c) * BH + bh) * size; }
  bool reset(const uint8_t* r, int t) const {
    return r != nullptr && r[static_cast<size_t>(t) * B + b] != 0;
  }
};

// ------------------------------------------------------- forward: column-major fast weights

// r1 = W c1 and (TWO) r2 = W c2 in one pass over the columns of WT [dk][dv], first applying
// the pending write W += up ⊗ kp when PENDING (RFWP Eq. 6 / 8 of the previous step).
template <typename S, int D, bool PENDING, bool TWO>
RFWP_INLINE void read_columns(S* __restrict__ WT, const S* kp, const S* up, const S* c1,
                              const S* c2, int dk, int dv, S* r1, S* r2) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    R u = R::zero();
    if constexpr (PENDING) u = R::load(up);
    R a = R::zero(), b = R::zero();
    for (int j = 0; j < D; ++j) {
      R w = R::load(WT + j * D);
      if constexpr (PENDING) {
        w.fma(kp[j], u);
        w.store(WT + j * D);
      }
      a.fma(c1[j], w);
      if constexpr (TWO) b.fma(c2[j], w);
    }
    a.store(r1);
    if constexpr (TWO) b.store(r2);
  } else {
    zero_n(r1, dv);
    if (TWO) zero_n(r2, dv);
    for (int j = 0; j < dk; ++j) {
      S* w = WT + static_cast<size_t>(j) * dv;
      if (PENDING) axpy(kp[j], up, w, dv);
      axpy(c1[j], w, r1, dv);
      if (TWO) axpy(c2[j], w, r2, dv);
    }
  }
}

// A fast weight matrix in column layout whose latest write (u ⊗ k) is applied lazily, fused
// into the next pass over the matrix.
template <typename S, int D>
struct ColumnState {
  S* WT;          // [dk][dv]
  S* u;           // [dv]: the pending write's value vector (the caller fills it)
  const S* k = nullptr;
  bool pending = false;
  int dk, dv;

  ColumnState(S* WT_, S* u_, int dk_, int dv_) : WT(WT_), u(u_), dk(dk_), dv(dv_) {}
  void flush() {
    if (!pending) return;
    for (int j = 0; j < dk; ++j) axpy(k[j], u, WT + static_cast<size_t>(j) * dv, dv);
    pending = false;
  }
  void load_rows(const S* W) { transpose(W, dv, dk, WT); pending = false; }
  void store_rows(S* W) {
    flush();
    transpose(WT, dk, dv, W);
  }
  void zero() {
    zero_n(WT, static_cast<size_t>(dk) * dv);
    pending = false;
  }
  // r1 = W c1 (and r2 = W c2) with the pending write applied first.
  template <bool TWO>
  void read(const S* c1, const S* c2, S* r1, S* r2) {
    if (pending)
      read_columns<S, D, true, TWO>(WT, k, u, c1, c2, dk, dv, r1, r2);
    else
      read_columns<S, D, false, TWO>(WT, k, u, c1, c2, dk, dv, r1, r2);
    pending = false;
  }
  // Schedule W += u ⊗ k_ (u already written by the caller; k_ must stay valid until the next read).
  void write_later(const S* k_) {
    k = k_;
    pending = true;
  }
};

// ----------------------------------------------------------- backward: row-major matrices

// One step of the recomputation on W' = Wp (the state after the reset, before the write of
// step t): v̄ = W' k, u = β (v - v̄) (delta) or v (lt); when `next` is not null it receives
// W' + u ⊗ k (the next step's W' unless that step resets). One read and one write per element.
template <typename S, bool DELTA, int D>
RFWP_INLINE void recompute_step(const S* __restrict__ Wp, S* __restrict__ next, const S* k,
                                const S* v, S beta, int dk, int dv, S* u, S* diff) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    const R kr = R::load(k);
    for (int i = 0; i < D; ++i) {
      R w = R::load(Wp + i * D);
      const S vb = DELTA ? w.dot(kr) : S(0);        // RFWP Eq. 10
      diff[i] = v[i] - vb;
      u[i] = DELTA ? beta * diff[i] : v[i];          // RFWP Eq. 8 / Eq. 6
      if (next != nullptr) w.fma(u[i], kr).store(next + i * D);
    }
  } else {
    for (int i = 0; i < dv; ++i) {
      const S* Wi = Wp + static_cast<size_t>(i) * dk;
      const S vb = DELTA ? dot(Wi, k, dk) : S(0);
      diff[i] = v[i] - vb;
      u[i] = DELTA ? beta * diff[i] : v[i];
      if (next != nullptr) {
        S* Ni = next + static_cast<size_t>(i) * dk;
        for (int j = 0; j < dk; ++j) Ni[j] = Wi[j] + u[i] * k[j];
      }
    }
  }
}

// Backward of one step, given G = dL/dW_t (updated in place to dL/dW'_t), W' = Wp, the
// step's u and v - v̄, and gy = dL/dy_t for the read y = W_t q:
//   G += gy ⊗ q;  gu = G k;  gv = β gu (lt: gu);  gβ = gu . (v - v̄);  gv̄ = -β gu
//   gk = G^T u + W'^T gv̄;   gq = W_t^T gy = W'^T gy + k (u . gy);   G += gv̄ ⊗ k.
// One pass over the rows. Returns gβ. `acc` is 2*dk scratch (plain-loop path only).
template <typename S, bool DELTA, int D>
RFWP_INLINE S backward_step(S* __restrict__ G, const S* __restrict__ Wp, const S* k, const S* q,
                            const S* u, const S* diff, S beta, const S* gy, int dk, int dv,
                            S* gq_out, S* gk_out, S* gv_out, S* acc) {
  S ugy = 0, gbeta = 0;
  if constexpr (D > 0) {
    using R = Row<S, D>;
    const R kr = R::load(k), qr = R::load(q);
    R gq = R::zero(), gk = R::zero(), gk2 = R::zero();   // two gk chains: more parallelism
    for (int i = 0; i < D; ++i) {
      const S g = gy[i];
      R x = R::load(G + i * D);
      x.fma(g, qr);                                      // from y = W_t q
      const S gu = x.dot(kr);
      const S ui = u[i];
      gv_out[i] = DELTA ? beta * gu : gu;
      ugy += ui * g;
      const R w = R::load(Wp + i * D);
      gk.fma(ui, x);
      gq.fma(g, w);
      if constexpr (DELTA) {
        gbeta += gu * diff[i];
        const S gvb = -beta * gu;
        gk2.fma(gvb, w);
        x.fma(gvb, kr);
      }
      x.store(G + i * D);
    }
    gq.fma(ugy, kr);
    gq.store(gq_out);
    (gk + gk2).store(gk_out);
  } else {
    S* gq_acc = acc;
    S* gk_acc = acc + dk;
    zero_n(gq_acc, dk);
    zero_n(gk_acc, dk);
    for (int i = 0; i < dv; ++i) {
      S* __restrict__ Gi = G + static_cast<size_t>(i) * dk;
      const S* __restrict__ Wpi = Wp + static_cast<size_t>(i) * dk;
      const S g = gy[i];
      S gu = 0;
#pragma omp simd reduction(+ : gu)
      for (int j = 0; j < dk; ++j) {
        Gi[j] += g * q[j];
        gu += Gi[j] * k[j];
      }
      const S ui = u[i];
      gv_out[i] = DELTA ? beta * gu : gu;
      ugy += ui * g;
      const S gvb = DELTA ? -beta * gu : S(0);
      if (DELTA) gbeta += gu * diff[i];
#pragma omp simd
      for (int j = 0; j < dk; ++j) {
        gk_acc[j] += ui * Gi[j] + gvb * Wpi[j];
        gq_acc[j] += g * Wpi[j];
        Gi[j] += gvb * k[j];
      }
    }
    for (int j = 0; j < dk; ++j) {
      gq_out[j] = gq_acc[j] + k[j] * ugy;
      gk_out[j] = gk_acc[j];
    }
  }
  return gbeta;
}

// Per-task scratch of the delta-rule backward over one matrix [dv][dk].
template <typename S>
struct MatrixScratch {
  std::vector<S> G, Wbuf, ubuf, dbuf;
  void resize(size_t mat, int chunk, int dv) {
    G.resize(mat);
    Wbuf.resize(mat * chunk);
    ubuf.resize(static_cast<size_t>(chunk) * dv);
    dbuf.resize(static_cast<size_t>(chunk) * dv);
  }
  S* Wp(int j, size_t mat) { return Wbuf.data() + j * mat; }
  S* u(int j, int dv) { return ubuf.data() + static_cast<size_t>(j) * dv; }
  S* diff(int j, int dv) { return dbuf.data() + static_cast<size_t>(j) * dv; }
};

// Recompute W'_t, u_t, v_t - v̄_t for t in [t0, t1) from the checkpoint at t0.
template <typename S, bool DELTA, int D>
inline void recompute_chunk(const S* ckpt, const S* k, const S* v, const S* beta,
                            const uint8_t* reset, const Task& tk, int dk, int dv, int t0, int t1,
                            MatrixScratch<S>& m) {
  const size_t mat = static_cast<size_t>(dv) * dk;
  copy_n(ckpt, mat, m.Wp(0, mat));
  for (int t = t0; t < t1; ++t) {
    const int j = t - t0;
    if (tk.reset(reset, t)) zero_n(m.Wp(j, mat), mat);
    recompute_step<S, DELTA, D>(m.Wp(j, mat), t + 1 < t1 ? m.Wp(j + 1, mat) : nullptr,
                                k + tk.vec(t, dk), v + tk.vec(t, dv),
                                DELTA ? beta[tk.scal(t)] : S(1), dk, dv, m.u(j, dv),
                                m.diff(j, dv));
  }
}

// ------------------------------------------------------------------------------ lt / delta

template <typename S>
struct ForwardScratch {
  std::vector<S> buf;
  S* take(size_t n, size_t& off) {
    S* p = buf.data() + off;
    off += n;
    return p;
  }
};

template <typename S, bool DELTA, int D>
void delta_forward_task(const DeltaFwdArgs<S>& a, int bh, ForwardScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int dk = D > 0 ? D : n.dk, dv = D > 0 ? D : n.dv;
  const size_t mat = static_cast<size_t>(dv) * dk;
  s.buf.resize(mat + 3 * static_cast<size_t>(dv));
  size_t off = 0;
  S* WT = s.take(mat, off);
  S* u = s.take(dv, off);
  S* vb = s.take(dv, off);
  S* yq = s.take(dv, off);
  ColumnState<S, D> W(WT, u, dk, dv);
  W.load_rows(a.W0 + tk.mat(mat));
  for (int t = 0; t < n.T; ++t) {
    if (n.chunk > 0 && t % n.chunk == 0) W.store_rows(a.ckpt + tk.ckpt(t / n.chunk, mat));
    if (tk.reset(a.reset, t)) W.zero();
    const S* k = a.k + tk.vec(t, dk);
    const S* q = a.q + tk.vec(t, dk);
    const S* v = a.v + tk.vec(t, dv);
    S* y = a.y + tk.vec(t, dv);
    const S kq = dot(k, q, dk);
    if (DELTA) {
      W.template read<true>(k, q, vb, yq);           // RFWP Eq. 10: v̄ = W_{t-1} k; and W_{t-1} q
      const S beta = a.beta[tk.scal(t)];
      for (int i = 0; i < dv; ++i) u[i] = beta * (v[i] - vb[i]);   // RFWP Eq. 8
    } else {
      W.template read<false>(q, nullptr, yq, nullptr);
      for (int i = 0; i < dv; ++i) u[i] = v[i];                     // RFWP Eq. 6
    }
    for (int i = 0; i < dv; ++i) y[i] = yq[i] + u[i] * kq;  // RFWP Eq. 7: (W_{t-1} + u ⊗ k) q
    W.write_later(k);
  }
  W.store_rows(a.W + tk.mat(mat));
}

template <typename S>
struct DeltaScratch {
  MatrixScratch<S> m;
  std::vector<S> acc;
};

template <typename S, bool DELTA, int D>
void delta_backward_task(const DeltaBwdArgs<S>& a, int bh, DeltaScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int dk = D > 0 ? D : n.dk, dv = D > 0 ? D : n.dv;
  const size_t mat = static_cast<size_t>(dv) * dk;
  s.m.resize(mat, n.chunk, dv);
  s.acc.resize(2 * static_cast<size_t>(dk));
  S* G = s.m.G.data();
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(mat), mat, G); else zero_n(G, mat);
  for (int c = num_chunks(n.T, n.chunk) - 1; c >= 0; --c) {
    const int t0 = c * n.chunk, t1 = std::min(n.T, t0 + n.chunk);
    recompute_chunk<S, DELTA, D>(a.ckpt + tk.ckpt(c, mat), a.k, a.v, a.beta, a.reset, tk, dk, dv,
                                 t0, t1, s.m);
    for (int t = t1 - 1; t >= t0; --t) {
      const int j = t - t0;
      const S gb = backward_step<S, DELTA, D>(
          G, s.m.Wp(j, mat), a.k + tk.vec(t, dk), a.q + tk.vec(t, dk), s.m.u(j, dv),
          s.m.diff(j, dv), DELTA ? a.beta[tk.scal(t)] : S(1), a.gy + tk.vec(t, dv), dk, dv,
          a.gq + tk.vec(t, dk), a.gk + tk.vec(t, dk), a.gv + tk.vec(t, dv), s.acc.data());
      if (DELTA) a.gbeta[tk.scal(t)] = gb;
      if (tk.reset(a.reset, t)) zero_n(G, mat);   // no gradient crosses a reset
    }
  }
  copy_n(G, mat, a.gW0 + tk.mat(mat));
}

// ------------------------------------------------------------------------------- delta_rnn

template <typename S, int D>
void delta_rnn_forward_task(const DeltaRnnFwdArgs<S>& a, int bh, ForwardScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int dk = D > 0 ? D : n.dk, dv = D > 0 ? D : n.dv;
  const size_t matW = static_cast<size_t>(dv) * dk, matR = static_cast<size_t>(dv) * dv;
  s.buf.resize(matW + matR + 7 * static_cast<size_t>(dv));
  size_t off = 0;
  S* WT = s.take(matW, off);
  S* RT = s.take(matR, off);
  S* u = s.take(dv, off);
  S* ur = s.take(dv, off);
  S* vb = s.take(dv, off);
  S* wq = s.take(dv, off);
  S* vrb = s.take(dv, off);
  S* rs = s.take(dv, off);
  S* yprev = s.take(dv, off);
  ColumnState<S, D> W(WT, u, dk, dv), R(RT, ur, dv, dv);
  W.load_rows(a.W0 + tk.mat(matW));
  R.load_rows(a.R0 + tk.mat(matR));
  copy_n(a.y0 + tk.mat(dv), dv, yprev);
  for (int t = 0; t < n.T; ++t) {
    if (n.chunk > 0 && t % n.chunk == 0) {
      W.store_rows(a.ckptW + tk.ckpt(t / n.chunk, matW));
      R.store_rows(a.ckptR + tk.ckpt(t / n.chunk, matR));
    }
    if (tk.reset(a.reset, t)) {
      W.zero();
      R.zero();
      zero_n(yprev, dv);
    }
    S* sq = a.s + tk.vec(t, dv);
    vsoftmax(yprev, sq, dv);                 // recurrent query f(y_{t-1}) (RFWP Eq. 12), kept
    const S* k = a.k + tk.vec(t, dk);
    const S* q = a.q + tk.vec(t, dk);
    const S* v = a.v + tk.vec(t, dv);
    const S* kr = a.kr + tk.vec(t, dv);
    const S* vr = a.vr + tk.vec(t, dv);
    const S beta = a.beta[tk.scal(t)], beta_r = a.beta_r[tk.scal(t)];
    W.template read<true>(k, q, vb, wq);     // RFWP Eq. 10 for W
    R.template read<true>(kr, sq, vrb, rs);  // RFWP Eq. 10 for R
    const S kq = dot(k, q, dk), krs = dot(kr, sq, dv);
    S* y = a.y + tk.vec(t, dv);
    for (int i = 0; i < dv; ++i) {
      u[i] = beta * (v[i] - vb[i]);          // RFWP Eq. 8
      ur[i] = beta_r * (vr[i] - vrb[i]);
      y[i] = (wq[i] + u[i] * kq) + (rs[i] + ur[i] * krs);   // RFWP Eq. 12: W_t q + R_t f(y_{t-1})
    }
    W.write_later(k);
    R.write_later(kr);
    copy_n(y, dv, yprev);
  }
  W.store_rows(a.W + tk.mat(matW));
  R.store_rows(a.R + tk.mat(matR));
}

template <typename S>
struct DeltaRnnScratch {
  MatrixScratch<S> w, r;
  std::vector<S> vecs;
};

template <typename S, int D>
void delta_rnn_backward_task(const DeltaRnnBwdArgs<S>& a, int bh, DeltaRnnScratch<S>& sc) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int dk = D > 0 ? D : n.dk, dv = D > 0 ? D : n.dv, C = n.chunk;
  const size_t matW = static_cast<size_t>(dv) * dk, matR = static_cast<size_t>(dv) * dv;
  sc.w.resize(matW, C, dv);
  sc.r.resize(matR, C, dv);
  sc.vecs.resize(2 * static_cast<size_t>(dk) + 5 * static_cast<size_t>(dv));
  S* acc = sc.vecs.data();          // 2 dk (plain-loop accumulators of W)
  S* gs = acc + 2 * dk;             // dL/ds
  S* carry = gs + dv;               // dL/dy_{t-1} through the recurrent query
  S* gyt = carry + dv;
  S* accr = gyt + dv;               // 2 dv
  S* G = sc.w.G.data();
  S* GR = sc.r.G.data();
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(matW), matW, G); else zero_n(G, matW);
  if (a.gR != nullptr) copy_n(a.gR + tk.mat(matR), matR, GR); else zero_n(GR, matR);
  zero_n(carry, dv);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = std::min(n.T, t0 + C);
    recompute_chunk<S, true, D>(a.ckptW + tk.ckpt(c, matW), a.k, a.v, a.beta, a.reset, tk, dk, dv,
                                t0, t1, sc.w);
    recompute_chunk<S, true, D>(a.ckptR + tk.ckpt(c, matR), a.kr, a.vr, a.beta_r, a.reset, tk, dv,
                                dv, t0, t1, sc.r);
    for (int t = t1 - 1; t >= t0; --t) {
      const int j = t - t0;
      const bool rst = tk.reset(a.reset, t);
      const S* gy = a.gy + tk.vec(t, dv);
      for (int i = 0; i < dv; ++i) gyt[i] = gy[i] + carry[i];
      const S* s = a.s + tk.vec(t, dv);   // softmax(y_{t-1}) from the forward
      a.gbeta[tk.scal(t)] = backward_step<S, true, D>(
          G, sc.w.Wp(j, matW), a.k + tk.vec(t, dk), a.q + tk.vec(t, dk), sc.w.u(j, dv),
          sc.w.diff(j, dv), a.beta[tk.scal(t)], gyt, dk, dv, a.gq + tk.vec(t, dk),
          a.gk + tk.vec(t, dk), a.gv + tk.vec(t, dv), acc);
      // R: its "query" is s, so its query gradient is gs = R_t^T gy
      a.gbeta_r[tk.scal(t)] = backward_step<S, true, D>(
          GR, sc.r.Wp(j, matR), a.kr + tk.vec(t, dv), s, sc.r.u(j, dv), sc.r.diff(j, dv),
          a.beta_r[tk.scal(t)], gyt, dv, dv, gs, a.gkr + tk.vec(t, dv), a.gvr + tk.vec(t, dv),
          accr);
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

// a = x + M h for the three recurrent matrices, from their transposes MT [d][d]
// (RFWP Eq. 15-17 before the feature maps).
template <typename S, int D>
RFWP_INLINE void rdn_slow_inputs(const S* RqT, const S* RkT, const S* RvT, const S* h,
                                 const S* xq, const S* xk, const S* xv, int d, S* aq, S* ak,
                                 S* av) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    R a = R::load(xq), b = R::load(xk), c = R::load(xv);
    for (int j = 0; j < D; ++j) {
      a.fma(h[j], R::load(RqT + j * D));
      b.fma(h[j], R::load(RkT + j * D));
      c.fma(h[j], R::load(RvT + j * D));
    }
    a.store(aq);
    b.store(ak);
    c.store(av);
  } else {
    copy_n(xq, d, aq);
    copy_n(xk, d, ak);
    copy_n(xv, d, av);
    for (int j = 0; j < d; ++j) {
      const size_t o = static_cast<size_t>(j) * d;
      axpy(h[j], RqT + o, aq, d);
      axpy(h[j], RkT + o, ak, d);
      axpy(h[j], RvT + o, av, d);
    }
  }
}

// gh = Rq^T gaq + Rk^T gak + Rv^T gv and the slow-weight gradients gRq += gaq ⊗ h, ...
template <typename S, int D>
RFWP_INLINE void rdn_recurrent_backward(const S* Rq, const S* Rk, const S* Rv, const S* gaq,
                                        const S* gak, const S* gv, const S* h, int d, S* gh,
                                        S* gRq, S* gRk, S* gRv) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    const R hr = R::load(h);
    R a = R::zero(), b = R::zero(), c = R::zero();
    for (int i = 0; i < D; ++i) {
      const int o = i * D;
      a.fma(gaq[i], R::load(Rq + o));
      b.fma(gak[i], R::load(Rk + o));
      c.fma(gv[i], R::load(Rv + o));
      R::load(gRq + o).fma(gaq[i], hr).store(gRq + o);
      R::load(gRk + o).fma(gak[i], hr).store(gRk + o);
      R::load(gRv + o).fma(gv[i], hr).store(gRv + o);
    }
    (a + b + c).store(gh);
  } else {
    zero_n(gh, d);
    for (int i = 0; i < d; ++i) {
      const size_t o = static_cast<size_t>(i) * d;
      const S x = gaq[i], y = gak[i], z = gv[i];
#pragma omp simd
      for (int j = 0; j < d; ++j) {
        gh[j] += x * Rq[o + j] + y * Rk[o + j] + z * Rv[o + j];
        gRq[o + j] += x * h[j];
        gRk[o + j] += y * h[j];
        gRv[o + j] += z * h[j];
      }
    }
  }
}

// RT: the transposed recurrent matrices of every head, [H][3][d][d] (q, k, v), computed once
// per call by the driver.
template <typename S, int D>
void rdn_forward_task(const RdnFwdArgs<S>& a, const S* RT, int bh, ForwardScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int d = D > 0 ? D : n.dv;
  const size_t mat = static_cast<size_t>(d) * d;
  s.buf.resize(mat + 6 * static_cast<size_t>(d));
  size_t off = 0;
  S* WT = s.take(mat, off);
  S* u = s.take(d, off);
  S* vb = s.take(d, off);
  S* yq = s.take(d, off);
  S* yprev = s.take(d, off);
  S* aq = s.take(d, off);
  S* ak = s.take(d, off);
  const S* RqT = RT + static_cast<size_t>(tk.h) * 3 * mat;
  const S* RkT = RqT + mat;
  const S* RvT = RkT + mat;
  const S* rb = a.rb + static_cast<size_t>(tk.h) * d;
  ColumnState<S, D> W(WT, u, d, d);
  W.load_rows(a.W0 + tk.mat(mat));
  copy_n(a.y0 + tk.mat(d), d, yprev);
  for (int t = 0; t < n.T; ++t) {
    if (n.chunk > 0 && t % n.chunk == 0) W.store_rows(a.ckpt + tk.ckpt(t / n.chunk, mat));
    if (tk.reset(a.reset, t)) {
      W.zero();
      zero_n(yprev, d);
    }
    S* h = a.h + tk.vec(t, d);
    vtanh_n(yprev, h, d);                    // h = tanh(y_{t-1}), kept for the backward
    S* q = a.q + tk.vec(t, d);
    S* k = a.k + tk.vec(t, d);
    S* v = a.v + tk.vec(t, d);
    rdn_slow_inputs<S, D>(RqT, RkT, RvT, h, a.xq + tk.vec(t, d), a.xk + tk.vec(t, d),
                          a.xv + tk.vec(t, d), d, aq, ak, v);   // RFWP Eq. 15-17
    vsoftmax(aq, q, d);
    vsoftmax(ak, k, d);
    const S beta = vsigmoid(a.xb[tk.scal(t)] + dot(rb, h, d));   // RFWP Eq. 18
    a.beta[tk.scal(t)] = beta;
    W.template read<true>(k, q, vb, yq);
    const S kq = dot(k, q, d);
    S* y = a.y + tk.vec(t, d);
    for (int i = 0; i < d; ++i) {
      u[i] = beta * (v[i] - vb[i]);          // RFWP Eq. 8
      y[i] = yq[i] + u[i] * kq;              // RFWP Eq. 7
    }
    W.write_later(k);
    copy_n(y, d, yprev);
  }
  W.store_rows(a.W + tk.mat(mat));
}

template <typename S>
struct RdnScratch {
  MatrixScratch<S> m;
  std::vector<S> vecs;
};

template <typename S, int D>
void rdn_backward_task(const RdnBwdArgs<S>& a, int bh, RdnScratch<S>& sc) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int d = D > 0 ? D : n.dv, C = n.chunk;
  const size_t mat = static_cast<size_t>(d) * d;
  sc.m.resize(mat, C, d);
  sc.vecs.resize(7 * static_cast<size_t>(d));
  S* acc = sc.vecs.data();     // 2 d
  S* gq = acc + 2 * d;
  S* gk = gq + d;
  S* gh = gk + d;
  S* carry = gh + d;
  S* gyt = carry + d;
  S* G = sc.m.G.data();
  const size_t ho = static_cast<size_t>(tk.h) * mat;
  const S *Rq = a.Rq + ho, *Rk = a.Rk + ho, *Rv = a.Rv + ho;
  const S* rb = a.rb + static_cast<size_t>(tk.h) * d;
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
    recompute_chunk<S, true, D>(a.ckpt + tk.ckpt(c, mat), a.k, a.v, a.beta, a.reset, tk, d, d, t0,
                                t1, sc.m);
    for (int t = t1 - 1; t >= t0; --t) {
      const int j = t - t0;
      const bool rst = tk.reset(a.reset, t);
      const S* q = a.q + tk.vec(t, d);
      const S* k = a.k + tk.vec(t, d);
      const S beta = a.beta[tk.scal(t)];
      const S* gy = a.gy + tk.vec(t, d);
      for (int i = 0; i < d; ++i) gyt[i] = gy[i] + carry[i];
      S* gxv = a.gxv + tk.vec(t, d);
      const S gbeta = backward_step<S, true, D>(G, sc.m.Wp(j, mat), k, q, sc.m.u(j, d),
                                                sc.m.diff(j, d), beta, gyt, d, d, gq, gk, gxv,
                                                acc);
      // back through the feature maps (softmax) and the sigmoid of RFWP Eq. 15, 17, 18
      S* gaq = a.gxq + tk.vec(t, d);
      S* gak = a.gxk + tk.vec(t, d);
      softmax_backward(q, gq, gaq, d);
      softmax_backward(k, gk, gak, d);
      const S gab = gbeta * beta * (S(1) - beta);
      a.gxb[tk.scal(t)] = gab;
      if (rst) {   // h = 0 after a reset: nothing reaches the slow weights or y_{t-1}
        zero_n(carry, d);
        zero_n(G, mat);
        continue;
      }
      const S* h = a.h + tk.vec(t, d);   // tanh(y_{t-1}) from the forward
      rdn_recurrent_backward<S, D>(Rq, Rk, Rv, gaq, gak, gxv, h, d, gh, gRq, gRk, gRv);
      axpy(gab, h, grb, d);
      for (int i = 0; i < d; ++i) carry[i] = (gh[i] + gab * rb[i]) * (S(1) - h[i] * h[i]);
    }
  }
  copy_n(G, mat, a.gW0 + tk.mat(mat));
  copy_n(carry, d, a.gy0 + tk.mat(d));
}

// Sum the per-(b, h) partials over b in a fixed order: element e of head h of a [H, len]
// result. Deterministic for any parallel split over (h, e).
template <typename S>
inline void sum_over_batch(const S* part, S* out, int B, int H, size_t len, int h, size_t e) {
  S s = 0;
  for (int b = 0; b < B; ++b) s += part[(static_cast<size_t>(b) * H + h) * len + e];
  out[static_cast<size_t>(h) * len + e] = s;
}

}  // namespace cpu
}  // namespace rfwp
