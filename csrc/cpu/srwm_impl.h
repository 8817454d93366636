// CPU implementation of the modern self-referential weight matrix (Irie, Schlag, Csordás,
// Schmidhuber, ICML 2022, Eq. 5-8), softmax feature map, one (batch, head) pair per task.
//
// Per head W = W_init + dW is [R][d] row-major, R = 3d + 4 rows (y, q, k: d each; then 4 rows
// for the learning rates); the state is dW. Per step t (after the reset of step t, which
// zeroes dW, i.e. W = W_init), with x_t already through the feature map:
//   p = W x_t = [y_t, q, k, b];  qs = softmax(q), ks = softmax(k), sg = sigmoid(b) (4);
//   e = W qs - W ks = W (qs - ks);  u_r = sg[block(r)] e_r;  dW += u (x) ks.
// Backward of step t with G = dL/dW_t (= dL/d dW_t), W = W_{t-1}:
//   gu = G ks;  gks = G^T u;  gsg_blk = Σ_{r in blk} gu_r e_r;  ge_r = sg_blk gu_r;
//   gqs = W^T ge, gks -= W^T ge;  gq = softmax'(gqs), gk = softmax'(gks), gb = gsg sg (1 - sg);
//   gp = [gy, gq, gk, gb];  gx = W^T gp;  J = ge (x) (qs - ks) + gp (x) x  (dL/dW_{t-1} through
//   step t);  G += J (no: G = 0 after a reset at t), and dL/dW_init += J (every step).
// D > 0: d == D known at compile time (16, 32, 64); D == 0: any d.
// The backward recomputes, one checkpoint chunk at a time, W_{t-1} and the step's qs, ks, sg,
// e; the per-task sums of J are added over the batch in a fixed order by the driver.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../fastweight_params.h"
#include "fastweight_cpu_impl.h"

namespace rfwp {
namespace cpu {

constexpr int kSrwmRates = 4;

inline int srwm_rows(int d) { return 3 * d + kSrwmRates; }
// the learning-rate block of row r: 0 (y), 1 (q), 2 (k), 3 (the rate rows)
inline int srwm_block(int r, int d) { return r < 3 * d ? r / d : 3; }

// What one step keeps for the backward: qs, ks [d], sg [4], e [R].
template <typename S>
struct SrwmStepVectors {
  S *qs, *ks, *sg, *e;
  static size_t size(int d) { return 2 * static_cast<size_t>(d) + kSrwmRates + srwm_rows(d); }
  SrwmStepVectors(S* base, int d)
      : qs(base), ks(base + d), sg(base + 2 * d), e(base + 2 * d + kSrwmRates) {}
};

// One step on dW (in place): y (if not null) and the step's vectors. W = W_init + dW is
// formed row by row into `w` (R x d; the backward keeps it).
template <typename S, int D>
inline void srwm_step(const S* Winit, S* dW, const S* x, int d_, S* w, S* p, S* diff,
                      const SrwmStepVectors<S>& sv, S* y) {
  const int d = D > 0 ? D : d_, R = srwm_rows(d);
  for (int r = 0; r < R; ++r) {
    S* wr = w + static_cast<size_t>(r) * d;
    const S* ir = Winit + static_cast<size_t>(r) * d;
    const S* dr = dW + static_cast<size_t>(r) * d;
#pragma omp simd
    for (int c = 0; c < d; ++c) wr[c] = ir[c] + dr[c];
    p[r] = dot(wr, x, d);                                  // SRWM Eq. 5: W_{t-1} φ(x_t)
  }
  if (y != nullptr) copy_n(p, d, y);
  vsoftmax(p + d, sv.qs, d);                               // φ(q_t), φ(k_t)
  vsoftmax(p + 2 * d, sv.ks, d);
  for (int i = 0; i < kSrwmRates; ++i) sv.sg[i] = vsigmoid(p[3 * d + i]);
  for (int c = 0; c < d; ++c) diff[c] = sv.qs[c] - sv.ks[c];
  for (int r = 0; r < R; ++r) {
    sv.e[r] = dot(w + static_cast<size_t>(r) * d, diff, d);   // SRWM Eq. 6-7: v - v̄ = W (φ(q) - φ(k))
    axpy(sv.sg[srwm_block(r, d)] * sv.e[r], sv.ks, dW + static_cast<size_t>(r) * d, d);  // Eq. 8
  }
}

template <typename S>
struct SrwmScratch {
  AlignedVector<S> G, J, dW, w, vecs, tmp;
};

template <typename S, int D>
void srwm_forward_task(const SrwmFwdArgs<S>& a, int bh, SrwmScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int d = D > 0 ? D : n.dv, R = srwm_rows(d);
  const size_t mat = static_cast<size_t>(R) * d;
  const S* Winit = a.Winit + static_cast<size_t>(tk.h) * mat;
  s.dW.resize(mat);
  s.w.resize(mat);
  s.vecs.resize(SrwmStepVectors<S>::size(d));
  s.tmp.resize(static_cast<size_t>(R) + d);
  S* dW = s.dW.data();
  const SrwmStepVectors<S> sv(s.vecs.data(), d);
  copy_n(a.dW0 + tk.mat(mat), mat, dW);
  for (int t = 0; t < n.T; ++t) {
    prefetch_step<S, 2>(tk, n.T, t + kPrefetchSteps, d, {a.x, a.y});   // steps are pages apart
    if (n.chunk > 0 && t % n.chunk == 0) copy_n(dW, mat, a.ckpt + tk.ckpt(t / n.chunk, mat));
    if (tk.reset(a.reset, t)) zero_n(dW, mat);
    srwm_step<S, D>(Winit, dW, a.x + tk.vec(t, d), d, s.w.data(), s.tmp.data(), s.tmp.data() + R,
                    sv, a.y + tk.vec(t, d));
  }
  copy_n(dW, mat, a.dW + tk.mat(mat));
}

// Writes this task's dL/dW_init (summed over its steps) to a.gWinit_part[bh].
template <typename S, int D>
void srwm_backward_task(const SrwmBwdArgs<S>& a, int bh, SrwmScratch<S>& s) {
  const Dims& n = a.n;
  const Task tk(n, bh);
  const int d = D > 0 ? D : n.dv, R = srwm_rows(d), C = n.chunk;
  const size_t mat = static_cast<size_t>(R) * d, nv = SrwmStepVectors<S>::size(d);
  const int slots = C > 0 ? C : 1;
  const S* Winit = a.Winit + static_cast<size_t>(tk.h) * mat;
  s.G.resize(mat);
  s.J.resize(mat);
  s.dW.resize(mat);
  s.w.resize(static_cast<size_t>(slots) * mat);
  s.vecs.resize(static_cast<size_t>(slots) * nv);
  s.tmp.resize(3 * static_cast<size_t>(R) + 4 * d);
  S* G = s.G.data();
  S* Jsum = s.J.data();
  S* p = s.tmp.data();
  S* gu = p + R;
  S* gp = gu + R;
  S* diff = gp + R;
  S* gqs = diff + d;
  S* gks = gqs + d;
  S* gx = gks + d;
  if (a.gdW != nullptr) copy_n(a.gdW + tk.mat(mat), mat, G);
  else zero_n(G, mat);
  zero_n(Jsum, mat);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = t0 + C < n.T ? t0 + C : n.T;
    copy_n(a.ckpt + tk.ckpt(c, mat), mat, s.dW.data());
    for (int t = t0; t < t1; ++t) {   // recompute W_{t-1} and the step's vectors
      if (t + kPrefetchSteps < t1) prefetch_step<S, 1>(tk, n.T, t + kPrefetchSteps, d, {a.x});
      if (tk.reset(a.reset, t)) zero_n(s.dW.data(), mat);
      srwm_step<S, D>(Winit, s.dW.data(), a.x + tk.vec(t, d), d, s.w.data() + (t - t0) * mat, p,
                      diff, SrwmStepVectors<S>(s.vecs.data() + (t - t0) * nv, d),
                      static_cast<S*>(nullptr));
    }
    for (int t = t1 - 1; t >= t0; --t) {
      if (t - kPrefetchSteps >= t0) prefetch_step<S, 3>(tk, n.T, t - kPrefetchSteps, d, {a.x, a.gy, a.gx});
      const S* W = s.w.data() + (t - t0) * mat;
      const SrwmStepVectors<S> sv(s.vecs.data() + (t - t0) * nv, d);
      const S* x = a.x + tk.vec(t, d);
      // from dW_t = dW_{t-1} + u (x) ks
      S gsg[kSrwmRates] = {0, 0, 0, 0};
      zero_n(gks, d);
      for (int r = 0; r < R; ++r) {
        const S* Gr = G + static_cast<size_t>(r) * d;
        const int blk = srwm_block(r, d);
        gu[r] = dot(Gr, sv.ks, d);
        axpy(sv.sg[blk] * sv.e[r], Gr, gks, d);      // G^T u
        gsg[blk] += gu[r] * sv.e[r];
        gu[r] *= sv.sg[blk];                          // now ge_r
      }
      // e = W (qs - ks): gqs = W^T ge, gks -= W^T ge
      zero_n(gqs, d);
      for (int r = 0; r < R; ++r) axpy(gu[r], W + static_cast<size_t>(r) * d, gqs, d);
      for (int c2 = 0; c2 < d; ++c2) gks[c2] -= gqs[c2];
      // through the feature maps to gp = dL/d[y, q, k, b]
      copy_n(a.gy + tk.vec(t, d), d, gp);
      softmax_backward(sv.qs, gqs, gp + d, d);
      softmax_backward(sv.ks, gks, gp + 2 * d, d);
      for (int i = 0; i < kSrwmRates; ++i) gp[3 * d + i] = gsg[i] * sv.sg[i] * (S(1) - sv.sg[i]);
      for (int c2 = 0; c2 < d; ++c2) diff[c2] = sv.qs[c2] - sv.ks[c2];
      // p = W x: gx = W^T gp; J = ge (x) (qs - ks) + gp (x) x
      zero_n(gx, d);
      const bool rst = tk.reset(a.reset, t);
      for (int r = 0; r < R; ++r) {
        S* Gr = G + static_cast<size_t>(r) * d;
        S* Jr = Jsum + static_cast<size_t>(r) * d;
        axpy(gp[r], W + static_cast<size_t>(r) * d, gx, d);
#pragma omp simd
        for (int c2 = 0; c2 < d; ++c2) {
          const S j = gu[r] * diff[c2] + gp[r] * x[c2];
          Jr[c2] += j;
          Gr[c2] = rst ? S(0) : Gr[c2] + j;           // no gradient crosses a reset
        }
      }
      copy_n(gx, d, a.gx + tk.vec(t, d));
    }
  }
  copy_n(G, mat, a.gdW0 + tk.mat(mat));
  copy_n(Jsum, mat, a.gWinit_part + tk.mat(mat));
}

}  // namespace cpu
}  // namespace rfwp
