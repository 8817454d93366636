// CUDA kernels of the Linear Transformer (RFWP paper Eq. 6-7) and Delta Net (RFWP Eq. 8-10)
// recurrences, forward and backward. One block per (batch, head); see common.cuh for the
// thread layout. The fast weights of the block live in shared memory for the whole sequence.
#include <string>

#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

// Forward. Per step t, after one barrier (the step's vectors, prefetched into registers
// during step t-1, are in shared memory):
//   row phase (each element owned by one lane of its row's group, so no barrier guards W):
//     W_ij += u_{t-1,i} k_{t-1,j} (the write of step t-1, deferred), zero on a reset; then
//     v̄_i = W_i . k, (W q)_i, k . q reduced over the row's lanes; u_i = β (v_i - v̄_i)
//     (delta) or v_i (lt); y_i = (W q)_i + u_i (k . q), which is W_t q (RFWP Eq. 7) without
//     a second pass.
// Step buffers rotate over three slots (a slot is rewritten two barriers after its last
// read) and u over two. When gradients are needed (chunk > 0) the forward keeps the initial
// state and, for delta, u_t and v_t - v̄_t (fastweight_params.h): no fast-weight checkpoints.
template <typename S, bool DELTA>
RFWP_KERNEL delta_forward_kernel(DeltaFwdArgs<S> a) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int dk = n.dk, dv = n.dv, ld = padded_ld(dk), mat = dv * dk;
  const int L = 2 * dk + dv + (DELTA ? 1 : 0);   // step buffer: k | q | v | beta
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* W = cur.mat(dv, dk);
  S* sbuf = cur.take(3 * static_cast<std::size_t>(L));
  S* us = cur.take(2 * static_cast<std::size_t>(dv));
  const Lanes rows(dv, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  auto segs = [&](auto&& f) {
    f(per_step(a.k, blk, dk));
    f(per_step(a.q, blk, dk));
    f(per_step(a.v, blk, dv));
    if constexpr (DELTA) f(per_step(a.beta, blk, 1));
  };
  StepVectors<S> step(segs, tid, nt);

  const S* W0 = a.W0 + blk.mat(mat);
  S* W0_kept = n.chunk > 0 ? a.ckpt + blk.mat(mat) : nullptr;
  const std::size_t saved_ud = static_cast<std::size_t>(n.B) * n.H * mat;
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int j = rows.lane; j < dk; j += rows.width) {
      W[i * ld + j] = W0[i * dk + j];
      if (W0_kept != nullptr) W0_kept[i * dk + j] = W0[i * dk + j];
    }
  if (n.T > 0) step.fetch(0);
  for (int t = 0; t < n.T; ++t) {
    S* vec = sbuf + (t % 3) * L;
    const S* kp = sbuf + ((t + 2) % 3) * L;         // k_{t-1}
    step.store(t, vec, segs, tid, nt);
    if (t + 1 < n.T) step.fetch(t + 1);
    const bool rst = flags.at(t);
    S* ud = (DELTA && n.chunk > 0) ? a.ckpt + saved_ud + blk.vec(t, 2 * dv) : nullptr;
    const S* u_prev = us + ((t + 1) & 1) * dv;
    S* u_cur = us + (t & 1) * dv;
    S* y = a.y + blk.vec(t, dv);
    __syncthreads();   // the step's vectors are in shared memory
    const S* kc = vec;
    const S* qc = vec + dk;
    const S* vc = vec + 2 * dk;
    const S beta = DELTA ? vec[2 * dk + dv] : S(1);
    for (int i0 = 0; i0 < dv; i0 += rows.groups) {
      const int i = i0 + rows.group;
      S vb = 0, wq = 0, kq = 0;
      if (i < dv) {
        S* Wi = W + i * ld;
        const S up = t > 0 ? u_prev[i] : S(0);
        for (int j = rows.lane; j < dk; j += rows.width) {
          S w = Wi[j];
          if (t > 0) w += up * kp[j];                // RFWP Eq. 6 / 8: the write of step t-1
          if (rst) w = S(0);
          Wi[j] = w;
          vb += w * kc[j];                           // RFWP Eq. 10: v̄ = W_{t-1} k
          wq += w * qc[j];
          kq += kc[j] * qc[j];
        }
      }
      vb = group_sum(vb, rows.width);
      wq = group_sum(wq, rows.width);
      kq = group_sum(kq, rows.width);
      if (i < dv && rows.lane == 0) {
        const S u = DELTA ? beta * (vc[i] - vb) : vc[i];
        u_cur[i] = u;
        y[i] = wq + u * kq;                          // RFWP Eq. 7: y = W_t q
        if (ud != nullptr) {
          ud[i] = u;
          ud[dv + i] = vc[i] - vb;
        }
      }
    }
  }
  __syncthreads();   // u of the last step (written by lane 0 of each group)
  const S* kl = sbuf + ((n.T + 2) % 3) * L;
  const S* ul = us + ((n.T + 1) & 1) * dv;
  S* Wout = a.W + blk.mat(mat);
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int j = rows.lane; j < dk; j += rows.width)
      Wout[i * dk + j] = n.T > 0 ? W[i * ld + j] + ul[i] * kl[j] : W[i * ld + j];
}

// Backward in two sweeps, without checkpoints (the DeltaNet gradient of RFWP Eq. 8-10 split
// as in fused-recurrent DeltaNet kernels): with W_t = W'_t + u_t k_tᵀ, W'_t the state after the
// reset of step t, u_t = β (v_t - W'_t k_t),
//   reverse sweep, G = dL/dW_t in shared memory (rows owned as W in the forward):
//     Row(t): G_ij = [G_ij + gv̄_{t+1,i} k_{t+1,j}, or 0 on a reset at t+1] + gy_i q_j
//             (finishing step t+1, then the read y_t = W_t q_t); gu_i = G_i . k_t;
//             gv_i = β gu_i, gv̄_i = -β gu_i (lt: gv_i = gu_i); gβ = Σ_i gu_i (v_i - v̄_i);
//     Col(t): gk_j = Σ_i G_ij u_i (the W'_t part is added by the forward sweep);
//   then dL/dW_0 = G + gv̄_0 ⊗ k_0 (0 if step 0 resets);
//   forward sweep, W'_t transposed in shared memory (row j of Wᵀ owned by one lane group,
//     so the update needs no barrier and W'ᵀx is a row reduction), one barrier per step:
//     W'_t = [W'_{t-1} + u_{t-1} k_{t-1}ᵀ, or 0 on a reset]; gq_j = (W'ᵀ gy)_j + k_j (u . gy)
//     (= (W_tᵀ gy)_j); gk_j += (W'ᵀ gv̄)_j with gv̄ = -gv read back from the output.
// Kept from the forward: W_0 and (u_t, v_t - v̄_t); no fast-weight state is stored per step.
template <typename S, bool DELTA>
RFWP_KERNEL delta_backward_kernel(DeltaBwdArgs<S> a) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, warp = tid / kWarp, wl = tid & (kWarp - 1);
  const int dk = n.dk, dv = n.dv, ld = padded_ld(dk), ldT = padded_ld(dv), mat = dv * dk;
  const int Lb = 2 * dk + 3 * dv + 1;   // reverse: k | q | gy | u | d | beta; forward: k | gy | u | gv
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* M = cur.take(dv * ld > dk * ldT ? static_cast<std::size_t>(dv) * ld : static_cast<std::size_t>(dk) * ldT);
  S* sb = cur.take(3 * static_cast<std::size_t>(Lb));
  S* gvb = cur.take(2 * static_cast<std::size_t>(dv));     // gv̄ of steps t and t+1
  S* gbp = cur.take(dv);                                   // gu_i (v_i - v̄_i)
  const Lanes rows(dv, nt, tid), cols(dk, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  const S* ud = a.ckpt + static_cast<std::size_t>(n.B) * n.H * mat;   // (u, v - v̄) [T, B, H, 2, dv]

  // ---- reverse sweep
  S* G = M;
  const S* gW = a.gW != nullptr ? a.gW + blk.mat(mat) : nullptr;
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int j = rows.lane; j < dk; j += rows.width) G[i * ld + j] = gW != nullptr ? gW[i * dk + j] : S(0);
  {
    auto segs = [&](auto&& f) {
      f(per_step(a.k, blk, dk));
      f(per_step(a.q, blk, dk));
      f(per_step(a.gy, blk, dv));
      if constexpr (DELTA) {
        f(Segment<S>{ud + static_cast<std::size_t>(blk.bh) * 2 * dv, blk.BH * 2 * dv, dv, 0});        // u_t
        f(Segment<S>{ud + static_cast<std::size_t>(blk.bh) * 2 * dv + dv, blk.BH * 2 * dv, dv, 0});   // v_t - v̄_t
        f(per_step(a.beta, blk, 1));
      } else {
        f(per_step(a.v, blk, dv));                   // u_t = v_t
      }
    };
    StepVectors<S> step(segs, tid, nt);
    if (n.T > 0) step.fetch(n.T - 1);
    for (int t = n.T - 1; t >= 0; --t) {
      S* vec = sb + (t % 3) * Lb;
      const S* kn = sb + ((t + 1) % 3) * Lb;         // k_{t+1}
      step.store(t, vec, segs, tid, nt);
      if (t > 0) step.fetch(t - 1);
      const bool has_next = t + 1 < n.T;
      const bool rst_next = flags.at(t + 1);
      const S* gvb_next = gvb + ((t + 1) & 1) * dv;
      S* gvb_cur = gvb + (t & 1) * dv;
      __syncthreads();
      const S *kc = vec, *qc = vec + dk, *gyc = vec + 2 * dk, *uc = vec + 2 * dk + dv;
      const S beta = DELTA ? vec[2 * dk + 3 * dv] : S(1);
      for (int i0 = 0; i0 < dv; i0 += rows.groups) {
        const int i = i0 + rows.group;
        S gu = 0;
        if (i < dv) {
          S* Gi = G + i * ld;
          const S g = gyc[i], gn = (DELTA && has_next) ? gvb_next[i] : S(0);
          for (int j = rows.lane; j < dk; j += rows.width) {
            S x = Gi[j];
            if (has_next) x = rst_next ? S(0) : (DELTA ? x + gn * kn[j] : x);   // no gradient crosses a reset
            x += g * qc[j];                            // the read y_t = W_t q_t
            Gi[j] = x;
            gu += x * kc[j];
          }
        }
        gu = group_sum(gu, rows.width);
        if (i < dv && rows.lane == 0) {
          gvb_cur[i] = DELTA ? -beta * gu : S(0);
          a.gv[blk.vec(t, dv) + i] = DELTA ? beta * gu : gu;
          if (DELTA) gbp[i] = gu * vec[2 * dk + 2 * dv + i];
        }
      }
      __syncthreads();
      for (int j0 = 0; j0 < dk; j0 += cols.groups) {
        const int j = j0 + cols.group;
        S gk = 0;
        if (j < dk)
          for (int i = cols.lane; i < dv; i += cols.width) gk += G[i * ld + j] * uc[i];
        gk = group_sum(gk, cols.width);
        if (j < dk && cols.lane == 0) a.gk[blk.vec(t, dk) + j] = gk;
      }
      if (DELTA && warp == 0) {
        S gb = 0;
        for (int i = wl; i < dv; i += kWarp) gb += gbp[i];
        gb = warp_sum(gb);
        if (wl == 0) a.gbeta[blk.scal(t)] = gb;
      }
    }
  }
  __syncthreads();   // gv̄_0 and G of the last row phase
  {
    // finish step 0: dL/dW'_0 = G + gv̄_0 ⊗ k_0, and W'_0 = 0 after a reset at step 0
    const bool rst0 = flags.at(0);
    const S* k0 = sb;
    S* gW0 = a.gW0 + blk.mat(mat);
    for (int i = rows.group; i < dv; i += rows.groups)
      for (int j = rows.lane; j < dk; j += rows.width) {
        S g = G[i * ld + j];
        if (n.T > 0) g = rst0 ? S(0) : (DELTA ? g + gvb[i] * k0[j] : g);
        gW0[i * dk + j] = g;
      }
  }
  if (n.T == 0) return;
  __syncthreads();   // G is read; its memory becomes Wᵀ
  // ---- forward sweep: Wᵀ [dk, dv], row j owned by the lanes of group j
  S* WT = M;
  const S* W0 = a.ckpt + blk.mat(mat);               // the initial state kept by the forward
  for (int j = cols.group; j < dk; j += cols.groups)
    for (int i = cols.lane; i < dv; i += cols.width) WT[j * ldT + i] = W0[i * dk + j];
  {
    auto segs = [&](auto&& f) {
      f(per_step(a.k, blk, dk));
      f(per_step(a.gy, blk, dv));
      if constexpr (DELTA) {
        f(Segment<S>{ud + static_cast<std::size_t>(blk.bh) * 2 * dv, blk.BH * 2 * dv, dv, 0});   // u_t
        f(per_step(static_cast<const S*>(a.gv), blk, dv));                                      // -gv̄_t
      } else {
        f(per_step(a.v, blk, dv));
      }
    };
    StepVectors<S> step(segs, tid, nt);
    step.fetch(0);
    for (int t = 0; t < n.T; ++t) {
      S* vec = sb + (t % 3) * Lb;
      const S* pv = sb + ((t + 2) % 3) * Lb;         // step t-1
      step.store(t, vec, segs, tid, nt);
      if (t + 1 < n.T) step.fetch(t + 1);
      const bool rst = flags.at(t);
      __syncthreads();
      const S *kc = vec, *gyc = vec + dk, *uc = vec + dk + dv, *gvc = vec + dk + 2 * dv;
      const S *kp = pv, *up = pv + dk + dv;
      const S ugy = warp_dot(uc, gyc, dv, wl);       // u . gy, by every warp
      for (int j0 = 0; j0 < dk; j0 += cols.groups) {
        const int j = j0 + cols.group;
        S sq = 0, sk = 0;
        if (j < dk) {
          S* WTj = WT + j * ldT;
          const S kpj = t > 0 ? kp[j] : S(0);
          for (int i = cols.lane; i < dv; i += cols.width) {
            S w = WTj[i];
            if (t > 0) w += up[i] * kpj;             // the write of step t-1 (RFWP Eq. 8)
            if (rst) w = S(0);
            WTj[i] = w;                              // W'_t
            sq += w * gyc[i];
            if (DELTA) sk -= w * gvc[i];             // gv̄ = -gv
          }
        }
        sq = group_sum(sq, cols.width);
        if (DELTA) sk = group_sum(sk, cols.width);
        if (j < dk && cols.lane == 0) {
          a.gq[blk.vec(t, dk) + j] = sq + kc[j] * ugy;   // W_tᵀ gy = W'ᵀ gy + k (u . gy)
          if (DELTA) a.gk[blk.vec(t, dk) + j] += sk;
        }
      }
    }
  }
}

}  // namespace

int default_threads(int dk, int dv) { return launch_threads_for(dk, dv, 0); }
int launch_threads(int dk, int dv, int threads) { return launch_threads_for(dk, dv, threads); }

std::size_t lt_delta_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool /*stage*/) {
  SmemSize s;
  if (backward) {   // G [dv, dk], then Wᵀ [dk, dv] in the same memory
    const std::size_t g = static_cast<std::size_t>(n.dv) * padded_ld(n.dk);
    const std::size_t wt = static_cast<std::size_t>(n.dk) * padded_ld(n.dv);
    s.vec(static_cast<long long>(g > wt ? g : wt)).vec(3LL * (2 * n.dk + 3 * n.dv + 1)).vec(3LL * n.dv);
  } else {
    s.mat(n.dv, n.dk).vec(3LL * (2 * n.dk + n.dv + 1)).vec(2LL * n.dv);
  }
  return s.n * elem;
}

std::size_t lt_delta_workspace_elems(const Dims&) { return 0; }   // two sweeps: no workspace

std::size_t device_smem_optin() {
  int dev = 0, limit = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<std::size_t>(limit);
}

std::size_t smem_request(const char* op, const Dims& n, std::size_t elem, bool backward, std::size_t optin) {
  auto pick = [&](std::size_t (*size)(const Dims&, std::size_t, bool, bool)) {
    const std::size_t full = size(n, elem, backward, true);
    return (optin == 0 || full <= optin) ? full : size(n, elem, backward, false);
  };
  const std::string name(op);
  if (name == "lt" || name == "delta") return pick(lt_delta_smem_bytes);
  if (name == "delta_rnn") return pick(delta_rnn_smem_bytes);
  if (name == "rdn") return pick(rdn_smem_bytes);
  if (name == "gated_delta" || name == "delta_product") return pick(product_smem_bytes);
  if (name == "srwm") return pick(srwm_smem_bytes);
  if (name == "mamba") return pick(mamba_smem_bytes);
  return 0;
}

namespace {

template <typename S, bool DELTA>
int forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream) {
  return launch_per_head(delta_forward_kernel<S, DELTA>, a.n, lt_delta_smem_bytes(a.n, sizeof(S), false, false),
                         launch_threads(a.n.dk, a.n.dv, threads), stream, a);
}

template <typename S, bool DELTA>
int backward(const DeltaBwdArgs<S>& a, S* /*work*/, int threads, cudaStream_t stream) {
  return launch_per_head(delta_backward_kernel<S, DELTA>, a.n, lt_delta_smem_bytes(a.n, sizeof(S), true, false),
                         launch_threads(a.n.dk, a.n.dv, threads), stream, a);
}

}  // namespace

template <typename S>
int lt_forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream) { return forward<S, false>(a, threads, stream); }
template <typename S>
int delta_forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream) { return forward<S, true>(a, threads, stream); }
template <typename S>
int lt_backward(const DeltaBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  return backward<S, false>(a, work, threads, stream);
}
template <typename S>
int delta_backward(const DeltaBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  return backward<S, true>(a, work, threads, stream);
}

#define RFWP_INSTANTIATE(S)                                                              \
  template int lt_forward<S>(const DeltaFwdArgs<S>&, int, cudaStream_t);                 \
  template int delta_forward<S>(const DeltaFwdArgs<S>&, int, cudaStream_t);              \
  template int lt_backward<S>(const DeltaBwdArgs<S>&, S*, int, cudaStream_t);            \
  template int delta_backward<S>(const DeltaBwdArgs<S>&, S*, int, cudaStream_t);
RFWP_INSTANTIATE(float)
RFWP_INSTANTIATE(double)
#undef RFWP_INSTANTIATE

}  // namespace cuda
}  // namespace rfwp
