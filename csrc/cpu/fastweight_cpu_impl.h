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
// matrices [dv][dk]: per step, the row dot products (G k; W' k in the recomputation) are
// taken a vector of rows at a time (row_dots in simd_row.h), then one pass over the rows of
// G = dL/dW_t and of the recomputed W'_t does the rest. Checkpoints are stored row-major.
//
// Head sizes 16, 32 and 64 (dk == dv) are compiled with the size as a constant and rows held
// in vector registers (simd_row.h, template parameter D > 0; every per-step vector operation
// of these sizes uses the rows' vector width, so that a vector written is read back without
// a store-forwarding stall); any other size runs the same algorithm with plain loops
// (D == 0). Both paths are tested against the reference.
//
// Backward memory: the forward stores the state every `chunk` steps; the backward recomputes
// the states inside one chunk at a time (chunk x dv x dk scratch per thread) and walks it
// backwards. The recomputation repeats the forward's writes (the same formulas; v̄ = W k is
// summed in another order, so states agree to rounding). The caller picks `chunk`
// (rfwp_rl.kernels.checkpoint_interval: the whole sequence when its states fit 512 KiB).
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

// n-vector helpers: with D > 0 (n == D) one Row of vector registers, so that a vector written
// here is read back with loads of the same width (no store-forwarding stalls).
template <typename S, int D>
RFWP_INLINE S dotn(const S* a, const S* b, int n) {
  if constexpr (D > 0) return Row<S, D>::load(a).dot(Row<S, D>::load(b));
  else return dot(a, b, n);
}
template <typename S, int D>
RFWP_INLINE void copyn(const S* x, int n, S* y) {
  if constexpr (D > 0) Row<S, D>::load(x).store(y);
  else copy_n(x, static_cast<size_t>(n), y);
}
// u = β (v - v̄) (DELTA: RFWP Eq. 8) or u = v (RFWP Eq. 6)
template <typename S, int D, bool DELTA>
RFWP_INLINE void write_vector(const S* v, const S* vb, S beta, int n, S* u) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    if constexpr (DELTA) ((R::load(v) - R::load(vb)) * beta).store(u);
    else R::load(v).store(u);
  } else {
    for (int i = 0; i < n; ++i) u[i] = DELTA ? beta * (v[i] - vb[i]) : v[i];
  }
}
// y = yq + u kq: the read W_t q = (W_{t-1} + u ⊗ k) q = W_{t-1} q + u (k . q) (RFWP Eq. 7)
template <typename S, int D>
RFWP_INLINE void read_output(const S* yq, const S* u, S kq, int n, S* y) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    R r = R::load(yq);
    r.fma(kq, R::load(u));
    r.store(y);
  } else {
    for (int i = 0; i < n; ++i) y[i] = yq[i] + u[i] * kq;
  }
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

// Consecutive steps of one task are B*H*len elements apart in the [T, B, H, len] arrays (a
// different page each step, out of reach of the hardware prefetchers): the loops over time
// prefetch the vectors of the step kPrefetchSteps ahead.
constexpr int kPrefetchSteps = 4;

template <typename S>
RFWP_INLINE void prefetch_vec(const S* p, int len) {
  for (int o = 0; o < len; o += static_cast<int>(64 / sizeof(S))) __builtin_prefetch(p + o, 0, 3);
}

// Prefetch step t's vectors of the [T, B, H, len] arrays xs (null entries skipped) if 0 <= t < T.
template <typename S, int K>
RFWP_INLINE void prefetch_step(const Task& tk, int T, int t, int len, const S* const (&xs)[K]) {
  if (t < 0 || t >= T) return;
  for (int i = 0; i < K; ++i)
    if (xs[i] != nullptr) prefetch_vec(xs[i] + tk.vec(t, len), len);
}

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
    // two accumulators per result (even and odd columns): half the dependency chain
    R a0 = R::zero(), a1 = R::zero(), b0 = R::zero(), b1 = R::zero();
    for (int j = 0; j < D; j += 2) {
      R w0 = R::load(WT + j * D), w1 = R::load(WT + (j + 1) * D);
      if constexpr (PENDING) {
        w0.fma(kp[j], u);
        w1.fma(kp[j + 1], u);
        w0.store(WT + j * D);
        w1.store(WT + (j + 1) * D);
      }
      a0.fma(c1[j], w0);
      a1.fma(c1[j + 1], w1);
      if constexpr (TWO) {
        b0.fma(c2[j], w0);
        b1.fma(c2[j + 1], w1);
      }
    }
    (a0 + a1).store(r1);
    if constexpr (TWO) (b0 + b1).store(r2);
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

// One step of the delta-rule recomputation on W' = Wp (the state after the reset, before the
// write of step t): v̄ = W' k, u = β (v - v̄); when `next` is not null it receives W' + u ⊗ k
// (the next step's W' unless that step resets). (lt needs no recomputation: lt_backward_task.)
template <typename S, int D>
RFWP_INLINE void recompute_step(const S* __restrict__ Wp, S* __restrict__ next, const S* k,
                                const S* v, S beta, int dk, int dv, S* u, S* diff) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    const R kr = R::load(k), vr = R::load(v);
    const R df = vr - row_dots<S, D>(Wp, kr);        // v - v̄, v̄ = W' k: RFWP Eq. 10
    df.store(diff);
    (df * beta).store(u);                            // RFWP Eq. 8
    if (next != nullptr)
      for (int i = 0; i < D; ++i) R::load(Wp + i * D).fma(u[i], kr).store(next + i * D);
  } else {
    for (int i = 0; i < dv; ++i) {
      const S* Wi = Wp + static_cast<size_t>(i) * dk;
      diff[i] = v[i] - dot(Wi, k, dk);
      u[i] = beta * diff[i];
      if (next != nullptr) {
        S* Ni = next + static_cast<size_t>(i) * dk;
        for (int j = 0; j < dk; ++j) Ni[j] = Wi[j] + u[i] * k[j];
      }
    }
  }
}

// Backward of one step, given G = dL/dW_t (updated in place to dL/dW'_t), W' = Wp, the
// step's u and v - v̄, and gy = dL/dy_t for the read y = W_t q:
//   G += gy ⊗ q;  gu = G k;  gv = β gu;  gβ = gu . (v - v̄);  gv̄ = -β gu
//   gk = G^T u + W'^T gv̄;   gq = W_t^T gy = W'^T gy + k (u . gy);   G += gv̄ ⊗ k.
// Returns gβ. `acc` is 2*dk scratch (plain-loop path only).
template <typename S, int D>
RFWP_INLINE S backward_step(S* __restrict__ G, const S* __restrict__ Wp, const S* k, const S* q,
                            const S* u, const S* diff, S beta, const S* gy, int dk, int dv,
                            S* gq_out, S* gk_out, S* gv_out, S* acc) {
  S ugy = 0, gbeta = 0;
  if constexpr (D > 0) {
    // Two passes over the rows: the first forms gu = G_t k = G k + gy (q . k) with the row
    // sums taken a vector of rows at a time (row_dots), the second everything else.
    using R = Row<S, D>;
    const R kr = R::load(k), qr = R::load(q), gyr = R::load(gy), ur = R::load(u);
    R gu = row_dots<S, D>(G, kr);
    gu.fma(kr.dot(qr), gyr);
    ugy = ur.dot(gyr);
    alignas(64) S gvb[D];
    (gu * beta).store(gv_out);
    (gu * (-beta)).store(gvb);
    gbeta = gu.dot(R::load(diff));
    // two accumulators per result (even and odd rows): half the dependency chain
    R gq0 = R::zero(), gq1 = R::zero(), gk0 = R::zero(), gk1 = R::zero();
    for (int i = 0; i < D; i += 2) {
      R x0 = R::load(G + i * D), x1 = R::load(G + (i + 1) * D);
      x0.fma(gy[i], qr);                                 // from y = W_t q
      x1.fma(gy[i + 1], qr);
      const R w0 = R::load(Wp + i * D), w1 = R::load(Wp + (i + 1) * D);
      gk0.fma(u[i], x0);
      gk1.fma(u[i + 1], x1);
      gq0.fma(gy[i], w0);
      gq1.fma(gy[i + 1], w1);
      gk0.fma(gvb[i], w0);
      gk1.fma(gvb[i + 1], w1);
      x0.fma(gvb[i], kr);
      x1.fma(gvb[i + 1], kr);
      x0.store(G + i * D);
      x1.store(G + (i + 1) * D);
    }
    R gq = gq0 + gq1;
    gq.fma(ugy, kr);
    gq.store(gq_out);
    (gk0 + gk1).store(gk_out);
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
      gv_out[i] = beta * gu;
      ugy += ui * g;
      const S gvb = -beta * gu;
      gbeta += gu * diff[i];
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
  AlignedVector<S> G, Wbuf, ubuf, dbuf;
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

// Recompute W'_t, u_t, v_t - v̄_t for t in [t0, t1) from the checkpoint at t0 (delta rule).
template <typename S, int D>
inline void recompute_chunk(const S* ckpt, const S* k, const S* v, const S* beta,
                            const uint8_t* reset, const Task& tk, int dk, int dv, int t0, int t1,
                            MatrixScratch<S>& m) {
  const size_t mat = static_cast<size_t>(dv) * dk;
  copy_n(ckpt, mat, m.Wp(0, mat));
  for (int t = t0; t < t1; ++t) {
    if (t + kPrefetchSteps < t1) {
      prefetch_vec(k + tk.vec(t + kPrefetchSteps, dk), dk);
      prefetch_vec(v + tk.vec(t + kPrefetchSteps, dv), dv);
    }
    const int j = t - t0;
    if (tk.reset(reset, t)) zero_n(m.Wp(j, mat), mat);
    recompute_step<S, D>(m.Wp(j, mat), t + 1 < t1 ? m.Wp(j + 1, mat) : nullptr,
                         k + tk.vec(t, dk), v + tk.vec(t, dv), beta[tk.scal(t)], dk, dv,
                         m.u(j, dv), m.diff(j, dv));
  }
}

// ------------------------------------------------------------------------------ lt / delta

template <typename S>
struct ForwardScratch {
  AlignedVector<S> buf;
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
    prefetch_step<S, 2>(tk, n.T, t + kPrefetchSteps, dk, {a.q, a.k});
    prefetch_step<S, 2>(tk, n.T, t + kPrefetchSteps, dv, {a.v, a.y});
    if (n.chunk > 0 && t % n.chunk == 0) W.store_rows(a.ckpt + tk.ckpt(t / n.chunk, mat));
    if (tk.reset(a.reset, t)) W.zero();
    const S* k = a.k + tk.vec(t, dk);
    const S* q = a.q + tk.vec(t, dk);
    const S* v = a.v + tk.vec(t, dv);
    S* y = a.y + tk.vec(t, dv);
    const S kq = dotn<S, D>(k, q, dk);
    if (DELTA) {
      W.template read<true>(k, q, vb, yq);           // RFWP Eq. 10: v̄ = W_{t-1} k; and W_{t-1} q
      write_vector<S, D, true>(v, vb, a.beta[tk.scal(t)], dv, u);   // RFWP Eq. 8
    } else {
      W.template read<false>(q, nullptr, yq, nullptr);
      write_vector<S, D, false>(v, nullptr, S(1), dv, u);            // RFWP Eq. 6
    }
    read_output<S, D>(yq, u, kq, dv, y);             // RFWP Eq. 7
    W.write_later(k);
  }
  W.store_rows(a.W + tk.mat(mat));
}

template <typename S>
struct DeltaScratch {
  MatrixScratch<S> m;
  AlignedVector<S> acc;
};

template <typename S, int D>
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
    recompute_chunk<S, D>(a.ckpt + tk.ckpt(c, mat), a.k, a.v, a.beta, a.reset, tk, dk, dv, t0,
                          t1, s.m);
    for (int t = t1 - 1; t >= t0; --t) {
      prefetch_step<S, 4>(tk, n.T, t - kPrefetchSteps, dk, {a.q, a.k, a.gq, a.gk});
      prefetch_step<S, 2>(tk, n.T, t - kPrefetchSteps, dv, {a.gy, a.gv});
      const int j = t - t0;
      a.gbeta[tk.scal(t)] = backward_step<S, D>(
          G, s.m.Wp(j, mat), a.k + tk.vec(t, dk), a.q + tk.vec(t, dk), s.m.u(j, dv),
          s.m.diff(j, dv), a.beta[tk.scal(t)], a.gy + tk.vec(t, dv), dk, dv,
          a.gq + tk.vec(t, dk), a.gk + tk.vec(t, dk), a.gv + tk.vec(t, dv), s.acc.data());
      if (tk.reset(a.reset, t)) zero_n(G, mat);   // no gradient crosses a reset
    }
  }
  copy_n(G, mat, a.gW0 + tk.mat(mat));
}

// lt needs no stored states: with W_t = W_{t-1} + v_t ⊗ k_t (RFWP Eq. 6), the query gradient
// gq_t = W_t^T gy_t depends only on W_t and the given gy_t, so it is formed in a forward pass
// that rebuilds W_t from the initial state (checkpoint 0) in place; the remaining gradients
// need only G_t = dL/dW_t = Σ_{s >= t} gy_s ⊗ q_s (+ gW, up to a reset):
// gv_t = G_t k_t, gk_t = G_t^T v_t, from a backward pass. Two d x d matrices per task, no
// recomputation scratch; the forward's later checkpoints are not read.
template <typename S>
struct LtScratch {
  AlignedVector<S> W, G;
};

template <typename S, int D>
void lt_backward_task(const DeltaBwdArgs<S>& a, int bh, LtScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int dk = D > 0 ? D : n.dk, dv = D > 0 ? D : n.dv;
  const size_t mat = static_cast<size_t>(dv) * dk;
  s.W.resize(mat);
  s.G.resize(mat);
  S* W = s.W.data();
  S* G = s.G.data();
  if (n.T > 0) copy_n(a.ckpt + tk.ckpt(0, mat), mat, W);   // T = 0: no checkpoint, nothing to rebuild
  // forward: W_t, gq_t = W_t^T gy_t
  for (int t = 0; t < n.T; ++t) {
    prefetch_step<S, 2>(tk, n.T, t + kPrefetchSteps, dk, {a.k, a.gq});
    prefetch_step<S, 2>(tk, n.T, t + kPrefetchSteps, dv, {a.v, a.gy});
    if (tk.reset(a.reset, t)) zero_n(W, mat);
    const S* k = a.k + tk.vec(t, dk);
    const S* v = a.v + tk.vec(t, dv);
    const S* gy = a.gy + tk.vec(t, dv);
    S* gq = a.gq + tk.vec(t, dk);
    if constexpr (D > 0) {
      using R = Row<S, D>;
      const R kr = R::load(k);
      R g0 = R::zero(), g1 = R::zero();
      for (int i = 0; i < D; i += 2) {
        R w0 = R::load(W + i * D), w1 = R::load(W + (i + 1) * D);
        w0.fma(v[i], kr);
        w1.fma(v[i + 1], kr);
        w0.store(W + i * D);
        w1.store(W + (i + 1) * D);
        g0.fma(gy[i], w0);
        g1.fma(gy[i + 1], w1);
      }
      (g0 + g1).store(gq);
    } else {
      zero_n(gq, dk);
      for (int i = 0; i < dv; ++i) {
        S* Wi = W + static_cast<size_t>(i) * dk;
        axpy(v[i], k, Wi, dk);
        axpy(gy[i], Wi, gq, dk);
      }
    }
  }
  // backward: G_t, gv_t = G_t k_t, gk_t = G_t^T v_t
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(mat), mat, G); else zero_n(G, mat);
  for (int t = n.T - 1; t >= 0; --t) {
    prefetch_step<S, 3>(tk, n.T, t - kPrefetchSteps, dk, {a.q, a.k, a.gk});
    prefetch_step<S, 3>(tk, n.T, t - kPrefetchSteps, dv, {a.v, a.gy, a.gv});
    const S* q = a.q + tk.vec(t, dk);
    const S* k = a.k + tk.vec(t, dk);
    const S* v = a.v + tk.vec(t, dv);
    const S* gy = a.gy + tk.vec(t, dv);
    S* gk = a.gk + tk.vec(t, dk);
    S* gv = a.gv + tk.vec(t, dv);
    if constexpr (D > 0) {
      using R = Row<S, D>;
      using V = typename R::V;
      constexpr int L = R::W;
      const R qr = R::load(q), kr = R::load(k);
      R g0 = R::zero(), g1 = R::zero();
      R gvr;
      for (int blk = 0; blk < R::C; ++blk) {   // L rows at a time: their dot products with k
        V part[L];
        for (int r = 0; r < L; r += 2) {
          const int i = blk * L + r;
          R x0 = R::load(G + i * D), x1 = R::load(G + (i + 1) * D);
          x0.fma(gy[i], qr);                     // from y_t = W_t q_t
          x1.fma(gy[i + 1], qr);
          x0.store(G + i * D);
          x1.store(G + (i + 1) * D);
          g0.fma(v[i], x0);
          g1.fma(v[i + 1], x1);
          part[r] = x0.partial_dot(kr);
          part[r + 1] = x1.partial_dot(kr);
        }
        gvr.v[blk] = sum_lanes<S, V, L>(part);
      }
      gvr.store(gv);
      (g0 + g1).store(gk);
    } else {
      zero_n(gk, dk);
      for (int i = 0; i < dv; ++i) {
        S* Gi = G + static_cast<size_t>(i) * dk;
        axpy(gy[i], q, Gi, dk);
        gv[i] = dot(Gi, k, dk);
        axpy(v[i], Gi, gk, dk);
      }
    }
    if (tk.reset(a.reset, t)) zero_n(G, mat);   // no gradient crosses a reset
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
    prefetch_step<S, 2>(tk, n.T, t + kPrefetchSteps, dk, {a.q, a.k});
    prefetch_step<S, 5>(tk, n.T, t + kPrefetchSteps, dv, {a.v, a.kr, a.vr, a.y, a.s});
    S* sq = a.s + tk.vec(t, dv);
    vsoftmax<S, D>(yprev, sq, dv);           // recurrent query f(y_{t-1}) (RFWP Eq. 12), kept
    const S* k = a.k + tk.vec(t, dk);
    const S* q = a.q + tk.vec(t, dk);
    const S* v = a.v + tk.vec(t, dv);
    const S* kr = a.kr + tk.vec(t, dv);
    const S* vr = a.vr + tk.vec(t, dv);
    const S beta = a.beta[tk.scal(t)], beta_r = a.beta_r[tk.scal(t)];
    W.template read<true>(k, q, vb, wq);     // RFWP Eq. 10 for W
    R.template read<true>(kr, sq, vrb, rs);  // RFWP Eq. 10 for R
    const S kq = dotn<S, D>(k, q, dk), krs = dotn<S, D>(kr, sq, dv);
    S* y = a.y + tk.vec(t, dv);
    write_vector<S, D, true>(v, vb, beta, dv, u);        // RFWP Eq. 8
    write_vector<S, D, true>(vr, vrb, beta_r, dv, ur);
    read_output<S, D>(wq, u, kq, dv, wq);                // W_t q
    read_output<S, D>(rs, ur, krs, dv, rs);              // R_t f(y_{t-1})
    if constexpr (D > 0) {
      (Row<S, D>::load(wq) + Row<S, D>::load(rs)).store(y);   // RFWP Eq. 12
    } else {
      for (int i = 0; i < dv; ++i) y[i] = wq[i] + rs[i];
    }
    W.write_later(k);
    R.write_later(kr);
    copyn<S, D>(y, dv, yprev);
  }
  W.store_rows(a.W + tk.mat(matW));
  R.store_rows(a.R + tk.mat(matR));
}

template <typename S>
struct DeltaRnnScratch {
  MatrixScratch<S> w, r;
  AlignedVector<S> vecs;
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
    recompute_chunk<S, D>(a.ckptW + tk.ckpt(c, matW), a.k, a.v, a.beta, a.reset, tk, dk, dv,
                                t0, t1, sc.w);
    recompute_chunk<S, D>(a.ckptR + tk.ckpt(c, matR), a.kr, a.vr, a.beta_r, a.reset, tk, dv,
                                dv, t0, t1, sc.r);
    for (int t = t1 - 1; t >= t0; --t) {
      prefetch_step<S, 4>(tk, n.T, t - kPrefetchSteps, dk, {a.q, a.k, a.gq, a.gk});
      prefetch_step<S, 6>(tk, n.T, t - kPrefetchSteps, dv, {a.kr, a.s, a.gy, a.gv, a.gkr, a.gvr});
      const int j = t - t0;
      const bool rst = tk.reset(a.reset, t);
      const S* gy = a.gy + tk.vec(t, dv);
      for (int i = 0; i < dv; ++i) gyt[i] = gy[i] + carry[i];
      const S* s = a.s + tk.vec(t, dv);   // softmax(y_{t-1}) from the forward
      a.gbeta[tk.scal(t)] = backward_step<S, D>(
          G, sc.w.Wp(j, matW), a.k + tk.vec(t, dk), a.q + tk.vec(t, dk), sc.w.u(j, dv),
          sc.w.diff(j, dv), a.beta[tk.scal(t)], gyt, dk, dv, a.gq + tk.vec(t, dk),
          a.gk + tk.vec(t, dk), a.gv + tk.vec(t, dv), acc);
      // R: its "query" is s, so its query gradient is gs = R_t^T gy
      a.gbeta_r[tk.scal(t)] = backward_step<S, D>(
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
    // two accumulators per result (even and odd columns): half the dependency chain
    R a0 = R::load(xq), b0 = R::load(xk), c0 = R::load(xv);
    R a1 = R::zero(), b1 = R::zero(), c1 = R::zero();
    for (int j = 0; j < D; j += 2) {
      a0.fma(h[j], R::load(RqT + j * D));
      b0.fma(h[j], R::load(RkT + j * D));
      c0.fma(h[j], R::load(RvT + j * D));
      a1.fma(h[j + 1], R::load(RqT + (j + 1) * D));
      b1.fma(h[j + 1], R::load(RkT + (j + 1) * D));
      c1.fma(h[j + 1], R::load(RvT + (j + 1) * D));
    }
    (a0 + a1).store(aq);
    (b0 + b1).store(ak);
    (c0 + c1).store(av);
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

// gh = Rq^T gaq + Rk^T gak + Rv^T gv (the slow-weight gradients are formed after the
// recurrence, task_outer_sum).
template <typename S, int D>
RFWP_INLINE void rdn_recurrent_backward(const S* Rq, const S* Rk, const S* Rv, const S* gaq,
                                        const S* gak, const S* gv, int d, S* gh) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    R a0 = R::zero(), b0 = R::zero(), c0 = R::zero(), a1 = R::zero(), b1 = R::zero(),
      c1 = R::zero();
    for (int i = 0; i < D; i += 2) {
      const int o = i * D;
      a0.fma(gaq[i], R::load(Rq + o));
      b0.fma(gak[i], R::load(Rk + o));
      c0.fma(gv[i], R::load(Rv + o));
      a1.fma(gaq[i + 1], R::load(Rq + o + D));
      b1.fma(gak[i + 1], R::load(Rk + o + D));
      c1.fma(gv[i + 1], R::load(Rv + o + D));
    }
    ((a0 + a1) + (b0 + b1) + (c0 + c1)).store(gh);
  } else {
    zero_n(gh, d);
    for (int i = 0; i < d; ++i) {
      const size_t o = static_cast<size_t>(i) * d;
      const S x = gaq[i], y = gak[i], z = gv[i];
#pragma omp simd
      for (int j = 0; j < d; ++j) gh[j] += x * Rq[o + j] + y * Rk[o + j] + z * Rv[o + j];
    }
  }
}

// g_in = s * (g_out - s . g_out): backward of s = softmax(x).
template <typename S, int D>
RFWP_INLINE void softmax_backward_n(const S* s, const S* g_out, S* g_in, int n) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    const R sr = R::load(s), gr = R::load(g_out);
    const S sg = sr.dot(gr);
    R r = gr;
    for (int c = 0; c < R::C; ++c) r.v[c] -= sg;
    (sr * r).store(g_in);
  } else {
    softmax_backward(s, g_out, g_in, n);
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
    prefetch_step<S, 8>(tk, n.T, t + kPrefetchSteps, d, {a.xq, a.xk, a.xv, a.q, a.k, a.v, a.h, a.y});
    if (n.chunk > 0 && t % n.chunk == 0) W.store_rows(a.ckpt + tk.ckpt(t / n.chunk, mat));
    if (tk.reset(a.reset, t)) {
      W.zero();
      zero_n(yprev, d);
    }
    S* h = a.h + tk.vec(t, d);
    vtanh_n<S, D>(yprev, h, d);              // h = tanh(y_{t-1}), kept for the backward
    S* q = a.q + tk.vec(t, d);
    S* k = a.k + tk.vec(t, d);
    S* v = a.v + tk.vec(t, d);
    rdn_slow_inputs<S, D>(RqT, RkT, RvT, h, a.xq + tk.vec(t, d), a.xk + tk.vec(t, d),
                          a.xv + tk.vec(t, d), d, aq, ak, v);   // RFWP Eq. 15-17
    vsoftmax<S, D>(aq, q, d);
    vsoftmax<S, D>(ak, k, d);
    const S beta = vsigmoid(a.xb[tk.scal(t)] + dotn<S, D>(rb, h, d));   // RFWP Eq. 18
    a.beta[tk.scal(t)] = beta;
    W.template read<true>(k, q, vb, yq);
    const S kq = dotn<S, D>(k, q, d);
    S* y = a.y + tk.vec(t, d);
    write_vector<S, D, true>(v, vb, beta, d, u);   // RFWP Eq. 8
    read_output<S, D>(yq, u, kq, d, y);            // RFWP Eq. 7
    W.write_later(k);
    copyn<S, D>(y, d, yprev);
  }
  W.store_rows(a.W + tk.mat(mat));
}

template <typename S>
struct RdnScratch {
  MatrixScratch<S> m;
  AlignedVector<S> vecs;
};

// out[i][j] = Σ_t g_t[i] h_t[j] over the steps t of one task without a reset (after a reset
// h = 0 and the slow inputs do not depend on the slow weights), for the [T, B, H, d] arrays g
// and h; with VEC, g is [T, B, H] and out[j] = Σ_t g_t h_t[j]. D > 0: blocks of rows whose
// accumulators stay in registers (the task's rows of g and h are still in cache).
template <typename S, int D, bool VEC>
RFWP_INLINE void task_outer_sum(const S* g, const S* hh, const uint8_t* reset, const Task& tk,
                                int T, int d, S* out) {
  if constexpr (D > 0) {
    using R = Row<S, D>;
    constexpr int NB = (kVectorBytes == 64 ? 16 : 8) / R::C;   // rows per block (divides D)
    constexpr int rows = VEC ? 1 : D;
    constexpr int nb = VEC ? 1 : (NB < 1 ? 1 : (NB > D ? D : NB));
    for (int i0 = 0; i0 < rows; i0 += nb) {
      R acc[nb];
      for (int r = 0; r < nb; ++r) acc[r] = R::zero();
      for (int t = 0; t < T; ++t) {
        if (tk.reset(reset, t)) continue;
        const R hr = R::load(hh + tk.vec(t, D));
        const S* gv = VEC ? g + tk.scal(t) : g + tk.vec(t, D) + i0;
        for (int r = 0; r < nb; ++r) acc[r].fma(gv[r], hr);
      }
      for (int r = 0; r < nb; ++r) acc[r].store(out + static_cast<size_t>(i0 + r) * D);
    }
  } else {
    const int rows = VEC ? 1 : d;
    zero_n(out, static_cast<size_t>(rows) * d);
    for (int t = 0; t < T; ++t) {
      if (tk.reset(reset, t)) continue;
      const S* hv = hh + tk.vec(t, d);
      for (int i = 0; i < rows; ++i)
        axpy(VEC ? g[tk.scal(t)] : g[tk.vec(t, d) + i], hv, out + static_cast<size_t>(i) * d, d);
    }
  }
}

// The recurrence backwards for one (b, h). Writes gxq, gxk, gxv, gxb (the gradients of the
// pre-activations a_q, a_k and of v, β's pre-activation), gW0, gy0, and this (b, h)'s
// partial slow-weight gradients: sums over t of outer products of the former with h, formed
// after the recurrence (instead of a load-add-store of three d x d matrices per step).
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
  if (a.gW != nullptr) copy_n(a.gW + tk.mat(mat), mat, G); else zero_n(G, mat);
  zero_n(carry, d);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = std::min(n.T, t0 + C);
    recompute_chunk<S, D>(a.ckpt + tk.ckpt(c, mat), a.k, a.v, a.beta, a.reset, tk, d, d, t0,
                                t1, sc.m);
    for (int t = t1 - 1; t >= t0; --t) {
      prefetch_step<S, 7>(tk, n.T, t - kPrefetchSteps, d, {a.q, a.k, a.h, a.gy, a.gxq, a.gxk, a.gxv});
      const int j = t - t0;
      const bool rst = tk.reset(a.reset, t);
      const S* q = a.q + tk.vec(t, d);
      const S* k = a.k + tk.vec(t, d);
      const S beta = a.beta[tk.scal(t)];
      const S* gy = a.gy + tk.vec(t, d);
      if constexpr (D > 0) {
        (Row<S, D>::load(gy) + Row<S, D>::load(carry)).store(gyt);
      } else {
        for (int i = 0; i < d; ++i) gyt[i] = gy[i] + carry[i];
      }
      S* gxv = a.gxv + tk.vec(t, d);
      const S gbeta = backward_step<S, D>(G, sc.m.Wp(j, mat), k, q, sc.m.u(j, d),
                                                sc.m.diff(j, d), beta, gyt, d, d, gq, gk, gxv,
                                                acc);
      // back through the feature maps (softmax) and the sigmoid of RFWP Eq. 15, 17, 18
      S* gaq = a.gxq + tk.vec(t, d);
      S* gak = a.gxk + tk.vec(t, d);
      softmax_backward_n<S, D>(q, gq, gaq, d);
      softmax_backward_n<S, D>(k, gk, gak, d);
      const S gab = gbeta * beta * (S(1) - beta);
      a.gxb[tk.scal(t)] = gab;
      if (rst) {   // h = 0 after a reset: nothing reaches the slow weights or y_{t-1}
        zero_n(carry, d);
        zero_n(G, mat);
        continue;
      }
      const S* h = a.h + tk.vec(t, d);   // tanh(y_{t-1}) from the forward
      rdn_recurrent_backward<S, D>(Rq, Rk, Rv, gaq, gak, gxv, d, gh);
      if constexpr (D > 0) {
        using R = Row<S, D>;
        const R hr = R::load(h);
        R g = R::load(gh);
        g.fma(gab, R::load(rb));
        R one_minus = R::zero();
        for (int c2 = 0; c2 < R::C; ++c2) one_minus.v[c2] += S(1);
        (g * (one_minus - hr * hr)).store(carry);
      } else {
        for (int i = 0; i < d; ++i) carry[i] = (gh[i] + gab * rb[i]) * (S(1) - h[i] * h[i]);
      }
    }
  }
  copy_n(G, mat, a.gW0 + tk.mat(mat));
  copy_n(carry, d, a.gy0 + tk.mat(d));
  // this (b, h)'s part of the slow-weight gradients: ∂Rq = Σ_t ∂a_q ⊗ h, ... (RFWP Eq. 15-18)
  task_outer_sum<S, D, false>(a.gxq, a.h, a.reset, tk, n.T, d, a.gRq_part + tk.mat(mat));
  task_outer_sum<S, D, false>(a.gxk, a.h, a.reset, tk, n.T, d, a.gRk_part + tk.mat(mat));
  task_outer_sum<S, D, false>(a.gxv, a.h, a.reset, tk, n.T, d, a.gRv_part + tk.mat(mat));
  task_outer_sum<S, D, true>(a.gxb, a.h, a.reset, tk, n.T, d, a.grb_part + tk.mat(d));
}

// Sum over b of per-(b, h) partials: out[h][e] = Σ_b part[b][h][e] for the heads h of [H, len]
// results, b = 0, 1, ..., B-1 in order (deterministic).
template <typename S>
inline void sum_over_batch(const S* part, S* out, int B, int H, size_t len, int h) {
  S* o = out + static_cast<size_t>(h) * len;
  copy_n(part + static_cast<size_t>(h) * len, len, o);
  for (int b = 1; b < B; ++b) {
    const S* p = part + (static_cast<size_t>(b) * H + h) * len;
#pragma omp simd
    for (size_t e = 0; e < len; ++e) o[e] += p[e];
  }
}

}  // namespace cpu
}  // namespace rfwp
