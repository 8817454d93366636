// Argument blocks of the fused fast-weight recurrences, shared by the CPU (fastweight_cpu.cpp)
// and CUDA (cuda/*.cu) implementations. Plain C++: no torch and no CUDA headers.
//
// Memory layout (all contiguous, row-major):
//   per-step vectors  [T, B, H, n]      (n = dk for keys/queries, dv for values/outputs)
//   per-step scalars  [T, B, H]         (beta, beta_r, xb)
//   states            [B, H, rows, cols] (a fast weight matrix maps keys to values:
//                                        W [dv, dk], y = W q, a write is v (x) k)
//   carried outputs   [B, H, dv]
//   reset             [T, B] uint8 (1: zero entry b's state before step t)
//   checkpoints       [ceil(T / chunk), B, H, rows, cols]: the state before step c * chunk
//                     (before that step's reset), written by the forward, read by the backward
//                     which recomputes the states inside each chunk from its checkpoint.
// Gradient pointers of final states (gW, gR) may be null (no gradient flows into them).
//
// Exception: the CUDA lt/delta kernels keep no checkpoints (their backward runs two sweeps over
// time: G = dL/dW backwards, then W forwards from the initial state). Their `ckpt` is one flat
// buffer of cuda_lt_delta_saved(n, delta) scalars: the initial state [B, H, dv, dk], then for
// delta the vectors (u_t, v_t - v̄_t) [T, B, H, 2, dv]; empty when chunk == 0 (inference).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define RFWP_HOST_DEVICE __host__ __device__
#else
#define RFWP_HOST_DEVICE
#endif

namespace rfwp {

struct Dims {
  int T, B, H;     // steps, batch, heads
  int dk, dv;      // key size, value size (the fast weight matrix is dv x dk)
  int chunk;       // checkpoint every `chunk` steps; 0 in a forward: no checkpoints (inference)
};

RFWP_HOST_DEVICE inline int num_chunks(int T, int chunk) { return chunk > 0 ? (T + chunk - 1) / chunk : 0; }

// Scalars the CUDA lt/delta forward keeps for the backward (see the note above).
RFWP_HOST_DEVICE inline long long cuda_lt_delta_saved(const Dims& n, bool delta) {
  if (n.chunk <= 0) return 0;
  const long long bh = static_cast<long long>(n.B) * n.H;
  return bh * n.dv * n.dk + (delta ? static_cast<long long>(n.T) * bh * 2 * n.dv : 0);
}

// lt (beta == nullptr) and delta.
template <typename S>
struct DeltaFwdArgs {
  const S *q, *k, *v, *beta, *W0;
  const uint8_t* reset;
  S *y, *W, *ckpt;
  Dims n;
};

template <typename S>
struct DeltaBwdArgs {
  const S *q, *k, *v, *beta;
  const uint8_t* reset;
  const S *ckpt, *gy, *gW;
  S *gq, *gk, *gv, *gbeta, *gW0;   // gbeta unused for lt
  Dims n;
};

// delta_rnn: W [dv, dk] from (k, v, beta); R [dv, dv] from (kr, vr, beta_r); y0 [B, H, dv].
// The forward also writes the recurrent queries s_t = softmax(y_{t-1}) [T, B, H, dv] (uniform
// after a reset) for the backward.
template <typename S>
struct DeltaRnnFwdArgs {
  const S *q, *k, *v, *beta, *kr, *vr, *beta_r, *W0, *R0, *y0;
  const uint8_t* reset;
  S *y, *W, *R, *ckptW, *ckptR, *s;
  Dims n;
};

template <typename S>
struct DeltaRnnBwdArgs {
  const S *q, *k, *v, *beta, *kr, *vr, *beta_r, *s;
  const uint8_t* reset;
  const S *ckptW, *ckptR, *gy, *gW, *gR;
  S *gq, *gk, *gv, *gbeta, *gkr, *gvr, *gbeta_r, *gW0, *gR0, *gy0;
  Dims n;
};

// rdn (softmax feature map), dk == dv == d. The forward also writes the activated
// q, k, v [T, B, H, d], beta [T, B, H] and h_t = tanh(y_{t-1}) [T, B, H, d] (zero after a
// reset) used by the backward.
template <typename S>
struct RdnFwdArgs {
  const S *xq, *xk, *xv, *xb, *Rq, *Rk, *Rv, *rb, *W0, *y0;
  const uint8_t* reset;
  S *y, *W, *ckpt, *q, *k, *v, *beta, *h;
  Dims n;
};

// gRq_part, gRk_part, gRv_part [B, H, d, d] and grb_part [B, H, d] receive per-(b, h)
// partial gradients; gRq, gRk, gRv [H, d, d] and grb [H, d] their sum over b, taken in
// order b = 0, 1, ..., B-1 (deterministic).
template <typename S>
struct RdnBwdArgs {
  const S *Rq, *Rk, *Rv, *rb, *h, *q, *k, *v, *beta;
  const uint8_t* reset;
  const S *ckpt, *gy, *gW;
  S *gxq, *gxk, *gxv, *gxb;
  S *gRq_part, *gRk_part, *gRv_part, *grb_part;
  S *gRq, *gRk, *gRv, *grb, *gW0, *gy0;
  Dims n;
};

// gated_delta (alpha set, nh = 1) and delta_product (alpha == nullptr): per input t the state
// W [dv, dk] is decayed by alpha_t, then written by nh delta-rule steps with keys
// k [T, B, H, nh, dk], values v [T, B, H, nh, dv] and strengths beta [T, B, H, nh];
// y_t = W_t q_t. Checkpoints hold W.
template <typename S>
struct ProductFwdArgs {
  const S *q, *k, *v, *alpha, *beta, *W0;
  const uint8_t* reset;
  S *y, *W, *ckpt;
  Dims n;
  int nh;   // Householder (delta-rule) steps per input
};

template <typename S>
struct ProductBwdArgs {
  const S *q, *k, *v, *alpha, *beta;
  const uint8_t* reset;
  const S *ckpt, *gy, *gW;
  S *gq, *gk, *gv, *galpha, *gbeta, *gW0;   // galpha unused without alpha
  Dims n;
  int nh;
};

// srwm (softmax feature map): x [T, B, H, d] (through the feature map), the slow initial
// weights Winit [H, 3d + 4, d], the state dW [B, H, 3d + 4, d] (W = Winit + dW), y [T, B, H, d].
// dk == dv == d. Checkpoints hold dW.
template <typename S>
struct SrwmFwdArgs {
  const S *x, *Winit, *dW0;
  const uint8_t* reset;
  S *y, *dW, *ckpt;
  Dims n;
};

// gWinit_part [B, H, 3d + 4, d] receives per-(b, h) partial gradients; gWinit [H, 3d + 4, d]
// their sum over b, taken in order b = 0, 1, ..., B-1 (deterministic).
template <typename S>
struct SrwmBwdArgs {
  const S *x, *Winit;
  const uint8_t* reset;
  const S *ckpt, *gy, *gdW;
  S *gx, *gWinit_part, *gWinit, *gdW0;
  Dims n;
};

// mamba (Mamba's selective SSM): u, delta [T, B, D], A [D, N], Bm, C [T, B, N], the state
// h [B, D, N] (one row of N state values per channel), y [T, B, D]. Dims: H = 1, dk = N, dv = D.
// Checkpoints [ceil(T / chunk), B, D, N] hold h.
template <typename S>
struct MambaFwdArgs {
  const S *u, *delta, *A, *Bm, *C, *h0;
  const uint8_t* reset;
  S *y, *hT, *ckpt;
  Dims n;
};

// gy and ghT may be null (zero). gA_part [B, D, N] receives per-entry partial gradients of A;
// gA [D, N] their sum over b, taken in order b = 0, 1, ..., B-1 (deterministic).
template <typename S>
struct MambaBwdArgs {
  const S *u, *delta, *A, *Bm, *C;
  const uint8_t* reset;
  const S *ckpt, *gy, *ghT;
  S *gu, *gdelta, *gA_part, *gA, *gB, *gC, *gh0;
  Dims n;
};

// fwm (FWM paper Eq. 1-7), dk == dv == m: per step the slow projections w [T, B, H, 3m + 1]
// (the write keys k1, k2 and value v before tanh, the strength beta before the sigmoid) and
// r [T, B, H, (1 + nr) m] (the read keys n0, e_1..e_nr before tanh); the fast tensor
// F [B, H, m, m, m] (first key, second key, value); y [T, B, H, m] = n^(nr). The CPU kernel
// keeps F as a dense base plus the low-rank tail of the writes since the base, and runs the
// (b, h) tasks in groups of W (the vector lanes), one number of each task per vector
// (cpu/fwm_impl.h): its own buffers are [G = ceil(B H / W)] groups of [..][W]. saved
// [G, T, fwm_saved_size(m, nr), W]: what the backward needs of every step; bases
// [G, fwm_max_folds(T, fold), m³, W]: the tails folded into dense bases every `fold` steps.
// Both are null in an inference forward.
RFWP_HOST_DEVICE inline int fwm_saved_size(int m, int nr) { return (2 + nr) * m + nr + 2; }
// The longest tail before it is folded into a dense base: a lookup costs about L m (tail)
// against m³ (base), so up to L = m² the tail is the cheaper form.
RFWP_HOST_DEVICE inline int fwm_tail_capacity(int m) { return m * m > 16 ? m * m : 16; }
RFWP_HOST_DEVICE inline int fwm_max_folds(int T, int fold) { return T > 0 ? (T - 1) / fold : 0; }

template <typename S>
struct FwmFwdArgs {
  const S *w, *r, *F0;
  const uint8_t* reset;
  S *y, *F, *saved, *bases;
  Dims n;     // dk == dv == m
  int nr;     // reads N_r
  int fold;   // tail length folded into a dense base (>= 1)
};

// gF may be null (no gradient of the final state); gF0 may be null (not needed: no work spent
// on the gradient of the initial tensor's base).
template <typename S>
struct FwmBwdArgs {
  const S *w, *r, *F0;
  const uint8_t* reset;
  const S *saved, *bases, *gy, *gF;
  S *gw, *gr, *gF0;
  Dims n;
  int nr, fold;
};

// The incremental (inference) stepper: one step (w [B, H, 3m + 1], r [B, H, (1 + nr) m],
// reset [B] or null) on its state, updated in place, in groups of W tasks: the tail's k1, k2, z
// [G, cap, m, W], scales q [G, cap, W], scal [G, 2, W] (||F||², the base's scale), meta [G, 2]
// (tail length, has a base), base [G, m³, W]. `cap` terms are allocated (the caller grows it up
// to `fold`, the tail length folded into the base).
template <typename S>
struct FwmStepArgs {
  const S *w, *r;
  const uint8_t* reset;
  S *k1, *k2, *z, *q, *scal, *base;
  int32_t* meta;
  S* y;                                   // [B, H, m]
  S* saved;                               // null, or this step's record for the backward [G][A][W]
  Dims n;                                 // T = 1
  int nr, cap, fold;
};

}  // namespace rfwp
