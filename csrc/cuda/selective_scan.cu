// CUDA kernels of the selective scan of Mamba (Gu & Dao 2023, "Mamba: Linear-Time Sequence
// Modeling with Selective State Spaces"): Eq. 2a-2b with Eq. 4's zero-order-hold Ā = exp(ΔA) and
// the authors' code's B̄ = ΔB, forward and backward, with resets inside the sequence. The same
// numbers as cpu/selective_scan_impl.h, whose header has the equations of the backward.
//
// One block per batch entry b (Dims: H = 1, dk = N, dv = D). The entry's state h [D][N] is a
// matrix with one row per channel d: `Lanes` (common.cuh) gives each row `width` lanes of one
// warp, and a lane owns the columns lane, lane + width, ... of its rows. Every element of h
// (forward), of its gradient G and of the entry's partial sums of ∂A (backward) is read and
// written by its owner lane only, so the recurrence has no barrier. They live in shared memory
// when they fit the device (staged), else in the output buffers hT, gh0 and gA_part in global
// memory (the same code; mamba has no size limit). Δ_t[d] and u_t[d] are read by the lanes of row
// d, B_t and C_t by every row, A from global memory (cache hits: shared by the rows, or the batch).
//
// Forward, per step and row d (k_t = 0 where the entry resets before step t, else 1):
//   (checkpoint) h[d][n] = exp(Δ[d] A[d][n]) k_t h[d][n] + Δ[d] u[d] B[n];  y[d] = Σ_n C[n] h[d][n].
// Backward, per checkpoint chunk, last to first:
//   recompute: h_t of the chunk's steps into workspace slots (each lane reads back what it wrote);
//   reverse, per step and row (owner lanes, no barrier): G += C_t ∂y_t[d] (all of ∂L/∂h_t, also
//     written to a workspace slot), s = G k_t h_{t-1} exp(ΔA), ∂u_t[d] = Δ Σ_n G B and
//     ∂Δ_t[d] = u Σ_n G B + Σ_n s A (sums over the row's lanes), ∂A partial += s Δ, G ← G exp(ΔA) k_t;
//   columns (after one barrier, all steps of the chunk at once): ∂C_t[n] = Σ_d h_t[d][n] ∂y_t[d],
//     ∂B_t[n] = Σ_d G_t[d][n] Δ_t[d] u_t[d], each (step, n) summed over the rows by `width` lanes.
// A second kernel sums the entries' partial sums of ∂A over b in order (deterministic, no atomics).
#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

// Steps of one checkpoint chunk the backward keeps in its workspace.
__host__ __device__ inline int scan_slots(const Dims& n) { return n.chunk < n.T ? n.chunk : n.T; }

// `stage`: h in shared memory, else in the output a.hT itself (global memory; every element is
// only ever touched by the lane that owns it, so the kernel is the same).
template <typename S>
RFWP_KERNEL selective_scan_forward_kernel(MambaFwdArgs<S> a, bool stage) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, D = n.dv, N = n.dk, mat = D * N;
  const int ld = stage ? padded_ld(N) : N;
  RFWP_DYNAMIC_SHARED(smem_raw);
  S* out = a.hT + blk.mat(mat);
  S* h = stage ? SmemCursor<S>(smem_raw).mat(D, N) : out;
  const Lanes rows(D, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  const S* h0 = a.h0 + blk.mat(mat);
  for (int d = rows.group; d < D; d += rows.groups)
    for (int c = rows.lane; c < N; c += rows.width) h[d * ld + c] = h0[d * N + c];
  for (int t = 0; t < n.T; ++t) {
    const S keep = flags.at(t) ? S(0) : S(1);
    S* ckpt = (n.chunk > 0 && t % n.chunk == 0) ? a.ckpt + blk.ckpt(t / n.chunk, mat) : nullptr;
    const S* Bt = a.Bm + blk.vec(t, N);
    const S* Ct = a.C + blk.vec(t, N);
    const std::size_t td = blk.vec(t, D);
    for (int d0 = 0; d0 < D; d0 += rows.groups) {
      const int d = d0 + rows.group;
      S y = 0;
      if (d < D) {
        const S dt = a.delta[td + d], du = dt * a.u[td + d];
        const S* Ad = a.A + d * N;
        S* hd = h + d * ld;
        for (int c = rows.lane; c < N; c += rows.width) {
          const S prev = hd[c];
          if (ckpt != nullptr) ckpt[d * N + c] = prev;
          const S x = dexp(dt * Ad[c]) * (keep * prev) + du * Bt[c];   // Eq. 2a, Ā = exp(ΔA) (Eq. 4), B̄ = ΔB
          hd[c] = x;
          y += Ct[c] * x;                                                // Eq. 2b: y = C h
        }
      }
      y = group_sum(y, rows.width);
      if (d < D && rows.lane == 0) a.y[td + d] = y;
    }
  }
  if (stage)
    for (int d = rows.group; d < D; d += rows.groups)
      for (int c = rows.lane; c < N; c += rows.width) out[d * N + c] = h[d * ld + c];
}

// `stage`: G and the partial sums of ∂A in shared memory, else in the outputs a.gh0 and
// a.gA_part themselves (global memory, touched by their owner lanes only).
template <typename S>
RFWP_KERNEL selective_scan_backward_kernel(MambaBwdArgs<S> a, S* work, bool stage) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, D = n.dv, N = n.dk, mat = D * N, C = n.chunk;
  const int ld = stage ? padded_ld(N) : N;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* gh0 = a.gh0 + blk.mat(mat);
  S* part = a.gA_part + blk.mat(mat);
  S* G = stage ? cur.mat(D, N) : gh0;
  S* gA = stage ? cur.mat(D, N) : part;
  const Lanes rows(D, nt, tid), cols(N, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  // workspace of this block: h_t, then G_t = ∂L/∂h_t, of the chunk's steps, [slots][D][N] each
  const std::size_t slots = static_cast<std::size_t>(scan_slots(n)) * mat;
  S* hs = work + static_cast<std::size_t>(blk.bh) * 2 * slots;
  S* gs = hs + slots;
  auto slot = [&](S* base, int j) { return base + static_cast<std::size_t>(j) * mat; };

  const S* ghT = a.ghT != nullptr ? a.ghT + blk.mat(mat) : nullptr;
  for (int d = rows.group; d < D; d += rows.groups)
    for (int c = rows.lane; c < N; c += rows.width) {
      G[d * ld + c] = ghT != nullptr ? ghT[d * N + c] : S(0);
      gA[d * ld + c] = S(0);
    }
  for (int ch = num_chunks(n.T, C) - 1; ch >= 0; --ch) {
    const int t0 = ch * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    const S* ck = a.ckpt + blk.ckpt(ch, mat);
    __syncthreads();   // the previous chunk's column phase has read the workspace
    // ---- recompute the chunk's states
    for (int t = t0; t < t1; ++t) {
      const int j = t - t0;
      const S keep = flags.at(t) ? S(0) : S(1);
      const S* Bt = a.Bm + blk.vec(t, N);
      const std::size_t td = blk.vec(t, D);
      const S* prev = j == 0 ? ck : slot(hs, j - 1);
      S* next = slot(hs, j);
      for (int d = rows.group; d < D; d += rows.groups) {
        const S dt = a.delta[td + d], du = dt * a.u[td + d];
        const S* Ad = a.A + d * N;
        for (int c = rows.lane; c < N; c += rows.width)
          next[d * N + c] = dexp(dt * Ad[c]) * (keep * prev[d * N + c]) + du * Bt[c];   // Eq. 2a
      }
    }
    // ---- walk the chunk backwards
    for (int t = t1 - 1; t >= t0; --t) {
      const int j = t - t0;
      const S keep = flags.at(t) ? S(0) : S(1);
      const S* Bt = a.Bm + blk.vec(t, N);
      const S* Ct = a.C + blk.vec(t, N);
      const std::size_t td = blk.vec(t, D);
      const S* prev = j == 0 ? ck : slot(hs, j - 1);
      S* Gt = slot(gs, j);
      for (int d0 = 0; d0 < D; d0 += rows.groups) {
        const int d = d0 + rows.group;
        S sum_b = 0, sum_s = 0, dt = 0, ud = 0;
        if (d < D) {
          dt = a.delta[td + d];
          ud = a.u[td + d];
          const S dy = a.gy != nullptr ? a.gy[td + d] : S(0);
          const S* Ad = a.A + d * N;
          S* Gd = G + d * ld;
          S* gAd = gA + d * ld;
          for (int c = rows.lane; c < N; c += rows.width) {
            const S g = Gd[c] + Ct[c] * dy;                     // all of ∂L/∂h_t (Eq. 2b's read)
            const S decay = dexp(dt * Ad[c]);
            const S s = g * (keep * prev[d * N + c]) * decay;   // ∂L/∂(Δ_t[d] A[d][n])
            sum_b += g * Bt[c];
            sum_s += s * Ad[c];
            gAd[c] += s * dt;
            Gt[d * N + c] = g;
            Gd[c] = g * decay * keep;                           // ∂L/∂h_{t-1} through Eq. 2a
          }
        }
        sum_b = group_sum(sum_b, rows.width);
        sum_s = group_sum(sum_s, rows.width);
        if (d < D && rows.lane == 0) {
          a.gdelta[td + d] = sum_b * ud + sum_s;
          a.gu[td + d] = sum_b * dt;
        }
      }
    }
    __syncthreads();   // every row's h_t and G_t of the chunk are in the workspace
    // ---- ∂C_t[n] and ∂B_t[n] of the chunk's steps: one (step, n) per group of lanes
    const int items = (t1 - t0) * N;
    for (int p0 = 0; p0 < items; p0 += cols.groups) {
      const int p = p0 + cols.group;
      const int j = p / N, c = p - j * N;
      S gc = 0, gb = 0;
      if (p < items) {
        const std::size_t td = blk.vec(t0 + j, D);
        const S* hj = slot(hs, j);
        const S* Gj = slot(gs, j);
        for (int d = cols.lane; d < D; d += cols.width) {
          const S dy = a.gy != nullptr ? a.gy[td + d] : S(0);
          gc += hj[d * N + c] * dy;
          gb += Gj[d * N + c] * (a.delta[td + d] * a.u[td + d]);
        }
      }
      gc = group_sum(gc, cols.width);
      gb = group_sum(gb, cols.width);
      if (p < items && cols.lane == 0) {
        a.gC[blk.vec(t0 + j, N) + c] = gc;
        a.gB[blk.vec(t0 + j, N) + c] = gb;
      }
    }
  }
  if (stage)
    for (int d = rows.group; d < D; d += rows.groups)
      for (int c = rows.lane; c < N; c += rows.width) {
        gh0[d * N + c] = G[d * ld + c];
        part[d * N + c] = gA[d * ld + c];
      }
}

}  // namespace

std::size_t mamba_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage) {
  SmemSize s;
  if (stage) {
    s.mat(n.dv, n.dk);
    if (backward) s.mat(n.dv, n.dk);
  }
  return s.n * elem;
}

std::size_t mamba_workspace_elems(const Dims& n) {
  return static_cast<std::size_t>(n.B) * 2 * scan_slots(n) * static_cast<std::size_t>(n.dv) * n.dk;
}

// The staged layout when it fits the device, else the state (and ∂A's partial sums) in global
// memory (smem_request).
template <typename S>
int mamba_forward(const MambaFwdArgs<S>& a, int threads, cudaStream_t stream) {
  const std::size_t smem = smem_request("mamba", a.n, sizeof(S), false, device_smem_optin());
  const bool stage = smem == mamba_smem_bytes(a.n, sizeof(S), false, true);
  return launch_per_head(selective_scan_forward_kernel<S>, a.n, smem, launch_threads(a.n.dk, a.n.dv, threads),
                         stream, a, stage);
}

template <typename S>
int mamba_backward(const MambaBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  const std::size_t smem = smem_request("mamba", a.n, sizeof(S), true, device_smem_optin());
  const bool stage = smem == mamba_smem_bytes(a.n, sizeof(S), true, true);
  const int err = launch_per_head(selective_scan_backward_kernel<S>, a.n, smem,
                                  launch_threads(a.n.dk, a.n.dv, threads), stream, a, work, stage);
  if (err != 0) return err;
  return launch_batch_sum(a.gA_part, a.gA, a.n.B, 1, a.n.dv * a.n.dk, stream);
}

#define RFWP_INSTANTIATE(S)                                                          \
  template int mamba_forward<S>(const MambaFwdArgs<S>&, int, cudaStream_t);          \
  template int mamba_backward<S>(const MambaBwdArgs<S>&, S*, int, cudaStream_t);
RFWP_INSTANTIATE(float)
RFWP_INSTANTIATE(double)
#undef RFWP_INSTANTIATE

}  // namespace cuda
}  // namespace rfwp
