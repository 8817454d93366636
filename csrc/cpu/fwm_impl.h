// CPU Fast Weight Memory (Schlag, Munkhdalai, Schmidhuber, ICLR 2021, "Learning Associative
// Inference Using Fast Weight Memory"; "FWM" below): the write of FWM Eq. 3-4 and the N_r
// chained reads of FWM Eq. 7, one (batch, head) task at a time, no torch.
//
// Representation. The fast tensor F [m][m][m] (first key, second key, value) is a dense base
// D plus the low-rank tail of the writes made since the base:
//     F = qD D + Σ_{j<L} q_j (k1_j ⊗ k2_j ⊗ z_j),
// z_j = β_j (v_j - v_old_j) the increment of the write of step j (FWM Eq. 3), q_j (qD) the
// product of the FWM Eq. 4 rescalings since term j (since the base). A lookup of F is a sum
// over the tail, F vec(x ⊗ y) = qD D vec(x ⊗ y) + Σ_j q_j <k1_j, x> <k2_j, y> z_j (fast weights
// and their factors are dual, Secretly-FWP Sec. 2): O(L m) instead of O(m³), and ||F'||² has a
// scalar recurrence, so a step touches no dense tensor unless there is a base. The base is the
// initial state (skipped when it is zero: every meta-RL episode, every segment after a reset)
// or the fold of a tail that reached `fold` terms into a dense tensor (kept for the backward,
// like a checkpoint; it bounds the tail, and so the cost of a step, on long sequences).
//
// Forward of step t (after its reset or fold), `memory_step`:
//   v_old = F_{t-1} vec(k1 ⊗ k2)                              FWM §3.1.1
//   z = β (v - v_old);  F' = F_{t-1} + vec(k1 ⊗ k2) ⊗ z        FWM Eq. 3 (a new tail term)
//   ||F'||² = ||F||² + 2 <z, v_old> + |k1|² |k2|² |z|²         (<F, vec(k1 ⊗ k2) ⊗ z> = <z, v_old>)
//   C = max(1, ||F'||);  F_t = F' / C  (every q_j and qD / C)  FWM Eq. 4
//   n_i = LN(F_t vec(n_{i-1} ⊗ e_i)), i = 1..N_r;  y = n_{N_r} FWM Eq. 7 (LN without affine map)
// The forward saves z, v_old, the normalised reads, their 1/std, ||F'||² and C of every step
// (O(N_r m) per step), so the backward recomputes nothing but dot products.
//
// Backward: reverse mode through these formulas, one segment (steps between resets and
// folds) at a time, last to first, with adjoints of every tail term (gk1_j, gk2_j, gz_j) and of
// ||F||². A rescaling enters through ∂L/∂ln C_t = -(Σ_{j<=t} A_j + A_D), where A_j collects
// (∂L/∂q_j) q_j over the uses of term j's scale at steps >= t (q_j at step s is the product of
// 1 / C over steps j..s). The gradient of a dense tensor that a segment ends in (the final
// state, or the next segment's base) is looked up term by term (O(m³) per term).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../fastweight_params.h"
#include "fastweight_cpu_impl.h"

namespace rfwp {
namespace cpu {

// ε of the layer norm of FWM Eq. 7 (torch.nn.functional.layer_norm's default)
constexpr double kFwmLnEps = 1e-5;

template <int M>
RFWP_INLINE int msize(int m) { return M > 0 ? M : m; }

// Loops over the tail's terms j run a whole vector of terms at a time (the tail is short, 30
// terms in the meta-RL task: a compiler's vector loop with a scalar remainder would run almost
// all of it in the remainder). Arrays indexed by j therefore have `stride` entries (a multiple
// of the vector lanes), and the entries past the live terms stay finite: the forward zeroes a
// new block of columns when the tail enters it; in the backward they hold later terms.
template <typename S>
using Vec = typename VecType<S>::type;
template <typename S>
constexpr int kLanes = VecType<S>::lanes;
template <typename S>
RFWP_INLINE Vec<S> vload(const S* p) {
  return *reinterpret_cast<const typename VecType<S>::unaligned*>(p);
}
template <typename S>
RFWP_INLINE void vstore(S* p, Vec<S> v) {
  *reinterpret_cast<typename VecType<S>::unaligned*>(p) = v;
}

// What one step keeps for the backward (a [saved_size] slice): z, v_old [m]; the normalised
// reads n_1..n_Nr [nr][m]; their 1/std [nr]; ||F'||², C.
template <typename P>
struct FwmSaved {
  P *z, *vold, *nhat, *rstd, *norm;
  FwmSaved(P* p, int m, int nr)
      : z(p), vold(p + m), nhat(p + 2 * m), rstd(p + (2 + nr) * m), norm(p + (2 + nr) * m + nr) {}
};

// ------------------------------------------------------------------------ tail operations

// out[j] = <x, X[:, j]> for j < L; XT [m][stride] holds the columns (a column per tail term),
// so the L dot products are m vector multiply-adds over j, without horizontal sums.
template <typename S, int M>
RFWP_INLINE void column_dots(const S* __restrict__ XT, int stride, const S* __restrict__ x, int m_,
                             int L, S* __restrict__ out) {
  const int m = msize<M>(m_);
  for (int j = 0; j < L; j += kLanes<S>) {
    Vec<S> acc[4] = {};   // four chains over a: the sum is latency-bound, not throughput-bound
    int a = 0;
    for (; a + 3 < m; a += 4)
      for (int u = 0; u < 4; ++u) acc[u] += x[a + u] * vload(XT + static_cast<size_t>(a + u) * stride + j);
    for (; a < m; ++a) acc[0] += x[a] * vload(XT + static_cast<size_t>(a) * stride + j);
    vstore(out + j, (acc[0] + acc[1]) + (acc[2] + acc[3]));
  }
}

// s = Σ_{j<L} x[j] (exactly the live terms: the padding of x may hold later terms).
template <typename S>
RFWP_INLINE S sum_terms(const S* x, int L) {
  Vec<S> acc{};
  int j = 0;
  for (; j + kLanes<S> <= L; j += kLanes<S>) acc += vload(x + j);
  S s = 0;
  for (int i = 0; i < kLanes<S>; ++i) s += acc[i];
  for (; j < L; ++j) s += x[j];
  return s;
}

// out += Σ_{j<L} c_j X[j] (X [L][m], a row per tail term).
template <typename S, int M>
RFWP_INLINE void add_rows(const S* __restrict__ X, const S* __restrict__ c, int m_, int L,
                          S* __restrict__ out) {
  if constexpr (M > 0) {
    using R = Row<S, M>;
    R acc[4] = {R::load(out), R::zero(), R::zero(), R::zero()};   // four dependency chains
    int j = 0;
    for (; j + 3 < L; j += 4)
      for (int u = 0; u < 4; ++u) acc[u].fma(c[j + u], R::load(X + static_cast<size_t>(j + u) * M));
    for (; j < L; ++j) acc[0].fma(c[j], R::load(X + static_cast<size_t>(j) * M));
    ((acc[0] + acc[1]) + (acc[2] + acc[3])).store(out);
  } else {
    for (int j = 0; j < L; ++j) axpy(c[j], X + static_cast<size_t>(j) * m_, out, m_);
  }
}

// Y[j] += c_j x for j < L (adjoints of the tail terms, a row per term).
template <typename S, int M>
RFWP_INLINE void add_to_rows(S* __restrict__ Y, const S* __restrict__ c, const S* __restrict__ x,
                             int m_, int L) {
  if constexpr (M > 0) {
    using R = Row<S, M>;
    const R xr = R::load(x);
    for (int j = 0; j < L; ++j) {
      R y = R::load(Y + static_cast<size_t>(j) * M);
      y.fma(c[j], xr);
      y.store(Y + static_cast<size_t>(j) * M);
    }
  } else {
    for (int j = 0; j < L; ++j) axpy(c[j], x, Y + static_cast<size_t>(j) * m_, m_);
  }
}

// --------------------------------------------------------------------- dense [m][m][m] tensors

// u = X vec(x ⊗ y), i.e. u[c] = Σ_{a,b} x_a y_b X[a][b][c]. With g (not null) also the
// gradients of that lookup with cotangent g, scaled by s: gx[a] += s Σ_b y_b <X[a][b], g>,
// gy[b] += s Σ_a x_a <X[a][b], g>.
template <typename S, int M>
void dense_lookup(const S* X, const S* x, const S* y, int m_, S* u, const S* g = nullptr,
                  S s = 0, S* gx = nullptr, S* gy = nullptr) {
  const int m = msize<M>(m_);
  zero_n(u, m);
  for (int a = 0; a < m; ++a) {
    const S* Xa = X + static_cast<size_t>(a) * m * m;
    S gxa = 0;
    for (int b = 0; b < m; ++b) {
      const S* row = Xa + static_cast<size_t>(b) * m;
      axpy(x[a] * y[b], row, u, m);
      if (g != nullptr) {
        const S d = dot(row, g, m);
        gxa += y[b] * d;
        gy[b] += s * x[a] * d;
      }
    }
    if (g != nullptr) gx[a] += s * gxa;
  }
}

// X += s x ⊗ y ⊗ g
template <typename S, int M>
void dense_add_outer(S* X, S s, const S* x, const S* y, const S* g, int m_) {
  const int m = msize<M>(m_);
  for (int a = 0; a < m; ++a)
    for (int b = 0; b < m; ++b)
      axpy(s * x[a] * y[b], g, X + (static_cast<size_t>(a) * m + b) * m, m);
}

// ----------------------------------------------------------------- the forward of one task

// F = qD base + Σ_{j<L} q_j (k1_j ⊗ k2_j ⊗ z_j) of one (b, h) (see the top of this file).
template <typename S>
struct Tail {
  S *k1t, *k2t;   // [m][stride]: column j = k1_j, k2_j
  S* z;           // [cap][m]
  S* q;           // [cap]
  int stride, cap, L;
  const S* base;  // [m][m][m] or null (a zero base)
  S qD, norm2;    // the base's scale; ||F||²

  void clear() {
    L = 0;
    base = nullptr;
    qD = S(1);
    norm2 = S(0);
  }
};

// dst = F, dense. dst may be tl.base: each (a, b) row of the base is read before it is written.
// pa: scratch of `cap` scalars.
template <typename S, int M>
void materialize(const Tail<S>& tl, int m_, S* dst, S* pa) {
  const int m = msize<M>(m_), L = tl.L;
  for (int a = 0; a < m; ++a) {
    for (int j = 0; j < L; j += kLanes<S>)
      vstore(pa + j, vload(tl.q + j) * vload(tl.k1t + static_cast<size_t>(a) * tl.stride + j));
    for (int b = 0; b < m; ++b) {
      const size_t row = (static_cast<size_t>(a) * m + b) * m;
      const S* k2b = tl.k2t + static_cast<size_t>(b) * tl.stride;
      S* out = dst + row;
      if constexpr (M > 0) {
        using R = Row<S, M>;
        R acc0 = tl.base != nullptr ? R::load(tl.base + row) * tl.qD : R::zero(), acc1 = R::zero();
        int j = 0;
        for (; j + 1 < L; j += 2) {
          acc0.fma(pa[j] * k2b[j], R::load(tl.z + static_cast<size_t>(j) * M));
          acc1.fma(pa[j + 1] * k2b[j + 1], R::load(tl.z + static_cast<size_t>(j + 1) * M));
        }
        if (j < L) acc0.fma(pa[j] * k2b[j], R::load(tl.z + static_cast<size_t>(j) * M));
        (acc0 + acc1).store(out);
      } else {
        if (tl.base != nullptr) {
          for (int c = 0; c < m; ++c) out[c] = tl.qD * tl.base[row + c];
        } else {
          zero_n(out, m);
        }
        for (int j = 0; j < L; ++j) axpy(pa[j] * k2b[j], tl.z + static_cast<size_t>(j) * m, out, m);
      }
    }
  }
}

template <typename S>
S squared_norm(const S* x, size_t n) {
  S s = 0;
  for (size_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

// Whether every element is +0 or -0 (an OR of the bit patterns without the sign: no branch
// per element, so the loop vectorises).
template <typename S>
bool all_zero(const S* x, size_t n) {
  using Bits = std::conditional_t<sizeof(S) == 4, uint32_t, uint64_t>;
  const Bits magnitude = ~(Bits(1) << (8 * sizeof(S) - 1));
  Bits any = 0;
#pragma omp simd reduction(| : any)
  for (size_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, x + i, sizeof(S));
    any |= b & magnitude;
  }
  return any == 0;
}

template <typename S, int M>
RFWP_INLINE Row<S, M> splat(S a) {
  Row<S, M> r;
  for (int c = 0; c < Row<S, M>::C; ++c) r.v[c] = Vec<S>{} + a;
  return r;
}

// out = LN(r) without affine map; returns 1 / std.
template <typename S, int M>
RFWP_INLINE S layer_norm(const S* r, int m, S* out) {
  if constexpr (M > 0) {
    using R = Row<S, M>;
    const R x = R::load(r);
    const R d = x - splat<S, M>(x.dot(splat<S, M>(S(1))) / M);
    const S rstd = S(1) / std::sqrt(d.dot(d) / M + S(kFwmLnEps));
    (d * rstd).store(out);
    return rstd;
  }
  S mean = 0;
  for (int i = 0; i < m; ++i) mean += r[i];
  mean /= m;
  S var = 0;
  for (int i = 0; i < m; ++i) var += (r[i] - mean) * (r[i] - mean);
  const S rstd = S(1) / std::sqrt(var / m + S(kFwmLnEps));
  for (int i = 0; i < m; ++i) out[i] = (r[i] - mean) * rstd;
  return rstd;
}

// gr = ∂L/∂r of n = LN(r) given gn = ∂L/∂n: rstd (gn - mean(gn) - n mean(gn ⊙ n)).
template <typename S, int M>
RFWP_INLINE void layer_norm_backward(const S* nhat, S rstd, const S* gn, int m, S* gr) {
  if constexpr (M > 0) {
    using R = Row<S, M>;
    const R g = R::load(gn), n = R::load(nhat);
    const S mg = g.dot(splat<S, M>(S(1))) / M, mgn = g.dot(n) / M;
    ((g - splat<S, M>(mg) - n * mgn) * rstd).store(gr);
    return;
  }
  S mg = 0, mgn = 0;
  for (int i = 0; i < m; ++i) {
    mg += gn[i];
    mgn += gn[i] * nhat[i];
  }
  mg /= m;
  mgn /= m;
  for (int i = 0; i < m; ++i) gr[i] = rstd * (gn[i] - mg - nhat[i] * mgn);
}

// Scratch of memory_step: 3 arrays of `stride` scalars and 5 vectors of m.
inline size_t step_work_size(int stride, int m) { return 3 * static_cast<size_t>(stride) + 5 * m; }

// One step on tl (after the caller's reset or fold): the write, then the N_r chained reads;
// y = n_{N_r}. saved (nullable) receives the step's FwmSaved. The caller ensures tl.L < tl.cap.
template <typename S, int M>
void memory_step(Tail<S>& tl, const S* k1, const S* k2, const S* v, S beta, const S* n0,
                 const S* e, int m_, int nr, S* y, S* saved, S* work) {
  const int m = msize<M>(m_), L = tl.L;
  S* a = work;
  S* b = a + tl.stride;
  S* c = b + tl.stride;
  S* vold = c + tl.stride;
  S* z = vold + m;
  S* r = z + m;
  S* tmp = r + m;
  S* nbuf = tmp + m;   // the reads' outputs when nothing is saved
  // v_old = F_{t-1} vec(k1 ⊗ k2): the value now associated with k1 ⊗ k2 (FWM §3.1.1)
  column_dots<S, M>(tl.k1t, tl.stride, k1, m, L, a);
  column_dots<S, M>(tl.k2t, tl.stride, k2, m, L, b);
  for (int j = 0; j < L; j += kLanes<S>) vstore(c + j, vload(tl.q + j) * vload(a + j) * vload(b + j));
  zero_n(vold, m);
  add_rows<S, M>(tl.z, c, m, L, vold);
  if (tl.base != nullptr) {
    dense_lookup<S, M>(tl.base, k1, k2, m, tmp);
    axpy(tl.qD, tmp, vold, m);
  }
  // FWM Eq. 3: F' = F_{t-1} + β vec(k1 ⊗ k2) ⊗ (v - v_old), the new tail term (k1, k2, z)
  for (int i = 0; i < m; ++i) z[i] = beta * (v[i] - vold[i]);
  // ||F'||² = ||F||² + 2 <F, vec(k1 ⊗ k2) ⊗ z> + |vec(k1 ⊗ k2) ⊗ z|², and
  // <F, vec(k1 ⊗ k2) ⊗ z> = <z, F vec(k1 ⊗ k2)> = <z, v_old>
  const S sq = tl.norm2 + S(2) * dot(z, vold, m) + dot(k1, k1, m) * dot(k2, k2, m) * dot(z, z, m);
  // FWM Eq. 4: F_t = F' / max(1, ||F'||)
  const S C = sq > S(1) ? std::sqrt(sq) : S(1);
  if (L % kLanes<S> == 0) {   // a new block of terms: its padding must be finite (zero)
    for (int i = 0; i < m; ++i) {
      zero_n(tl.k1t + static_cast<size_t>(i) * tl.stride + L, kLanes<S>);
      zero_n(tl.k2t + static_cast<size_t>(i) * tl.stride + L, kLanes<S>);
    }
    zero_n(tl.q + L, kLanes<S>);
  }
  for (int i = 0; i < m; ++i) {
    tl.k1t[static_cast<size_t>(i) * tl.stride + L] = k1[i];
    tl.k2t[static_cast<size_t>(i) * tl.stride + L] = k2[i];
  }
  copy_n(z, m, tl.z + static_cast<size_t>(L) * m);
  tl.q[L] = S(1);
  tl.L = L + 1;
  if (C > S(1)) {
    const S inv = S(1) / C;
    for (int j = 0; j <= L; j += kLanes<S>) vstore(tl.q + j, vload(tl.q + j) * inv);
    tl.qD *= inv;
    tl.norm2 = S(1);
  } else {
    tl.norm2 = sq;
  }
  // FWM Eq. 7: n_i = LN(F_t vec(n_{i-1} ⊗ e_i)), i = 1..N_r (F_t includes this step's write)
  const FwmSaved<S> sv(saved, m, nr);
  const S* n = n0;
  for (int i = 0; i < nr; ++i) {
    const S* ei = e + static_cast<size_t>(i) * m;
    column_dots<S, M>(tl.k1t, tl.stride, n, m, L + 1, a);
    column_dots<S, M>(tl.k2t, tl.stride, ei, m, L + 1, b);
    for (int j = 0; j <= L; j += kLanes<S>) vstore(c + j, vload(tl.q + j) * vload(a + j) * vload(b + j));
    zero_n(r, m);
    add_rows<S, M>(tl.z, c, m, L + 1, r);
    if (tl.base != nullptr) {
      dense_lookup<S, M>(tl.base, n, ei, m, tmp);
      axpy(tl.qD, tmp, r, m);
    }
    S* out = saved != nullptr ? sv.nhat + static_cast<size_t>(i) * m : nbuf;
    const S rstd = layer_norm<S, M>(r, m, out);
    if (saved != nullptr) sv.rstd[i] = rstd;
    n = out;
  }
  copy_n(n, m, y);
  if (saved != nullptr) {
    copy_n(z, m, sv.z);
    copy_n(vold, m, sv.vold);
    sv.norm[0] = sq;
    sv.norm[1] = C;
  }
}

// The activated inputs of one step from its slow projections w [3m + 1] and r [(1 + nr) m]:
// act = [k1 | k2 | v | n0 | e_1 .. e_nr] (m each, through tanh: FWM Eq. 1, 5, 6); returns β
// (through the sigmoid: FWM Eq. 2).
template <typename S, int M>
RFWP_INLINE S activate(const S* w, const S* r, int m_, int nr, S* act) {
  const int m = msize<M>(m_);
  vtanh_n<S, 3 * M>(w, act, 3 * m);
  vtanh_n<S>(r, act + 3 * m, (1 + nr) * m);
  return vsigmoid(w[3 * m]);
}
inline size_t act_size(int m, int nr) { return static_cast<size_t>(4 + nr) * m; }

template <typename S>
struct FwmForwardScratch {
  AlignedVector<S> k1t, k2t, z, q, work, base, act;
};

template <typename S, int M>
void fwm_forward_task(const FwmFwdArgs<S>& a, int bh, FwmForwardScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int m = msize<M>(n.dv), nr = a.nr, T = n.T;
  const int cap = std::max(1, std::min(T, a.fold)), stride = fwm_stride(cap);
  const size_t cube = static_cast<size_t>(m) * m * m;
  const size_t A = fwm_saved_size(m, nr);
  const int max_folds = fwm_max_folds(T, a.fold);
  s.k1t.resize(static_cast<size_t>(m) * stride);
  s.k2t.resize(static_cast<size_t>(m) * stride);
  s.z.resize(static_cast<size_t>(cap) * m);
  s.q.resize(stride);
  s.work.resize(step_work_size(stride, m));
  s.act.resize(act_size(m, nr));
  S* act = s.act.data();
  const int wsize = 3 * m + 1, rsize = (1 + nr) * m;
  Tail<S> tl{s.k1t.data(), s.k2t.data(), s.z.data(), s.q.data(), stride, cap, 0, nullptr, S(1), S(0)};
  const S* F0 = a.F0 + tk.mat(cube);
  if (!all_zero(F0, cube)) {
    tl.base = F0;
    tl.norm2 = squared_norm(F0, cube);
  }
  int folds = 0;
  for (int t = 0; t < T; ++t) {
    // the steps of a task are B*H vectors apart in the inputs (a page each): fetch ahead
    prefetch_step<S, 1>(tk, T, t + kPrefetchSteps, wsize, {a.w});
    prefetch_step<S, 1>(tk, T, t + kPrefetchSteps, rsize, {a.r});
    prefetch_step<S, 1>(tk, T, t + kPrefetchSteps, m, {static_cast<const S*>(a.y)});
    if (tk.reset(a.reset, t)) {
      tl.clear();
    } else if (tl.L == a.fold) {   // fold the tail into a dense base
      S* dst;
      if (a.bases != nullptr) {
        dst = a.bases + (static_cast<size_t>(bh) * max_folds + folds) * cube;
      } else {
        s.base.resize(cube);
        dst = s.base.data();
      }
      materialize<S, M>(tl, m, dst, s.work.data());
      tl.base = dst;
      tl.qD = S(1);
      tl.L = 0;
      ++folds;
    }
    const S beta = activate<S, M>(a.w + tk.vec(t, wsize), a.r + tk.vec(t, rsize), m, nr, act);
    memory_step<S, M>(tl, act, act + m, act + 2 * m, beta, act + 3 * m, act + 4 * m, m, nr,
                      a.y + tk.vec(t, m),
                      a.saved != nullptr ? a.saved + (static_cast<size_t>(bh) * T + t) * A : nullptr,
                      s.work.data());
  }
  materialize<S, M>(tl, m, a.F + tk.mat(cube), s.work.data());
}

// One step of the incremental (inference) stepper, in place on its state (FwmStepArgs).
template <typename S, int M>
void fwm_step_task(const FwmStepArgs<S>& a, int bh, AlignedVector<S>& work) {
  const Dims& n = a.n;
  const int m = msize<M>(n.dv), nr = a.nr, b = bh / n.H;
  const int stride = fwm_stride(a.cap);
  const size_t cube = static_cast<size_t>(m) * m * m;
  int32_t* meta = a.meta + 2 * static_cast<size_t>(bh);   // tail length, has a base
  S* scal = a.scal + 2 * static_cast<size_t>(bh);          // ||F||², the base's scale
  S* base = a.base + static_cast<size_t>(bh) * cube;
  Tail<S> tl{a.k1t + static_cast<size_t>(bh) * m * stride, a.k2t + static_cast<size_t>(bh) * m * stride,
             a.z + static_cast<size_t>(bh) * a.cap * m, a.q + static_cast<size_t>(bh) * stride,
             stride, a.cap, meta[0], meta[1] ? base : nullptr, scal[1], scal[0]};
  work.resize(step_work_size(stride, m) + act_size(m, nr));
  S* act = work.data() + step_work_size(stride, m);
  if (a.reset != nullptr && a.reset[b]) {
    tl.clear();
  } else if (tl.L == a.fold) {   // fold the tail into the base, in place
    materialize<S, M>(tl, m, base, work.data());
    tl.base = base;
    tl.qD = S(1);
    tl.L = 0;
  }
  const S beta = activate<S, M>(a.w + static_cast<size_t>(bh) * (3 * m + 1),
                                a.r + static_cast<size_t>(bh) * (1 + nr) * m, m, nr, act);
  memory_step<S, M>(tl, act, act + m, act + 2 * m, beta, act + 3 * m, act + 4 * m, m, nr,
                    a.y + static_cast<size_t>(bh) * m, nullptr, work.data());
  meta[0] = tl.L;
  meta[1] = tl.base != nullptr;
  scal[0] = tl.norm2;
  scal[1] = tl.qD;
}

// ---------------------------------------------------------------- the backward of one task

template <typename S>
struct FwmBackwardScratch {
  AlignedVector<S> rows, cols, scal, gbase0, gbase1, vecs, act;
  std::vector<int> seg_start, seg_kind;
};

// The tail of one segment, in both layouts, with the adjoints of its terms.
template <typename S>
struct BackTail {
  S *K1, *K2, *Z;        // [cap][m] rows
  S *gK1, *gK2, *gZ;     // [cap][m] adjoints of the terms' k1, k2, z
  S *K1T, *K2T, *ZT;     // [m][stride] columns
  S *invC, *qcur, *qprev, *A, *x1, *x2, *x3, *c1, *c2, *c3;   // [stride]
  int stride;
};

// Adjoints of one lookup r = Σ_{j<L} q_j <k1_j, x> <k2_j, y> z_j + qD base vec(x ⊗ y) with
// cotangent g: into gx, gy (added), the terms' adjoints, their scale uses A_j and the base's AD;
// gbase (nullable) += qD x ⊗ y ⊗ g.
template <typename S, int M>
void lookup_backward(BackTail<S>& bt, const S* q, S qD, int L, const S* base, S* gbase,
                     const S* x, const S* y, const S* g, int m, S* gx, S* gy, S& AD, S* u) {
  column_dots<S, M>(bt.K1T, bt.stride, x, m, L, bt.x1);   // <k1_j, x>
  column_dots<S, M>(bt.K2T, bt.stride, y, m, L, bt.x2);   // <k2_j, y>
  column_dots<S, M>(bt.ZT, bt.stride, g, m, L, bt.x3);    // <z_j, g>
  for (int j = 0; j < L; j += kLanes<S>) {
    const Vec<S> qj = vload(q + j), x1 = vload(bt.x1 + j), x2 = vload(bt.x2 + j), x3 = vload(bt.x3 + j);
    const Vec<S> c1 = qj * x1 * x2;
    vstore(bt.c1 + j, c1);                   // ∂r/∂z_j
    vstore(bt.c2 + j, qj * x2 * x3);         // ∂/∂<k1_j, x>
    vstore(bt.c3 + j, qj * x1 * x3);         // ∂/∂<k2_j, y>
    vstore(bt.A + j, vload(bt.A + j) + c1 * x3);
  }
  add_to_rows<S, M>(bt.gZ, bt.c1, g, m, L);
  add_rows<S, M>(bt.K1, bt.c2, m, L, gx);
  add_to_rows<S, M>(bt.gK1, bt.c2, x, m, L);
  add_rows<S, M>(bt.K2, bt.c3, m, L, gy);
  add_to_rows<S, M>(bt.gK2, bt.c3, y, m, L);
  if (base != nullptr) {
    dense_lookup<S, M>(base, x, y, m, u, g, qD, gx, gy);
    AD += qD * dot(u, g, m);
  }
  if (gbase != nullptr) dense_add_outer<S, M>(gbase, qD, x, y, g, m);
}

// q[j] = Π_{i=j}^{L-1} invC[i]: the scales of the first L terms after the rescaling of term
// L-1's step. Returns the scale of the base (that of term 0; 1 when L == 0).
template <typename S>
RFWP_INLINE S scales(const S* invC, int L, S* q) {
  S run = S(1);
  for (int j = L - 1; j >= 0; --j) {
    run *= invC[j];
    q[j] = run;
  }
  return run;
}

template <typename S, int M>
void fwm_backward_task(const FwmBwdArgs<S>& a, int bh, FwmBackwardScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int m = msize<M>(n.dv), nr = a.nr, T = n.T;
  const size_t cube = static_cast<size_t>(m) * m * m, A = fwm_saved_size(m, nr);
  const int max_folds = fwm_max_folds(T, a.fold);
  const S* F0 = a.F0 + tk.mat(cube);
  S* gF0 = a.gF0 != nullptr ? a.gF0 + tk.mat(cube) : nullptr;
  if (T == 0) {
    if (gF0 != nullptr) {
      if (a.gF != nullptr) copy_n(a.gF + tk.mat(cube), cube, gF0);
      else zero_n(gF0, cube);
    }
    return;
  }
  // segments, by the forward's rule: 0 = starts at t = 0 on F0, 1 = after a reset, 2 = after a fold
  s.seg_start.clear();
  s.seg_kind.clear();
  int L = 0, longest = 0;
  for (int t = 0; t < T; ++t) {
    const bool rst = tk.reset(a.reset, t);
    if (t == 0 || rst || L == a.fold) {
      s.seg_start.push_back(t);
      s.seg_kind.push_back(rst ? 1 : (t == 0 ? 0 : 2));
      L = 0;
    }
    longest = std::max(longest, ++L);
  }
  const int cap = longest, stride = fwm_stride(cap);
  s.rows.resize(6 * static_cast<size_t>(cap) * m);
  s.cols.resize(3 * static_cast<size_t>(m) * stride);
  s.scal.resize(10 * static_cast<size_t>(stride));
  s.vecs.resize(12 * static_cast<size_t>(m));
  s.act.resize(act_size(m, nr));
  S* act = s.act.data();
  const int wsize = 3 * m + 1, rsize = (1 + nr) * m;
  BackTail<S> bt;
  {
    S* r = s.rows.data();
    const size_t rm = static_cast<size_t>(cap) * m;
    bt.K1 = r; bt.K2 = r + rm; bt.Z = r + 2 * rm; bt.gK1 = r + 3 * rm; bt.gK2 = r + 4 * rm; bt.gZ = r + 5 * rm;
    S* c = s.cols.data();
    const size_t cm = static_cast<size_t>(m) * stride;
    bt.K1T = c; bt.K2T = c + cm; bt.ZT = c + 2 * cm;
    S* q = s.scal.data();
    S** arrays[] = {&bt.invC, &bt.qcur, &bt.qprev, &bt.A, &bt.x1, &bt.x2, &bt.x3, &bt.c1, &bt.c2, &bt.c3};
    for (int i = 0; i < 10; ++i) *arrays[i] = q + static_cast<size_t>(i) * stride;
    bt.stride = stride;
  }
  S* gn = s.vecs.data();
  S* gr = gn + m;
  S* gnin = gr + m;
  S* gz = gnin + m;
  S* gk1 = gz + m;
  S* gk2 = gk1 + m;
  S* gvold = gk2 + m;
  S* u = gvold + m;
  const bool any_fold = std::find(s.seg_kind.begin(), s.seg_kind.end(), 2) != s.seg_kind.end();
  if (any_fold || gF0 != nullptr) {
    s.gbase0.resize(cube);
    s.gbase1.resize(cube);
  }
  const S* gEnd = a.gF != nullptr ? a.gF + tk.mat(cube) : nullptr;   // ∂L/∂(the segment's last F)
  S gS = 0;                                                          // ∂L/∂||F||² after the step
  int fold_index = 0;
  for (size_t k = 0; k < s.seg_kind.size(); ++k) fold_index += s.seg_kind[k] == 2;
  for (int k = static_cast<int>(s.seg_start.size()) - 1; k >= 0; --k) {
    const int s0 = s.seg_start[k];
    const int s1 = k + 1 < static_cast<int>(s.seg_start.size()) ? s.seg_start[k + 1] : T;
    const int kind = s.seg_kind[k], len = s1 - s0;
    const S* base = nullptr;
    S* gbase = nullptr;
    if (kind == 0) {
      base = all_zero(F0, cube) ? nullptr : F0;
      if (gF0 != nullptr) gbase = (gEnd == s.gbase0.data()) ? s.gbase1.data() : s.gbase0.data();
    } else if (kind == 2) {
      --fold_index;
      base = a.bases + (static_cast<size_t>(bh) * max_folds + fold_index) * cube;
      gbase = (gEnd == s.gbase0.data()) ? s.gbase1.data() : s.gbase0.data();
    }
    if (gbase != nullptr) zero_n(gbase, cube);
    // the segment's terms, in both layouts
    for (int j = 0; j < len; ++j) {
      const int t = s0 + j;
      prefetch_step<S, 1>(tk, T, t + kPrefetchSteps, wsize, {a.w});
      const FwmSaved<const S> sv(a.saved + (static_cast<size_t>(bh) * T + t) * A, m, nr);
      S* k1 = bt.K1 + static_cast<size_t>(j) * m;
      S* k2 = bt.K2 + static_cast<size_t>(j) * m;
      vtanh_n<S, M>(a.w + tk.vec(t, wsize), k1, m);       // FWM Eq. 1
      vtanh_n<S, M>(a.w + tk.vec(t, wsize) + m, k2, m);
      copy_n(sv.z, m, bt.Z + static_cast<size_t>(j) * m);
      for (int i = 0; i < m; ++i) {
        bt.K1T[static_cast<size_t>(i) * stride + j] = k1[i];
        bt.K2T[static_cast<size_t>(i) * stride + j] = k2[i];
        bt.ZT[static_cast<size_t>(i) * stride + j] = sv.z[i];
      }
      bt.invC[j] = S(1) / sv.norm[1];
    }
    zero_n(bt.gK1, static_cast<size_t>(len) * m);
    zero_n(bt.gK2, static_cast<size_t>(len) * m);
    zero_n(bt.gZ, static_cast<size_t>(len) * m);
    zero_n(bt.A, static_cast<size_t>(stride));
    S AD = 0;
    // the dense tensor the segment ends in: F = qD base + Σ_j q_j k1_j ⊗ k2_j ⊗ z_j
    if (gEnd != nullptr) {
      const S qD = scales(bt.invC, len, bt.qcur);
      for (int j = 0; j < len; ++j) {
        const S* zj = bt.Z + static_cast<size_t>(j) * m;
        dense_lookup<S, M>(gEnd, bt.K1 + static_cast<size_t>(j) * m, bt.K2 + static_cast<size_t>(j) * m,
                           m, u, zj, bt.qcur[j], bt.gK1 + static_cast<size_t>(j) * m,
                           bt.gK2 + static_cast<size_t>(j) * m);
        axpy(bt.qcur[j], u, bt.gZ + static_cast<size_t>(j) * m, m);
        bt.A[j] += bt.qcur[j] * dot(u, zj, m);
      }
      if (gbase != nullptr) axpy(qD, gEnd, gbase, cube);
      if (base != nullptr) AD += qD * dot(gEnd, base, cube);
    }
    for (int t = s1 - 1; t >= s0; --t) {
      const int Lt = t - s0 + 1;   // terms of F_t
      const int ahead = t - kPrefetchSteps;   // the steps' vectors are pages apart: fetch ahead
      prefetch_step<S, 2>(tk, T, ahead, wsize, {a.w, a.gw});
      prefetch_step<S, 2>(tk, T, ahead, rsize, {a.r, a.gr});
      prefetch_step<S, 1>(tk, T, ahead, m, {a.gy});
      const FwmSaved<const S> sv(a.saved + (static_cast<size_t>(bh) * T + t) * A, m, nr);
      const size_t o = tk.vec(t, m);
      const S* w = a.w + tk.vec(t, wsize);
      S* gw = a.gw + tk.vec(t, wsize);   // [gk1 | gk2 | gv | gβ] until the activations' factor
      S* gr = a.gr + tk.vec(t, rsize);   // [gn0 | ge_1 .. ge_nr] likewise
      const S beta = activate<S, M>(w, a.r + tk.vec(t, rsize), m, nr, act);
      const S qDcur = scales(bt.invC, Lt, bt.qcur);
      // F_{t-1}'s scales: before step t's rescaling (one factor, so no underflow to undo)
      const S Ct = sv.norm[1];
      for (int j = 0; j < Lt - 1; j += kLanes<S>) vstore(bt.qprev + j, vload(bt.qcur + j) * Ct);
      const S qDprev = Lt > 1 ? bt.qprev[0] : S(1);
      // FWM Eq. 7 backwards: n_i = LN(r_i), r_i = F_t vec(n_{i-1} ⊗ e_i)
      copy_n(a.gy + o, m, gn);
      for (int i = nr - 1; i >= 0; --i) {
        layer_norm_backward<S, M>(sv.nhat + static_cast<size_t>(i) * m, sv.rstd[i], gn, m, gr);
        const S* nin = i == 0 ? act + 3 * m : sv.nhat + static_cast<size_t>(i - 1) * m;
        const S* ei = act + static_cast<size_t>(4 + i) * m;
        S* gei = gr + static_cast<size_t>(1 + i) * m;
        zero_n(gnin, m);
        zero_n(gei, m);
        lookup_backward<S, M>(bt, bt.qcur, qDcur, Lt, base, gbase, nin, ei, gr, m, gnin, gei, AD, u);
        copy_n(gnin, m, gn);
      }
      copy_n(gn, m, gr);
      // FWM Eq. 4: every scale of F_t divided by C_t = max(1, ||F'_t||)
      const S sumA = AD + sum_terms(bt.A, Lt);
      const S sq = sv.norm[0], C = Ct;
      // ∂L/∂||F'||²: through ln C = ln ||F'|| when clamped (then ||F_t||² = 1, a constant)
      const S gsq = C > S(1) ? -sumA / (S(2) * sq) : gS;
      // ||F'||² = ||F||² + 2 <z, v_old> + |k1|² |k2|² |z|²
      const S* k1 = act;
      const S* k2 = act + m;
      const S* v = act + 2 * m;
      const S k11 = dot(k1, k1, m), k22 = dot(k2, k2, m), zz = dot(sv.z, sv.z, m);
      copy_n(bt.gZ + static_cast<size_t>(Lt - 1) * m, m, gz);    // term t's own adjoints
      copy_n(bt.gK1 + static_cast<size_t>(Lt - 1) * m, m, gk1);
      copy_n(bt.gK2 + static_cast<size_t>(Lt - 1) * m, m, gk2);
      for (int i = 0; i < m; ++i) {
        gz[i] += S(2) * gsq * (sv.vold[i] + k11 * k22 * sv.z[i]);
        gvold[i] = S(2) * gsq * sv.z[i];
        gk1[i] += S(2) * gsq * k22 * zz * k1[i];
        gk2[i] += S(2) * gsq * k11 * zz * k2[i];
      }
      gS = gsq;
      // FWM Eq. 3: z = β (v - v_old)
      S gbeta = 0;
      for (int i = 0; i < m; ++i) {
        gbeta += gz[i] * (v[i] - sv.vold[i]);
        gw[2 * m + i] = beta * gz[i];
        gvold[i] -= beta * gz[i];
      }
      gw[3 * m] = gbeta;
      // v_old = F_{t-1} vec(k1 ⊗ k2) (FWM §3.1.1), F_{t-1} = the first Lt - 1 terms
      lookup_backward<S, M>(bt, bt.qprev, qDprev, Lt - 1, base, gbase, k1, k2, gvold, m, gk1, gk2,
                            AD, u);
      copy_n(gk1, m, gw);
      copy_n(gk2, m, gw + m);
      // through the activations: tanh' = 1 - tanh² (FWM Eq. 1, 5, 6), σ' = σ (1 - σ) (Eq. 2)
      for (int i = 0; i < 3 * m; ++i) gw[i] *= S(1) - act[i] * act[i];
      gw[3 * m] *= beta * (S(1) - beta);
      for (int i = 0; i < rsize; ++i) gr[i] *= S(1) - act[3 * m + i] * act[3 * m + i];
    }
    // the segment's start: what F was before its first step
    if (kind == 1) {          // a reset: no gradient crosses it
      gS = 0;
      gEnd = nullptr;
    } else if (kind == 2) {   // a fold: the previous segment ends in this base; ||F||² goes on
      gEnd = gbase;
    } else if (gF0 != nullptr) {   // F0, with ||F0||² the first ||F||²
      if (gbase != nullptr) copy_n(gbase, cube, gF0);
      for (size_t i = 0; i < cube; ++i) gF0[i] += S(2) * gS * F0[i];
    }
  }
  if (gF0 != nullptr && s.seg_kind[0] == 1) zero_n(gF0, cube);   // reset at t = 0
}

}  // namespace cpu
}  // namespace rfwp
