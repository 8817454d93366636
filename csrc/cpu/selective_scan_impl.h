// CPU selective scan of Mamba (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with
// Selective State Spaces"): Eq. 2a-2b with Eq. 4's zero-order-hold Ā = exp(ΔA) and the
// authors' code's B̄ = ΔB, forward and backward, one batch entry per task. No torch.
//
// Per channel d and state index n of entry b (k_t = 0 where the entry resets before step t,
// else 1):
//   h_t[d][n] = exp(Δ_t[d] A[d][n]) k_t h_{t-1}[d][n] + Δ_t[d] u_t[d] B_t[n]      (Eq. 2a)
//   y_t[d]    = Σ_n C_t[n] h_t[d][n]                                              (Eq. 2b)
// The state of a step, D x N numbers per entry, stays in a scratch row of the task: the states
// of all steps are never written to memory. The forward keeps the state before every chunk of
// `chunk` steps (before that step's reset), the backward recomputes a chunk's states from it.
//
// Backward (reverse mode, per entry, the chunks from the last), with g the gradient reaching
// h_t from h_{t+1}:
//   G       = g + C_t[n] ∂y_t[d]                      (all of ∂L/∂h_t)
//   ∂C_t[n] = Σ_d h_t[d][n] ∂y_t[d]                    ∂B_t[n] = Σ_d G Δ_t[d] u_t[d]
//   s       = G k_t h_{t-1} exp(Δ_t[d] A[d][n])        (∂L/∂(Δ_t[d] A[d][n]))
//   ∂u_t[d] = Δ_t[d] Σ_n G B_t[n]                      ∂Δ_t[d] = u_t[d] Σ_n G B_t[n] + Σ_n s A[d][n]
//   ∂A[d][n] += s Δ_t[d] (one partial sum per entry)   g ← G exp(Δ_t[d] A[d][n]) k_t
// and ∂h0 = g after step 0.
//
// Layouts (row-major): u, delta, y and their gradients [T][B][D]; B, C and theirs [T][B][N];
// A [D][N]; h0, h_T [B][D][N]; checkpoints [ceil(T / chunk)][B][D][N]; the per-entry partial
// sums of ∂A [B][D][N] (summed over the entries in a fixed order by the caller).
#pragma once

#include <algorithm>
#include <cstdint>

#include "vec_math.h"

namespace rfwp {
namespace cpu {

template <typename S>
struct SelectiveScanArgs {
  int T = 0, B = 0, D = 0, N = 0;
  int chunk = 0;  // forward: 0 keeps no checkpoints (inference)
  const S* u = nullptr;
  const S* delta = nullptr;
  const S* A = nullptr;
  const S* Bm = nullptr;
  const S* C = nullptr;
  const S* h0 = nullptr;
  const uint8_t* reset = nullptr;  // [T][B] or null
  S* y = nullptr;                  // forward outputs
  S* hT = nullptr;
  S* ckpt = nullptr;  // forward: written (chunk > 0); backward: read
  const S* gy = nullptr;   // backward inputs (null: zero)
  const S* ghT = nullptr;
  S* gu = nullptr;  // backward outputs
  S* gdelta = nullptr;
  S* gA_part = nullptr;
  S* gB = nullptr;
  S* gC = nullptr;
  S* gh0 = nullptr;
};

// One step of entry b: h (D x N) from the state before the step (prev; zero with a reset) into
// cur, and y_t (null: not wanted). prev and cur may be the same row.
template <typename S>
RFWP_INLINE void selective_step(const SelectiveScanArgs<S>& a, int t, int b, const S* prev, S* cur,
                                S* y_row) {
  const int D = a.D, N = a.N;
  const int64_t tb = static_cast<int64_t>(t) * a.B + b;
  const bool reset = a.reset != nullptr && a.reset[tb] != 0;
  const S keep = reset ? S(0) : S(1);
  const S* ut = a.u + tb * D;
  const S* dl = a.delta + tb * D;
  const S* Bt = a.Bm + tb * N;
  const S* Ct = a.C + tb * N;
  for (int d = 0; d < D; ++d) {
    const S dt = dl[d], du = dt * ut[d];
    const S* Ad = a.A + static_cast<int64_t>(d) * N;
    const S* pd = prev + static_cast<int64_t>(d) * N;
    S* hd = cur + static_cast<int64_t>(d) * N;
    S acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int n = 0; n < N; ++n) {
      const S h = vexp(dt * Ad[n]) * (keep * pd[n]) + du * Bt[n];  // Eq. 2a, Ā = exp(ΔA), B̄ = ΔB
      hd[n] = h;
      acc += Ct[n] * h;  // Eq. 2b
    }
    if (y_row != nullptr) y_row[d] = acc;
  }
}

// Forward of entry b; h: a scratch row of D x N.
template <typename S>
void selective_scan_forward_entry(const SelectiveScanArgs<S>& a, int b, S* h) {
  const int64_t DN = static_cast<int64_t>(a.D) * a.N;
  std::copy(a.h0 + b * DN, a.h0 + (b + 1) * DN, h);
  for (int t = 0; t < a.T; ++t) {
    if (a.chunk > 0 && t % a.chunk == 0)
      std::copy(h, h + DN, a.ckpt + (static_cast<int64_t>(t / a.chunk) * a.B + b) * DN);
    selective_step(a, t, b, h, h, a.y + (static_cast<int64_t>(t) * a.B + b) * a.D);
  }
  std::copy(h, h + DN, a.hT + b * DN);
}

// Backward of entry b; hs: a scratch of (chunk + 1) rows of D x N, g: one row.
template <typename S>
void selective_scan_backward_entry(const SelectiveScanArgs<S>& a, int b, S* hs, S* g) {
  const int D = a.D, N = a.N;
  const int64_t DN = static_cast<int64_t>(D) * N;
  if (a.ghT != nullptr) std::copy(a.ghT + b * DN, a.ghT + (b + 1) * DN, g);
  else std::fill(g, g + DN, S(0));
  S* gA = a.gA_part + b * DN;
  std::fill(gA, gA + DN, S(0));
  const int chunks = (a.T + a.chunk - 1) / a.chunk;
  for (int c = chunks - 1; c >= 0; --c) {
    const int s = c * a.chunk, L = std::min(a.T, s + a.chunk) - s;
    const S* ck = a.ckpt + (static_cast<int64_t>(c) * a.B + b) * DN;
    std::copy(ck, ck + DN, hs);
    for (int j = 0; j < L; ++j) selective_step<S>(a, s + j, b, hs + j * DN, hs + (j + 1) * DN, nullptr);
    for (int j = L - 1; j >= 0; --j) {
      const int64_t tb = static_cast<int64_t>(s + j) * a.B + b;
      const bool reset = a.reset != nullptr && a.reset[tb] != 0;
      const S keep = reset ? S(0) : S(1);
      const S* prev = hs + j * DN;
      const S* cur = hs + (j + 1) * DN;
      const S* ut = a.u + tb * D;
      const S* dl = a.delta + tb * D;
      const S* Bt = a.Bm + tb * N;
      const S* Ct = a.C + tb * N;
      const S* gyt = a.gy != nullptr ? a.gy + tb * D : nullptr;
      S* gBt = a.gB + tb * N;
      S* gCt = a.gC + tb * N;
      std::fill(gBt, gBt + N, S(0));
      std::fill(gCt, gCt + N, S(0));
      for (int d = 0; d < D; ++d) {
        const S dy = gyt != nullptr ? gyt[d] : S(0);
        const S dt = dl[d], ud = ut[d], du = dt * ud;
        const S* Ad = a.A + static_cast<int64_t>(d) * N;
        const S* pd = prev + static_cast<int64_t>(d) * N;
        const S* hd = cur + static_cast<int64_t>(d) * N;
        S* gd = g + static_cast<int64_t>(d) * N;
        S* gAd = gA + static_cast<int64_t>(d) * N;
        S sum_b = 0, sum_s = 0;
#pragma omp simd reduction(+ : sum_b, sum_s)
        for (int n = 0; n < N; ++n) {
          const S G = gd[n] + Ct[n] * dy;
          const S decay = vexp(dt * Ad[n]);
          const S s_ = G * (keep * pd[n]) * decay;
          sum_b += G * Bt[n];
          sum_s += s_ * Ad[n];
          gAd[n] += s_ * dt;
          gCt[n] += hd[n] * dy;
          gBt[n] += G * du;
          gd[n] = G * decay * keep;
        }
        a.gdelta[tb * D + d] = sum_b * ud + sum_s;
        a.gu[tb * D + d] = sum_b * dt;
      }
    }
  }
  std::copy(g, g + DN, a.gh0 + b * DN);
}

}  // namespace cpu
}  // namespace rfwp
