// CPU Fast Weight Memory (Schlag, Munkhdalai, Schmidhuber, ICLR 2021, "Learning Associative
// Inference Using Fast Weight Memory"; "FWM" below): the activations of FWM Eq. 1-2 and 5-6, the
// write of Eq. 3-4 and the N_r chained reads of Eq. 7. No torch.
//
// Representation. The fast tensor F [m][m][m] (first key, second key, value) of a task is a
// dense base D plus the low-rank tail of the writes made since the base:
//     F = qD D + Σ_{j<L} q_j (k1_j ⊗ k2_j ⊗ z_j),
// z_j = β_j (v_j - v_old_j) the increment of the write of step j (FWM Eq. 3), q_j (qD) the
// product of the FWM Eq. 4 rescalings since term j (since the base). A lookup of F is a sum
// over the tail, F vec(x ⊗ y) = qD D vec(x ⊗ y) + Σ_j q_j <k1_j, x> <k2_j, y> z_j (fast weights
// and their factors are dual, Secretly-FWP Sec. 2): O(L m) instead of O(m³), and ||F'||² has a
// scalar recurrence, so a step touches no dense tensor unless there is a base. The base is the
// initial state (skipped when it is zero, as in every meta-RL episode) or the fold of a tail
// that reached `fold` terms into a dense tensor (kept for the backward like a checkpoint; it
// bounds the tail, and so the cost of a step, on long sequences).
//
// Lanes. A vector register holds one number of each of W tasks (W = the vector lanes: 16
// floats or 8 doubles with AVX-512): a group of W consecutive (b, h) tasks runs as one, every
// quantity of the formulas below a vector of W values ("lane vector"; an array of n of them is
// [n][W]). The m-dimensional dot products and layer norms are then vertical arithmetic (no
// horizontal sums) and W independent tasks hide every latency. The tails of a group are
// aligned: term j of every lane is step (fold start + j). A reset of lane l before step t
// multiplies its q_j (j < t), qD and ||F||² by 0 (its old terms and base vanish from every
// lookup); folds happen at the same steps for all lanes (every `fold` steps).
//
// Forward of step t, `group_step` (after the fold and the resets of step t):
//   [k1, k2, v] = tanh(w), β = σ(w), n0, e_i = tanh(r)         FWM Eq. 1-2, 5-6
//   v_old = F_{t-1} vec(k1 ⊗ k2)                              FWM §3.1.1
//   z = β (v - v_old);  F' = F_{t-1} + vec(k1 ⊗ k2) ⊗ z        FWM Eq. 3 (a new tail term)
//   ||F'||² = ||F||² + 2 <z, v_old> + |k1|² |k2|² |z|²         (<F, vec(k1 ⊗ k2) ⊗ z> = <z, v_old>)
//   C = max(1, ||F'||);  F_t = F' / C  (every q_j and qD / C)  FWM Eq. 4
//   n_i = LN(F_t vec(n_{i-1} ⊗ e_i)), i = 1..N_r;  y = n_{N_r} FWM Eq. 7 (LN without affine map)
// The forward saves z, v_old, the normalised reads, their 1/std, ||F'||² and C of every step
// (O(N_r m) per step), so the backward recomputes nothing but the activations and dot products.
//
// Backward: reverse mode through these formulas, one fold segment at a time, last to first,
// with adjoints of every tail term (gk1_j, gk2_j, gz_j) and of ||F||². A rescaling enters
// through ∂L/∂ln C_t = -(Σ_{j<=t} A_j + A_D), where A_j collects (∂L/∂q_j) q_j over the uses of
// term j's scale at steps >= t; the scales q_j at step t are rebuilt from the saved C (and the
// reset masks) as products over steps j..t, never by undoing a rescaling. The gradient of a
// dense tensor that a segment ends in (the final state, or the next segment's base) is looked
// up term by term (O(m³) per term).
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

template <typename S>
using Vec = typename VecType<S>::type;
template <typename S>
constexpr int kLanes = VecType<S>::lanes;

template <int M>
RFWP_INLINE int msize(int m) { return M > 0 ? M : m; }

// lane vector i of the array p ([n][W])
template <typename S>
RFWP_INLINE Vec<S> ld(const S* p, size_t i) {
  return *reinterpret_cast<const typename VecType<S>::unaligned*>(p + i * kLanes<S>);
}
template <typename S>
RFWP_INLINE void st(S* p, size_t i, Vec<S> v) {
  *reinterpret_cast<typename VecType<S>::unaligned*>(p + i * kLanes<S>) = v;
}
template <typename S>
RFWP_INLINE Vec<S> splat(S a) { return Vec<S>{} + a; }

// Σ_i x[i] y[i] over m lane vectors, four chains.
template <typename S, int M>
RFWP_INLINE Vec<S> ldot(const S* x, const S* y, int m_) {
  const int m = msize<M>(m_);
  Vec<S> a0{}, a1{}, a2{}, a3{};
  int i = 0;
  for (; i + 3 < m; i += 4) {
    a0 += ld(x, i) * ld(y, i);
    a1 += ld(x, i + 1) * ld(y, i + 1);
    a2 += ld(x, i + 2) * ld(y, i + 2);
    a3 += ld(x, i + 3) * ld(y, i + 3);
  }
  for (; i < m; ++i) a0 += ld(x, i) * ld(y, i);
  return (a0 + a1) + (a2 + a3);
}

// y[i] += c x[i] over m lane vectors
template <typename S, int M>
RFWP_INLINE void laxpy(Vec<S> c, const S* x, S* y, int m_) {
  const int m = msize<M>(m_);
  for (int i = 0; i < m; ++i) st(y, i, ld(y, i) + c * ld(x, i));
}

// out[j] = <X_j, x> for j < L (X [L][m] lanes). M > 0: x stays in registers, only the term
// rows are loaded (a lookup is bound by its loads otherwise).
template <typename S, int M>
RFWP_INLINE void term_dots(const S* X, const S* x, int L, int m_, S* out) {
  constexpr int W = kLanes<S>;
  if constexpr (M > 0 && M % 4 == 0) {
    Vec<S> xr[M];
    for (int i = 0; i < M; ++i) xr[i] = ld(x, i);
    for (int j = 0; j < L; ++j) {
      const S* Xj = X + static_cast<size_t>(j) * M * W;
      Vec<S> a0{}, a1{}, a2{}, a3{};
      for (int i = 0; i < M; i += 4) {
        a0 += ld(Xj, i) * xr[i];
        a1 += ld(Xj, i + 1) * xr[i + 1];
        a2 += ld(Xj, i + 2) * xr[i + 2];
        a3 += ld(Xj, i + 3) * xr[i + 3];
      }
      st(out, j, (a0 + a1) + (a2 + a3));
    }
  } else {
    const int m = msize<M>(m_);
    for (int j = 0; j < L; ++j) st(out, j, ldot<S, M>(X + static_cast<size_t>(j) * m * W, x, m));
  }
}

// Y_j += c_j x for j < L (Y [L][m] lanes); M > 0: x in registers.
template <typename S, int M>
RFWP_INLINE void add_to_terms(S* Y, const S* c, const S* x, int L, int m_) {
  constexpr int W = kLanes<S>;
  if constexpr (M > 0) {
    Vec<S> xr[M];
    for (int i = 0; i < M; ++i) xr[i] = ld(x, i);
    for (int j = 0; j < L; ++j) {
      S* Yj = Y + static_cast<size_t>(j) * M * W;
      const Vec<S> cj = ld(c, j);
      for (int i = 0; i < M; ++i) st(Yj, i, ld(Yj, i) + cj * xr[i]);
    }
  } else {
    const int m = msize<M>(m_);
    for (int j = 0; j < L; ++j) laxpy<S, M>(ld(c, j), x, Y + static_cast<size_t>(j) * m * W, m);
  }
}

// out += Σ_{j<L} c_j X_j (lanes: X [L][m]); M > 0: the sum in registers.
template <typename S, int M>
RFWP_INLINE void add_terms(const S* X, const S* c, int L, int m_, S* out) {
  constexpr int W = kLanes<S>;
  const int m = msize<M>(m_);
  if constexpr (M > 0) {
    Vec<S> acc[M];
    for (int i = 0; i < M; ++i) acc[i] = ld(out, i);
    for (int j = 0; j < L; ++j) {
      const Vec<S> cj = ld(c, j);
      const S* x = X + static_cast<size_t>(j) * M * W;
      for (int i = 0; i < M; ++i) acc[i] += cj * ld(x, i);
    }
    for (int i = 0; i < M; ++i) st(out, i, acc[i]);
  } else {
    for (int j = 0; j < L; ++j) laxpy<S, M>(ld(c, j), X + static_cast<size_t>(j) * m * W, out, m);
  }
}

// What one step keeps for the backward: [A][W], A = fwm_saved_size(m, nr) lane vectors:
// z, v_old [m]; the normalised reads n_1..n_Nr [nr][m]; their 1/std [nr]; ||F'||², C.
template <typename P>
struct FwmSaved {
  P *z, *vold, *nhat, *rstd, *norm;
  FwmSaved(P* p, int m, int nr, int W)
      : z(p), vold(p + static_cast<size_t>(m) * W), nhat(p + 2 * static_cast<size_t>(m) * W),
        rstd(p + static_cast<size_t>(2 + nr) * m * W), norm(rstd + static_cast<size_t>(nr) * W) {}
};

// ------------------------------------------------------------------------ rows <-> lanes

// dst [n][W] (lanes) from `rows` consecutive rows of n scalars at src (lanes beyond: 0).
template <typename S>
inline void rows_to_lanes(const S* src, int rows, int n, S* dst, S* pad) {
  constexpr int W = kLanes<S>;
  if (rows == W) {
    transpose(src, W, n, dst);
    return;
  }
  zero_n(pad, static_cast<size_t>(W) * n);
  copy_n(src, static_cast<size_t>(rows) * n, pad);
  transpose(pad, W, n, dst);
}
// `rows` consecutive rows of n scalars at dst from src [n][W] (lanes).
template <typename S>
inline void lanes_to_rows(const S* src, int rows, int n, S* dst, S* pad) {
  constexpr int W = kLanes<S>;
  if (rows == W) {
    transpose(src, n, W, dst);
    return;
  }
  transpose(src, n, W, pad);
  copy_n(pad, static_cast<size_t>(rows) * n, dst);
}

// tanh of the activations. float: from one exp, tanh|x| = (1 - e^{-2|x|}) / (1 + e^{-2|x|})
// (absolute error about 1e-7, the inputs' own rounding; half the work of vtanh, which also
// evaluates a Taylor branch for a few-ulp relative error near 0). double, the precision the
// kernels are checked in: vtanh.
template <typename S>
RFWP_INLINE S act_tanh(S x) {
  if constexpr (std::is_same_v<S, float>) {
    const S a = x < S(0) ? -x : x;
    const S t = vexp(S(-2) * a);
    const S r = (S(1) - t) / (S(1) + t);
    return x < S(0) ? -r : r;
  } else {
    return vtanh(x);
  }
}
template <typename S>
inline void act_tanh_n(const S* __restrict__ x, S* __restrict__ out, int n) {
#pragma omp simd
  for (int j = 0; j < n; ++j) out[j] = act_tanh(x[j]);
}

// The activated inputs of one step from the slow projections, in lanes: act = [k1 | k2 | v |
// n0 | e_1 .. e_nr] ([m] lane vectors each, through tanh: FWM Eq. 1, 5, 6) and beta [W]
// (through the sigmoid: FWM Eq. 2). wl [3m + 1][W], rl [(1 + nr) m][W].
template <typename S, int M>
RFWP_INLINE void activate(const S* wl, const S* rl, int m_, int nr, S* act, S* beta) {
  constexpr int W = kLanes<S>;
  const int m = msize<M>(m_);
  act_tanh_n<S>(wl, act, 3 * m * W);
  act_tanh_n<S>(rl, act + static_cast<size_t>(3) * m * W, (1 + nr) * m * W);
  const S* wb = wl + static_cast<size_t>(3) * m * W;
#pragma omp simd
  for (int l = 0; l < W; ++l) beta[l] = vsigmoid(wb[l]);
}

// --------------------------------------------------------------------- dense [m][m][m] tensors

// u = X vec(x ⊗ y), i.e. u[c] = Σ_{a,b} x_a y_b X[a][b][c] (lanes). With g (not null) also
// the gradients of that lookup with cotangent g, scaled by s: gx[a] += s Σ_b y_b <X[a][b], g>,
// gy[b] += s Σ_a x_a <X[a][b], g>.
template <typename S, int M>
void dense_lookup(const S* X, const S* x, const S* y, int m_, S* u, const S* g = nullptr,
                  const S* s = nullptr, S* gx = nullptr, S* gy = nullptr) {
  const int m = msize<M>(m_);
  for (int c = 0; c < m; ++c) st(u, c, Vec<S>{});
  for (int a = 0; a < m; ++a) {
    Vec<S> gxa{};
    for (int b = 0; b < m; ++b) {
      const S* row = X + (static_cast<size_t>(a) * m + b) * m * kLanes<S>;
      laxpy<S, M>(ld(x, a) * ld(y, b), row, u, m);
      if (g != nullptr) {
        const Vec<S> d = ldot<S, M>(row, g, m);
        gxa += ld(y, b) * d;
        st(gy, b, ld(gy, b) + ld(s, 0) * ld(x, a) * d);
      }
    }
    if (g != nullptr) st(gx, a, ld(gx, a) + ld(s, 0) * gxa);
  }
}

// X += s x ⊗ y ⊗ g (lanes)
template <typename S, int M>
void dense_add_outer(S* X, Vec<S> s, const S* x, const S* y, const S* g, int m_) {
  const int m = msize<M>(m_);
  for (int a = 0; a < m; ++a)
    for (int b = 0; b < m; ++b)
      laxpy<S, M>(s * ld(x, a) * ld(y, b), g, X + (static_cast<size_t>(a) * m + b) * m * kLanes<S>, m);
}

// ----------------------------------------------------------------- the forward of one group

// The tails of the W tasks of a group (see the top of this file), lane layout.
template <typename S>
struct LaneTail {
  S *K1, *K2, *Z;   // [cap][m] lane vectors: term j's k1, k2, z
  S* q;             // [cap]
  S* qD;            // [1]: the base's scale
  S* norm2;         // [1]: ||F||²
  const S* base;    // [m³] lane vectors or null (a zero base)
  int L, cap;
};

// r = F vec(x ⊗ y) with the first L terms at scales q ([L] lane vectors) and the base at qD.
// coef: scratch of 2 cap lane vectors.
template <typename S, int M>
RFWP_INLINE void tail_lookup(const LaneTail<S>& tl, const S* q, Vec<S> qD, int L, const S* x,
                             const S* y, int m_, S* r, S* tmp, S* coef) {
  const int m = msize<M>(m_);
  S* a = coef;
  S* b = coef + static_cast<size_t>(tl.cap) * kLanes<S>;
  term_dots<S, M>(tl.K1, x, L, m, a);   // <k1_j, x>
  term_dots<S, M>(tl.K2, y, L, m, b);   // <k2_j, y>
  for (int j = 0; j < L; ++j) st(a, j, ld(q, j) * ld(a, j) * ld(b, j));
  for (int c = 0; c < m; ++c) st(r, c, Vec<S>{});
  add_terms<S, M>(tl.Z, a, L, m, r);
  if (tl.base != nullptr) {
    dense_lookup<S, M>(tl.base, x, y, m, tmp);
    laxpy<S, M>(qD, tmp, r, m);
  }
}

// dst = F, dense (lanes [m³]). dst may be tl.base: each (a, b) row is read before it is written.
// pa: scratch of `cap` lane vectors.
template <typename S, int M>
void materialize(const LaneTail<S>& tl, int m_, S* dst, S* pa) {
  constexpr int W = kLanes<S>;
  const int m = msize<M>(m_);
  const size_t mw = static_cast<size_t>(m) * W;
  const Vec<S> qD = ld(tl.qD, 0);
  for (int a = 0; a < m; ++a) {
    for (int j = 0; j < tl.L; ++j) st(pa, j, ld(tl.q, j) * ld(tl.K1 + j * mw, a));
    for (int b = 0; b < m; ++b) {
      S* out = dst + (static_cast<size_t>(a) * m + b) * mw;
      const S* in = tl.base != nullptr ? tl.base + (static_cast<size_t>(a) * m + b) * mw : nullptr;
      if constexpr (M > 0) {   // the row's M lane vectors stay in registers over the terms
        Vec<S> acc[M];
        for (int c = 0; c < M; ++c) acc[c] = in != nullptr ? qD * ld(in, c) : Vec<S>{};
        for (int j = 0; j < tl.L; ++j) {
          const Vec<S> coef = ld(pa, j) * ld(tl.K2 + j * mw, b);
          const S* zj = tl.Z + j * mw;
          for (int c = 0; c < M; ++c) acc[c] += coef * ld(zj, c);
        }
        for (int c = 0; c < M; ++c) st(out, c, acc[c]);
      } else {
        for (int c = 0; c < m; ++c) st(out, c, in != nullptr ? qD * ld(in, c) : Vec<S>{});
        for (int j = 0; j < tl.L; ++j) laxpy<S, M>(ld(pa, j) * ld(tl.K2 + j * mw, b), tl.Z + j * mw, out, m);
      }
    }
  }
}

// out = LN(r) without affine map (lanes [m]); returns 1 / std.
template <typename S, int M>
RFWP_INLINE Vec<S> layer_norm(const S* r, int m_, S* out) {
  constexpr int W = kLanes<S>;
  const int m = msize<M>(m_);
  Vec<S> mean{};
  for (int c = 0; c < m; ++c) mean += ld(r, c);
  mean *= S(1) / m;
  Vec<S> var{};
  for (int c = 0; c < m; ++c) var += (ld(r, c) - mean) * (ld(r, c) - mean);
  var = var * (S(1) / m) + S(kFwmLnEps);
  Vec<S> rstd;
  for (int l = 0; l < W; ++l) rstd[l] = S(1) / std::sqrt(var[l]);
  for (int c = 0; c < m; ++c) st(out, c, (ld(r, c) - mean) * rstd);
  return rstd;
}

// gr = ∂L/∂r of n = LN(r) given gn = ∂L/∂n: rstd (gn - mean(gn) - n mean(gn ⊙ n)) (lanes).
template <typename S, int M>
RFWP_INLINE void layer_norm_backward(const S* nhat, Vec<S> rstd, const S* gn, int m_, S* gr) {
  const int m = msize<M>(m_);
  Vec<S> mg{}, mgn{};
  for (int c = 0; c < m; ++c) {
    mg += ld(gn, c);
    mgn += ld(gn, c) * ld(nhat, c);
  }
  mg *= S(1) / m;
  mgn *= S(1) / m;
  for (int c = 0; c < m; ++c) st(gr, c, rstd * (ld(gn, c) - mg - ld(nhat, c) * mgn));
}

// Scratch of group_step, in lane vectors: v_old, z, r, a lookup's base part, a read's output,
// then a lookup's coefficients (2 cap).
inline size_t step_work_size(int m, int cap) { return 5 * static_cast<size_t>(m) + 2 * static_cast<size_t>(cap); }

// One step of a group on tl (after the caller's fold): the resets (keep: [W], 0 where the task
// resets before this step; null: none), the write, then the N_r chained reads. act, beta: the
// activated inputs (activate). y [m] lanes. saved ([A] lanes, nullable) receives FwmSaved.
// The caller ensures tl.L < tl.cap.
template <typename S, int M>
void group_step(LaneTail<S>& tl, const S* keep, const S* act, const S* beta, int m_, int nr,
                S* y, S* saved, S* work) {
  constexpr int W = kLanes<S>;
  const int m = msize<M>(m_), L = tl.L;
  const size_t mw = static_cast<size_t>(m) * W;
  const S *k1 = act, *k2 = act + mw, *v = act + 2 * mw, *n0 = act + 3 * mw, *e = act + 4 * mw;
  S* vold = work;
  S* z = vold + mw;
  S* r = z + mw;
  S* tmp = r + mw;
  S* nbuf = tmp + mw;
  S* coef = nbuf + mw;
  if (keep != nullptr) {   // a reset empties its lane: old terms, base and norm vanish
    const Vec<S> kp = ld(keep, 0);
    for (int j = 0; j < L; ++j) st(tl.q, j, ld(tl.q, j) * kp);
    st(tl.qD, 0, ld(tl.qD, 0) * kp);
    st(tl.norm2, 0, ld(tl.norm2, 0) * kp);
  }
  // v_old = F_{t-1} vec(k1 ⊗ k2): the value now associated with k1 ⊗ k2 (FWM §3.1.1)
  tail_lookup<S, M>(tl, tl.q, ld(tl.qD, 0), L, k1, k2, m, vold, tmp, coef);
  // FWM Eq. 3: F' = F_{t-1} + β vec(k1 ⊗ k2) ⊗ (v - v_old), the new tail term (k1, k2, z)
  const Vec<S> b = ld(beta, 0);
  for (int c = 0; c < m; ++c) st(z, c, b * (ld(v, c) - ld(vold, c)));
  // ||F'||² = ||F||² + 2 <F, vec(k1 ⊗ k2) ⊗ z> + |vec(k1 ⊗ k2) ⊗ z|², and
  // <F, vec(k1 ⊗ k2) ⊗ z> = <z, F vec(k1 ⊗ k2)> = <z, v_old>
  const Vec<S> sq = ld(tl.norm2, 0) + S(2) * ldot<S, M>(z, vold, m) +
                    ldot<S, M>(k1, k1, m) * ldot<S, M>(k2, k2, m) * ldot<S, M>(z, z, m);
  // FWM Eq. 4: F_t = F' / max(1, ||F'||)
  Vec<S> C, inv, norm2;
  for (int l = 0; l < W; ++l) {
    C[l] = sq[l] > S(1) ? std::sqrt(sq[l]) : S(1);
    inv[l] = S(1) / C[l];
    norm2[l] = sq[l] > S(1) ? S(1) : sq[l];
  }
  copy_n(k1, mw, tl.K1 + L * mw);
  copy_n(k2, mw, tl.K2 + L * mw);
  copy_n(z, mw, tl.Z + L * mw);
  st(tl.q, L, splat<S>(1));
  tl.L = L + 1;
  for (int j = 0; j <= L; ++j) st(tl.q, j, ld(tl.q, j) * inv);
  st(tl.qD, 0, ld(tl.qD, 0) * inv);
  st(tl.norm2, 0, norm2);
  // FWM Eq. 7: n_i = LN(F_t vec(n_{i-1} ⊗ e_i)), i = 1..N_r (F_t includes this step's write)
  const FwmSaved<S> sv(saved, m, nr, W);
  const S* n = n0;
  for (int i = 0; i < nr; ++i) {
    tail_lookup<S, M>(tl, tl.q, ld(tl.qD, 0), L + 1, n, e + i * mw, m, r, tmp, coef);
    S* out = saved != nullptr ? sv.nhat + i * mw : nbuf;
    const Vec<S> rstd = layer_norm<S, M>(r, m, out);
    if (saved != nullptr) st(sv.rstd, i, rstd);
    n = out;
  }
  copy_n(n, mw, y);
  if (saved != nullptr) {
    copy_n(z, mw, sv.z);
    copy_n(vold, mw, sv.vold);
    st(sv.norm, 0, sq);
    st(sv.norm, 1, C);
  }
}

// The rows of one step of a group in the [T, B, H, n] inputs and outputs: tasks g W .. are
// consecutive rows.
template <typename S>
RFWP_INLINE size_t group_rows(int T_index, int BH, int g, int n) {
  return (static_cast<size_t>(T_index) * BH + static_cast<size_t>(g) * kLanes<S>) * n;
}

template <typename S>
RFWP_INLINE void prefetch_rows(const S* p, int rows, int n) {
  prefetch_vec(p, rows * n);
}

// Lane masks of the resets of step t (0: the task resets): true when any lane of the group resets.
template <typename S>
RFWP_INLINE bool group_keep(const uint8_t* reset, int t, int B, int H, int g, int lanes, S* keep) {
  constexpr int W = kLanes<S>;
  bool any = false;
  for (int l = 0; l < W; ++l) {
    const int bh = g * W + l;
    const bool r = reset != nullptr && l < lanes && reset[static_cast<size_t>(t) * B + bh / H] != 0;
    keep[l] = r ? S(0) : S(1);
    any |= r;
  }
  return any;
}

inline size_t act_size(int m, int nr) { return static_cast<size_t>(4 + nr) * m; }

template <typename S>
struct FwmForwardScratch {
  AlignedVector<S> tail, q, scal, act, raw, pad, work, base0, foldbase, y;
};

// The dense F0 of a group in lanes (base0 [m³] lanes) and its ||F0||² per lane; false when it
// is zero in every lane (then nothing is written but norm2 = 0).
template <typename S>
bool load_base(const S* F0, int lanes, size_t cube, S* base0, S* norm2, S* pad) {
  constexpr int W = kLanes<S>;
  bool any = false;
  for (int l = 0; l < W; ++l) {
    S s = 0;
    if (l < lanes) {
      const S* f = F0 + l * cube;
#pragma omp simd reduction(+ : s)
      for (size_t i = 0; i < cube; ++i) s += f[i] * f[i];
    }
    norm2[l] = s;
    any |= s != S(0);
  }
  if (any) rows_to_lanes(F0, lanes, static_cast<int>(cube), base0, pad);
  return any;
}

template <typename S, int M>
void fwm_forward_group(const FwmFwdArgs<S>& a, int g, FwmForwardScratch<S>& s) {
  constexpr int W = kLanes<S>;
  const Dims& n = a.n;
  const int m = msize<M>(n.dv), nr = a.nr, T = n.T, BH = n.B * n.H;
  const int lanes = std::min(W, BH - g * W);
  const int cap = std::max(1, std::min(T, a.fold));
  const size_t mw = static_cast<size_t>(m) * W, cube = static_cast<size_t>(m) * m * m;
  const int wsize = 3 * m + 1, rsize = (1 + nr) * m;
  const size_t A = fwm_saved_size(m, nr);
  const int max_folds = fwm_max_folds(T, a.fold);
  s.tail.resize(3 * cap * mw);
  s.q.resize(static_cast<size_t>(cap) * W);
  s.scal.resize(3 * W);
  s.act.resize(act_size(m, nr) * W + W);
  s.raw.resize(static_cast<size_t>(wsize + rsize) * W);
  s.pad.resize(static_cast<size_t>(std::max<size_t>(cube, wsize + rsize)) * W);
  s.work.resize(step_work_size(m, cap) * W + static_cast<size_t>(cap) * W);
  s.y.resize(mw);
  S* qD = s.scal.data();
  S* norm2 = qD + W;
  S* keep = norm2 + W;
  S* act = s.act.data();
  S* beta = act + act_size(m, nr) * W;
  S* wl = s.raw.data();
  S* rl = wl + static_cast<size_t>(wsize) * W;
  LaneTail<S> tl{s.tail.data(), s.tail.data() + cap * mw, s.tail.data() + 2 * cap * mw, s.q.data(),
                 qD, norm2, nullptr, 0, cap};
  for (int l = 0; l < W; ++l) qD[l] = S(1);
  s.base0.resize(cube * W);
  if (load_base(a.F0 + static_cast<size_t>(g) * W * cube, lanes, cube, s.base0.data(), norm2, s.pad.data()))
    tl.base = s.base0.data();
  int folds = 0;
  for (int t = 0; t < T; ++t) {
    if (t + kPrefetchSteps < T) {   // a group's steps are B*H rows apart: fetch ahead
      prefetch_rows(a.w + group_rows<S>(t + kPrefetchSteps, BH, g, wsize), lanes, wsize);
      prefetch_rows(a.r + group_rows<S>(t + kPrefetchSteps, BH, g, rsize), lanes, rsize);
    }
    if (tl.L == a.fold) {   // fold the tail into a dense base (before this step's resets)
      S* dst;
      if (a.bases != nullptr) {
        dst = a.bases + (static_cast<size_t>(g) * max_folds + folds) * cube * W;
      } else {
        s.foldbase.resize(cube * W);
        dst = s.foldbase.data();
      }
      materialize<S, M>(tl, m, dst, s.work.data() + step_work_size(m, cap) * W);
      tl.base = dst;
      for (int l = 0; l < W; ++l) qD[l] = S(1);
      tl.L = 0;
      ++folds;
    }
    const bool resets = group_keep(a.reset, t, n.B, n.H, g, lanes, keep);
    rows_to_lanes(a.w + group_rows<S>(t, BH, g, wsize), lanes, wsize, wl, s.pad.data());
    rows_to_lanes(a.r + group_rows<S>(t, BH, g, rsize), lanes, rsize, rl, s.pad.data());
    activate<S, M>(wl, rl, m, nr, act, beta);
    group_step<S, M>(tl, resets ? keep : nullptr, act, beta, m, nr, s.y.data(),
                     a.saved != nullptr ? a.saved + (static_cast<size_t>(g) * T + t) * A * W : nullptr,
                     s.work.data());
    lanes_to_rows(s.y.data(), lanes, m, a.y + group_rows<S>(t, BH, g, m), s.pad.data());
  }
  s.foldbase.resize(cube * W);
  materialize<S, M>(tl, m, s.foldbase.data(), s.work.data() + step_work_size(m, cap) * W);
  lanes_to_rows(s.foldbase.data(), lanes, static_cast<int>(cube), a.F + static_cast<size_t>(g) * W * cube,
                s.pad.data());
}

// ----------------------------------------------------------------------- the incremental stepper

// Layout of the stepper state of group g (FwmStepArgs): K1, K2, Z [cap][m] lanes, q [cap] lanes,
// scal [2] lanes (||F||², qD), meta [2] (tail length, has a base), base [m³] lanes.
template <typename S>
struct StepGroup {
  LaneTail<S> tl;
  int32_t* meta;
  S* base;
  StepGroup(const FwmStepArgs<S>& a, int g, int m) {
    constexpr int W = kLanes<S>;
    const size_t mw = static_cast<size_t>(m) * W, cube = static_cast<size_t>(m) * m * m;
    const size_t terms = static_cast<size_t>(a.cap) * mw;
    meta = a.meta + 2 * static_cast<size_t>(g);
    base = a.base + static_cast<size_t>(g) * cube * W;
    S* scal = a.scal + 2 * static_cast<size_t>(g) * W;
    tl = LaneTail<S>{a.k1 + g * terms, a.k2 + g * terms, a.z + g * terms,
                     a.q + static_cast<size_t>(g) * a.cap * W, scal + W, scal,
                     meta[1] ? base : nullptr, meta[0], a.cap};
  }
};

// The state of group g from F0 [B, H, m, m, m] rows (null: zero).
template <typename S>
void fwm_step_init_group(const FwmStepArgs<S>& a, const S* F0, int g, AlignedVector<S>& pad) {
  constexpr int W = kLanes<S>;
  const int m = a.n.dv, BH = a.n.B * a.n.H, lanes = std::min(W, BH - g * W);
  const size_t cube = static_cast<size_t>(m) * m * m;
  StepGroup<S> sg(a, g, m);
  S* qD = sg.tl.qD;
  S* norm2 = sg.tl.norm2;
  for (int l = 0; l < W; ++l) {
    qD[l] = S(1);
    norm2[l] = S(0);
  }
  sg.meta[0] = 0;
  sg.meta[1] = 0;
  if (F0 != nullptr) {
    pad.resize(cube * W);
    sg.meta[1] = load_base(F0 + static_cast<size_t>(g) * W * cube, lanes, cube, sg.base, norm2, pad.data());
  }
}

template <typename S, int M>
void fwm_step_group(const FwmStepArgs<S>& a, int g, AlignedVector<S>& work) {
  constexpr int W = kLanes<S>;
  const int m = msize<M>(a.n.dv), nr = a.nr, BH = a.n.B * a.n.H;
  const int lanes = std::min(W, BH - g * W);
  const size_t mw = static_cast<size_t>(m) * W;
  const int wsize = 3 * m + 1, rsize = (1 + nr) * m;
  const size_t acts = act_size(m, nr) * W + W, raws = static_cast<size_t>(wsize + rsize) * W;
  const size_t pads = std::max<size_t>(raws, mw), steps = step_work_size(m, a.cap) * W;
  work.resize(acts + raws + pads + steps + static_cast<size_t>(a.cap) * W + mw + W);
  S* act = work.data();
  S* beta = act + act_size(m, nr) * W;
  S* wl = act + acts;
  S* rl = wl + static_cast<size_t>(wsize) * W;
  S* pad = wl + raws;
  S* sw = pad + pads;
  S* pa = sw + steps;
  S* y = pa + static_cast<size_t>(a.cap) * W;
  S* keep = y + mw;
  StepGroup<S> sg(a, g, m);
  LaneTail<S>& tl = sg.tl;
  if (tl.L == a.fold) {   // fold the tail into the base, in place
    materialize<S, M>(tl, m, sg.base, pa);
    tl.base = sg.base;
    for (int l = 0; l < W; ++l) tl.qD[l] = S(1);
    tl.L = 0;
  }
  bool resets = false;
  for (int l = 0; l < W; ++l) {
    const bool r = a.reset != nullptr && l < lanes && a.reset[(g * W + l) / a.n.H] != 0;
    keep[l] = r ? S(0) : S(1);
    resets |= r;
  }
  rows_to_lanes(a.w + static_cast<size_t>(g) * W * wsize, lanes, wsize, wl, pad);
  rows_to_lanes(a.r + static_cast<size_t>(g) * W * rsize, lanes, rsize, rl, pad);
  activate<S, M>(wl, rl, m, nr, act, beta);
  group_step<S, M>(tl, resets ? keep : nullptr, act, beta, m, nr, y,
                   a.saved != nullptr ? a.saved + static_cast<size_t>(g) * fwm_saved_size(m, nr) * W : nullptr,
                   sw);
  lanes_to_rows(y, lanes, m, a.y + static_cast<size_t>(g) * W * m, pad);
  sg.meta[0] = tl.L;
  sg.meta[1] = tl.base != nullptr;
}

// F of every task of group g into rows dst [B, H, m, m, m] (materialised).
template <typename S, int M>
void fwm_step_dense_group(const FwmStepArgs<S>& a, int g, S* dst, AlignedVector<S>& work) {
  constexpr int W = kLanes<S>;
  const int m = msize<M>(a.n.dv), BH = a.n.B * a.n.H, lanes = std::min(W, BH - g * W);
  const size_t cube = static_cast<size_t>(m) * m * m;
  work.resize(2 * cube * W + static_cast<size_t>(a.cap) * W);
  StepGroup<S> sg(a, g, m);
  materialize<S, M>(sg.tl, m, work.data(), work.data() + 2 * cube * W);
  lanes_to_rows(work.data(), lanes, static_cast<int>(cube), dst + static_cast<size_t>(g) * W * cube,
                work.data() + cube * W);
}

// ---------------------------------------------------------------- the backward of one group

template <typename S>
struct FwmBackwardScratch {
  AlignedVector<S> tail, grads, scal, act, raw, pad, vecs, base0, gbase0, gbase1, gend, keep;
};

// The tail of one segment with the adjoints of its terms (lanes).
template <typename S>
struct BackTail {
  S *K1, *K2, *Z;        // [len][m]
  S *gK1, *gK2, *gZ;     // [len][m] adjoints of the terms' k1, k2, z
  S *invC, *keep, *qcur, *qv, *A;   // [len]: 1 / C; the reset masks; scales of F_t, of F_{t-1}
                                    // after step t's resets; scale uses
  S *x1, *x2, *x3, *c1, *c2, *c3;   // [len]: a lookup's dot products and coefficients
};

// Adjoints of one lookup r = Σ_{j<L} q_j <k1_j, x> <k2_j, y> z_j + qD base vec(x ⊗ y) with
// cotangent g: into gx, gy (added), the terms' adjoints, their scale uses A_j and the base's AD;
// gbase (nullable) += qD x ⊗ y ⊗ g.
template <typename S, int M>
void lookup_backward(BackTail<S>& bt, const S* q, Vec<S> qD, int L, const S* base, S* gbase,
                     const S* x, const S* y, const S* g, int m_, S* gx, S* gy, S* AD, S* u) {
  const int m = msize<M>(m_);
  // one query vector in registers per pass over the terms
  term_dots<S, M>(bt.K1, x, L, m, bt.x1);   // <k1_j, x>
  term_dots<S, M>(bt.K2, y, L, m, bt.x2);   // <k2_j, y>
  term_dots<S, M>(bt.Z, g, L, m, bt.x3);    // <z_j, g>
  for (int j = 0; j < L; ++j) {
    const Vec<S> qj = ld(q, j), x1 = ld(bt.x1, j), x2 = ld(bt.x2, j), x3 = ld(bt.x3, j);
    const Vec<S> c1 = qj * x1 * x2;         // ∂r/∂z_j
    st(bt.c1, j, c1);
    st(bt.c2, j, qj * x2 * x3);             // ∂/∂<k1_j, x>
    st(bt.c3, j, qj * x1 * x3);             // ∂/∂<k2_j, y>
    st(bt.A, j, ld(bt.A, j) + c1 * x3);     // the use of q_j
  }
  add_to_terms<S, M>(bt.gZ, bt.c1, g, L, m);
  add_to_terms<S, M>(bt.gK1, bt.c2, x, L, m);
  add_to_terms<S, M>(bt.gK2, bt.c3, y, L, m);
  add_terms<S, M>(bt.K1, bt.c2, L, m, gx);
  add_terms<S, M>(bt.K2, bt.c3, L, m, gy);
  if (base != nullptr) {
    S qDa[kLanes<S>];
    st(qDa, 0, qD);
    dense_lookup<S, M>(base, x, y, m, u, g, qDa, gx, gy);
    st(AD, 0, ld(AD, 0) + qD * ldot<S, M>(u, g, m));
  }
  if (gbase != nullptr) dense_add_outer<S, M>(gbase, qD, x, y, g, m);
}

template <typename S, int M>
void fwm_backward_group(const FwmBwdArgs<S>& a, int g, FwmBackwardScratch<S>& s) {
  constexpr int W = kLanes<S>;
  const Dims& n = a.n;
  const int m = msize<M>(n.dv), nr = a.nr, T = n.T, BH = n.B * n.H;
  const int lanes = std::min(W, BH - g * W);
  const size_t mw = static_cast<size_t>(m) * W, cube = static_cast<size_t>(m) * m * m;
  const size_t cw = cube * W, A = fwm_saved_size(m, nr);
  const int wsize = 3 * m + 1, rsize = (1 + nr) * m;
  const int max_folds = fwm_max_folds(T, a.fold);
  S* gF0 = a.gF0 != nullptr ? a.gF0 + static_cast<size_t>(g) * W * cube : nullptr;
  s.pad.resize(std::max<size_t>(cube, wsize + rsize) * W);
  if (T == 0) {
    if (gF0 != nullptr) {
      if (a.gF != nullptr) copy_n(a.gF + static_cast<size_t>(g) * W * cube, lanes * cube, gF0);
      else zero_n(gF0, lanes * cube);
    }
    return;
  }
  const int seg = std::min(T, a.fold), nseg = (T + a.fold - 1) / a.fold;
  s.tail.resize(3 * static_cast<size_t>(seg) * mw);
  s.grads.resize(3 * static_cast<size_t>(seg) * mw);
  s.scal.resize(11 * static_cast<size_t>(seg) * W + W);
  s.act.resize(act_size(m, nr) * W + W);
  s.raw.resize(static_cast<size_t>(wsize + rsize) * W);
  s.vecs.resize(10 * mw);
  s.keep.resize(static_cast<size_t>(T) * W);
  BackTail<S> bt;
  bt.K1 = s.tail.data(); bt.K2 = bt.K1 + seg * mw; bt.Z = bt.K2 + seg * mw;
  bt.gK1 = s.grads.data(); bt.gK2 = bt.gK1 + seg * mw; bt.gZ = bt.gK2 + seg * mw;
  bt.invC = s.scal.data(); bt.keep = bt.invC + seg * W; bt.qcur = bt.keep + seg * W;
  bt.qv = bt.qcur + seg * W; bt.A = bt.qv + seg * W;
  bt.x1 = bt.A + seg * W; bt.x2 = bt.x1 + seg * W; bt.x3 = bt.x2 + seg * W;
  bt.c1 = bt.x3 + seg * W; bt.c2 = bt.c1 + seg * W; bt.c3 = bt.c2 + seg * W;
  S* AD = bt.c3 + seg * W;
  S* act = s.act.data();
  S* beta = act + act_size(m, nr) * W;
  S* wl = s.raw.data();
  S* rl = wl + static_cast<size_t>(wsize) * W;
  S* gn = s.vecs.data();
  S* gr = gn + mw;
  S* gnin = gr + mw;
  S* gz = gnin + mw;
  S* gk1 = gz + mw;
  S* gk2 = gk1 + mw;
  S* gvold = gk2 + mw;
  S* u = gvold + mw;
  S* gyl = u + mw;
  S* gwl = wl;   // the step's gradients replace its slow projections (same layout)
  S* grl = rl;
  for (int t = 0; t < T; ++t) group_keep(a.reset, t, n.B, n.H, g, lanes, s.keep.data() + t * W);
  // F0 (a zero F0 is no base) and the gradient the last segment ends in
  S norm0[kLanes<S>];
  s.base0.resize(cw);
  const bool F0_nonzero = a.F0 != nullptr && load_base(a.F0 + static_cast<size_t>(g) * W * cube, lanes,
                                                       cube, s.base0.data(), norm0, s.pad.data());
  s.gbase0.resize(cw);
  s.gbase1.resize(cw);
  const S* gEnd = nullptr;
  if (a.gF != nullptr) {
    s.gend.resize(cw);
    rows_to_lanes(a.gF + static_cast<size_t>(g) * W * cube, lanes, static_cast<int>(cube), s.gend.data(),
                  s.pad.data());
    gEnd = s.gend.data();
  }
  Vec<S> gS{};   // ∂L/∂||F||² after the step being walked
  for (int k = nseg - 1; k >= 0; --k) {
    const int s0 = k * a.fold, s1 = std::min(T, s0 + a.fold), len = s1 - s0;
    const S* base = k == 0 ? (F0_nonzero ? s.base0.data() : nullptr)
                           : a.bases + (static_cast<size_t>(g) * max_folds + (k - 1)) * cw;
    S* gbase = nullptr;
    if (k > 0 || gF0 != nullptr) {
      gbase = gEnd == s.gbase0.data() ? s.gbase1.data() : s.gbase0.data();
      zero_n(gbase, cw);
    }
    // the segment's terms: keys through tanh again, z and C saved
    for (int j = 0; j < len; ++j) {
      const int t = s0 + j;
      rows_to_lanes(a.w + group_rows<S>(t, BH, g, wsize), lanes, wsize, wl, s.pad.data());
      act_tanh_n<S>(wl, act, 2 * m * W);   // FWM Eq. 1: k1, k2
      copy_n(act, mw, bt.K1 + j * mw);
      copy_n(act + mw, mw, bt.K2 + j * mw);
      const FwmSaved<const S> sv(a.saved + (static_cast<size_t>(g) * T + t) * A * W, m, nr, W);
      copy_n(sv.z, mw, bt.Z + j * mw);
      const Vec<S> C = ld(sv.norm, 1);
      st(bt.invC, j, S(1) / C);
      st(bt.keep, j, ld(s.keep.data(), t));
    }
    zero_n(bt.gK1, static_cast<size_t>(len) * mw);
    zero_n(bt.gK2, static_cast<size_t>(len) * mw);
    zero_n(bt.gZ, static_cast<size_t>(len) * mw);
    zero_n(bt.A, static_cast<size_t>(len) * W);
    zero_n(AD, W);
    // q_j of F_t (term j <-> step s0 + j; lanes reset at a step lose the older terms)
    auto scales = [&](int Lt) {
      st(bt.qcur, Lt - 1, ld(bt.invC, Lt - 1));
      for (int j = Lt - 2; j >= 0; --j) st(bt.qcur, j, ld(bt.qcur, j + 1) * ld(bt.invC, j) * ld(bt.keep, j + 1));
      return ld(bt.qcur, 0) * ld(bt.keep, 0);   // the base: also gone after a reset at s0
    };
    if (gEnd != nullptr) {   // the dense tensor the segment ends in
      const Vec<S> qD = scales(len);
      for (int j = 0; j < len; ++j) {
        const S* Zj = bt.Z + j * mw;
        S qj[kLanes<S>];
        st(qj, 0, ld(bt.qcur, j));
        dense_lookup<S, M>(gEnd, bt.K1 + j * mw, bt.K2 + j * mw, m, u, Zj, qj, bt.gK1 + j * mw,
                           bt.gK2 + j * mw);
        laxpy<S, M>(ld(bt.qcur, j), u, bt.gZ + j * mw, m);
        st(bt.A, j, ld(bt.A, j) + ld(bt.qcur, j) * ldot<S, M>(u, Zj, m));
      }
      if (gbase != nullptr)
        for (size_t i = 0; i < cube; ++i) st(gbase, i, ld(gbase, i) + qD * ld(gEnd, i));
      if (base != nullptr) {
        Vec<S> acc{};
        for (size_t i = 0; i < cube; ++i) acc += ld(gEnd, i) * ld(base, i);
        st(AD, 0, ld(AD, 0) + qD * acc);
      }
    }
    for (int t = s1 - 1; t >= s0; --t) {
      const int Lt = t - s0 + 1;   // terms of F_t
      if (t - kPrefetchSteps >= s0) {   // the steps' rows are B*H rows apart: fetch ahead
        prefetch_rows(a.r + group_rows<S>(t - kPrefetchSteps, BH, g, rsize), lanes, rsize);
        prefetch_rows(a.gy + group_rows<S>(t - kPrefetchSteps, BH, g, m), lanes, m);
      }
      const FwmSaved<const S> sv(a.saved + (static_cast<size_t>(g) * T + t) * A * W, m, nr, W);
      const Vec<S> qDcur = scales(Lt);
      const Vec<S> C = ld(sv.norm, 1);
      // F_{t-1} after step t's resets, as v_old saw it: one rescaling less
      for (int j = 0; j < Lt - 1; ++j) st(bt.qv, j, ld(bt.qcur, j) * C);
      const Vec<S> qDv = qDcur * C;
      rows_to_lanes(a.w + group_rows<S>(t, BH, g, wsize), lanes, wsize, wl, s.pad.data());
      rows_to_lanes(a.r + group_rows<S>(t, BH, g, rsize), lanes, rsize, rl, s.pad.data());
      activate<S, M>(wl, rl, m, nr, act, beta);
      rows_to_lanes(a.gy + group_rows<S>(t, BH, g, m), lanes, m, gyl, s.pad.data());
      // FWM Eq. 7 backwards: n_i = LN(r_i), r_i = F_t vec(n_{i-1} ⊗ e_i)
      copy_n(gyl, mw, gn);
      for (int i = nr - 1; i >= 0; --i) {
        layer_norm_backward<S, M>(sv.nhat + i * mw, ld(sv.rstd, i), gn, m, gr);
        const S* nin = i == 0 ? act + 3 * mw : sv.nhat + (i - 1) * mw;
        const S* ei = act + (4 + i) * mw;
        S* gei = grl + (1 + i) * mw;
        zero_n(gnin, mw);
        zero_n(gei, mw);
        lookup_backward<S, M>(bt, bt.qcur, qDcur, Lt, base, gbase, nin, ei, gr, m, gnin, gei, AD, u);
        copy_n(gnin, mw, gn);
      }
      copy_n(gn, mw, grl);
      // FWM Eq. 4: every scale of F_t divided by C_t = max(1, ||F'_t||)
      Vec<S> sumA = ld(AD, 0);
      for (int j = 0; j < Lt; ++j) sumA += ld(bt.A, j);
      const Vec<S> sq = ld(sv.norm, 0);
      Vec<S> gsq;   // ∂L/∂||F'||²: through ln C = ln ||F'|| when clamped (||F_t||² = 1 then)
      for (int l = 0; l < W; ++l) gsq[l] = C[l] > S(1) ? -sumA[l] / (S(2) * sq[l]) : gS[l];
      // ||F'||² = keep ||F_{t-1}||² + 2 <z, v_old> + |k1|² |k2|² |z|²
      const S* k1 = act;
      const S* k2 = act + mw;
      const S* v = act + 2 * mw;
      const Vec<S> k11 = ldot<S, M>(k1, k1, m), k22 = ldot<S, M>(k2, k2, m), zz = ldot<S, M>(sv.z, sv.z, m);
      copy_n(bt.gZ + (Lt - 1) * mw, mw, gz);    // term t's own adjoints
      copy_n(bt.gK1 + (Lt - 1) * mw, mw, gk1);
      copy_n(bt.gK2 + (Lt - 1) * mw, mw, gk2);
      for (int c = 0; c < m; ++c) {
        st(gz, c, ld(gz, c) + S(2) * gsq * (ld(sv.vold, c) + k11 * k22 * ld(sv.z, c)));
        st(gvold, c, S(2) * gsq * ld(sv.z, c));
        st(gk1, c, ld(gk1, c) + S(2) * gsq * k22 * zz * ld(k1, c));
        st(gk2, c, ld(gk2, c) + S(2) * gsq * k11 * zz * ld(k2, c));
      }
      gS = gsq * ld(bt.keep, Lt - 1);
      // FWM Eq. 3: z = β (v - v_old)
      const Vec<S> b = ld(beta, 0);
      Vec<S> gbeta{};
      for (int c = 0; c < m; ++c) {
        gbeta += ld(gz, c) * (ld(v, c) - ld(sv.vold, c));
        st(gwl, 2 * m + c, b * ld(gz, c));
        st(gvold, c, ld(gvold, c) - b * ld(gz, c));
      }
      // v_old = F_{t-1} vec(k1 ⊗ k2) (FWM §3.1.1), F_{t-1} = the first Lt - 1 terms
      lookup_backward<S, M>(bt, bt.qv, qDv, Lt - 1, base, gbase, k1, k2, gvold, m, gk1, gk2, AD, u);
      // through the activations: tanh' = 1 - tanh² (FWM Eq. 1, 5, 6), σ' = σ (1 - σ) (Eq. 2)
      copy_n(gk1, mw, gwl);
      copy_n(gk2, mw, gwl + mw);
      for (int i = 0; i < 3 * m; ++i) st(gwl, i, ld(gwl, i) * (S(1) - ld(act, i) * ld(act, i)));
      st(gwl, 3 * m, gbeta * b * (S(1) - b));
      for (int i = 0; i < rsize; ++i)
        st(grl, i, ld(grl, i) * (S(1) - ld(act, 3 * m + i) * ld(act, 3 * m + i)));
      lanes_to_rows(gwl, lanes, wsize, a.gw + group_rows<S>(t, BH, g, wsize), s.pad.data());
      lanes_to_rows(grl, lanes, rsize, a.gr + group_rows<S>(t, BH, g, rsize), s.pad.data());
    }
    // the segment's start: a fold (the previous segment ends in this base; ||F||² goes on), or F0
    if (k > 0) {
      gEnd = gbase;
    } else if (gF0 != nullptr) {   // ||F0||² was the first ||F||²
      for (size_t i = 0; i < cube; ++i)
        st(gbase, i, ld(gbase, i) + (F0_nonzero ? S(2) * gS * ld(s.base0.data(), i) : Vec<S>{}));
      lanes_to_rows(gbase, lanes, static_cast<int>(cube), gF0, s.pad.data());
    }
  }
}

}  // namespace cpu
}  // namespace rfwp
