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
//     W_ij += u_{t-1,i} k_{t-1,j} (the write of step t-1, deferred), checkpoint when
//     t % chunk == 0, zero on a reset; then v̄_i = W_i . k, (W q)_i, k . q reduced over the
//     row's lanes; u_i = β (v_i - v̄_i) (delta) or v_i (lt); y_i = (W q)_i + u_i (k . q),
//     which is W_t q (RFWP Eq. 7) without a second pass.
// Step buffers rotate over three slots (a slot is rewritten two barriers after its last
// read) and u over two.
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
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int j = rows.lane; j < dk; j += rows.width) W[i * ld + j] = W0[i * dk + j];
  if (n.T > 0) step.fetch(0);
  for (int t = 0; t < n.T; ++t) {
    S* vec = sbuf + (t % 3) * L;
    const S* kp = sbuf + ((t + 2) % 3) * L;         // k_{t-1}
    step.store(t, vec, segs, tid, nt);
    if (t + 1 < n.T) step.fetch(t + 1);
    const bool rst = flags.at(t);
    S* ckpt = (n.chunk > 0 && t % n.chunk == 0) ? a.ckpt + blk.ckpt(t / n.chunk, mat) : nullptr;
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
          if (ckpt != nullptr) ckpt[i * dk + j] = w;
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

// Backward. For each checkpoint chunk, last to first:
//   recompute (one barrier per step, as the forward): from the checkpoint, the states
//     W'_t (after the reset of step t, before its write) into the workspace, and u_t,
//     v_t - v̄_t; the running state is in shared memory when `stage` (else re-read from the
//     workspace, by the lane that wrote it);
//   reverse, per step t (G = dL/dW_t in shared memory, owned like W in the forward):
//     Row(t): G_ij = [G_ij + gv̄_{t+1,i} k_{t+1,j}, or 0 on a reset at t+1] + gy_i q_j
//             (finishing step t+1, then the read y_t = W_t q_t); gu_i = G_i . k_t;
//             gv_i = β gu_i, gv̄_i = -β gu_i (lt: gv_i = gu_i);
//     Col(t): gk_j = Σ_i G_ij u_i + W'_ij gv̄_i,  gq_j = Σ_i W'_ij gy_i + k_j (u . gy)
//             (W'_t read from the workspace); one warp: gβ = Σ_i gu_i (v_i - v̄_i).
template <typename S, bool DELTA>
RFWP_KERNEL delta_backward_kernel(DeltaBwdArgs<S> a, S* work, bool stage) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, warp = tid / kWarp, wl = tid & (kWarp - 1);
  const int dk = n.dk, dv = n.dv, ld = padded_ld(dk), C = n.chunk, mat = dv * dk;
  const int Lr = dk + dv + (DELTA ? 1 : 0);                 // recompute: k | v | beta
  const int Lb = 2 * dk + (DELTA ? 3 : 2) * dv + (DELTA ? 1 : 0);   // k | q | gy | u | (d | beta)
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* G = cur.mat(dv, dk);
  S* Wr = stage ? cur.mat(dv, dk) : nullptr;
  S* rr = cur.take(3 * static_cast<std::size_t>(Lr));
  S* sb = cur.take(3 * static_cast<std::size_t>(Lb));
  S* us = cur.take(2 * static_cast<std::size_t>(dv));      // u of the recompute (two steps)
  S* gvb = cur.take(2 * static_cast<std::size_t>(dv));     // gv̄ of steps t and t+1
  S* gbp = cur.take(dv);                                   // gu_i (v_i - v̄_i)
  const Lanes rows(dv, nt, tid), cols(dk, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  // workspace of this block: W' [C, dv, dk], then (u, v - v̄) [C, 2, dv]
  S* wbuf = work + static_cast<std::size_t>(blk.bh) * C * (static_cast<std::size_t>(mat) + 2 * dv);
  S* vbuf = wbuf + static_cast<std::size_t>(C) * mat;

  const S* gW = a.gW != nullptr ? a.gW + blk.mat(mat) : nullptr;
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int j = rows.lane; j < dk; j += rows.width) G[i * ld + j] = gW != nullptr ? gW[i * dk + j] : S(0);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    __syncthreads();   // the previous chunk's column phase has read the workspace
    // ---- recompute the chunk
    {
      auto rsegs = [&](auto&& f) {
        f(per_step(a.k, blk, dk));
        f(per_step(a.v, blk, dv));
        if constexpr (DELTA) f(per_step(a.beta, blk, 1));
      };
      StepVectors<S> rstep(rsegs, tid, nt);
      const S* ck = a.ckpt + blk.ckpt(c, mat);
      rstep.fetch(t0);
      for (int t = t0; t < t1; ++t) {
        const int jt = t - t0;
        S* vec = rr + (jt % 3) * Lr;
        const S* kp = rr + ((jt + 2) % 3) * Lr;
        rstep.store(t, vec, rsegs, tid, nt);
        if (t + 1 < t1) rstep.fetch(t + 1);
        const bool rst = flags.at(t);
        const S* u_prev = us + ((jt + 1) & 1) * dv;
        S* u_cur = us + (jt & 1) * dv;
        S* wt = wbuf + static_cast<std::size_t>(jt) * mat;
        const S* wprev = jt > 0 ? wt - mat : wt;
        __syncthreads();
        const S* kc = vec;
        const S* vc = vec + dk;
        const S beta = DELTA ? vec[dk + dv] : S(1);
        for (int i0 = 0; i0 < dv; i0 += rows.groups) {
          const int i = i0 + rows.group;
          S vb = 0;
          if (i < dv) {
            const S up = jt > 0 ? u_prev[i] : S(0);
            for (int j = rows.lane; j < dk; j += rows.width) {
              S w;
              if (jt == 0) w = ck[i * dk + j];
              else w = (Wr != nullptr ? Wr[i * ld + j] : wprev[i * dk + j]) + up * kp[j];
              if (rst) w = S(0);
              if (Wr != nullptr) Wr[i * ld + j] = w;
              wt[i * dk + j] = w;
              if (DELTA) vb += w * kc[j];
            }
          }
          if (DELTA) vb = group_sum(vb, rows.width);
          if (i < dv && rows.lane == 0) {
            const S diff = vc[i] - vb;
            const S u = DELTA ? beta * diff : vc[i];
            u_cur[i] = u;
            if (DELTA) {
              vbuf[(2 * jt) * dv + i] = u;
              vbuf[(2 * jt + 1) * dv + i] = diff;
            }
          }
        }
      }
    }
    __syncthreads();   // u, v - v̄ of the chunk's last step, read by other threads below
    // ---- walk the chunk backwards
    auto segs = [&](auto&& f) {
      f(per_step(a.k, blk, dk));
      f(per_step(a.q, blk, dk));
      f(per_step(a.gy, blk, dv));
      if constexpr (DELTA) {
        f(Segment<S>{vbuf, 2 * dv, dv, t0});        // u_t
        f(Segment<S>{vbuf + dv, 2 * dv, dv, t0});   // v_t - v̄_t
        f(per_step(a.beta, blk, 1));
      } else {
        f(per_step(a.v, blk, dv));                   // u_t = v_t
      }
    };
    StepVectors<S> step(segs, tid, nt);
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      S* vec = sb + (t % 3) * Lb;
      const S* kn = sb + ((t + 1) % 3) * Lb;             // k_{t+1}
      step.store(t, vec, segs, tid, nt);
      if (t - 1 >= t0) step.fetch(t - 1);
      const bool has_next = t + 1 < n.T;
      const bool rst_next = flags.at(t + 1);
      const S* gvb_next = gvb + ((t + 1) & 1) * dv;
      S* gvb_cur = gvb + (t & 1) * dv;
      __syncthreads();
      const S* kc = vec;
      const S* qc = vec + dk;
      const S* gyc = vec + 2 * dk;
      const S* uc = vec + 2 * dk + dv;
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
      const S ugy = warp_dot(uc, gyc, dv, wl);         // u . gy, by every warp
      const S* wt = wbuf + static_cast<std::size_t>(jt) * mat;
      for (int j0 = 0; j0 < dk; j0 += cols.groups) {
        const int j = j0 + cols.group;
        S gk = 0, gq = 0;
        if (j < dk) {
          for (int i = cols.lane; i < dv; i += cols.width) {
            const S w = wt[i * dk + j];
            gk += G[i * ld + j] * uc[i];
            if (DELTA) gk += w * gvb_cur[i];
            gq += w * gyc[i];
          }
        }
        gk = group_sum(gk, cols.width);
        gq = group_sum(gq, cols.width);
        if (j < dk && cols.lane == 0) {
          a.gk[blk.vec(t, dk) + j] = gk;
          a.gq[blk.vec(t, dk) + j] = gq + kc[j] * ugy;
        }
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

}  // namespace

int default_threads(int dk, int dv) { return launch_threads_for(dk, dv, 0); }
int launch_threads(int dk, int dv, int threads) { return launch_threads_for(dk, dv, threads); }

std::size_t lt_delta_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage) {
  SmemSize s;
  if (backward) {
    s.mat(n.dv, n.dk);
    if (stage) s.mat(n.dv, n.dk);
    s.vec(3LL * (n.dk + n.dv + 1)).vec(3LL * (2 * n.dk + 3 * n.dv + 1)).vec(5LL * n.dv);
  } else {
    s.mat(n.dv, n.dk).vec(3LL * (2 * n.dk + n.dv + 1)).vec(2LL * n.dv);
  }
  return s.n * elem;
}

std::size_t lt_delta_workspace_elems(const Dims& n) {
  return static_cast<std::size_t>(n.B) * n.H * n.chunk *
         (static_cast<std::size_t>(n.dv) * n.dk + 2 * static_cast<std::size_t>(n.dv));
}

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
  return 0;
}

namespace {

template <typename S, bool DELTA>
int forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream) {
  return launch_per_head(delta_forward_kernel<S, DELTA>, a.n, lt_delta_smem_bytes(a.n, sizeof(S), false, false),
                         launch_threads(a.n.dk, a.n.dv, threads), stream, a);
}

template <typename S, bool DELTA>
int backward(const DeltaBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  const std::size_t smem = smem_request("delta", a.n, sizeof(S), true, device_smem_optin());
  const bool stage = smem == lt_delta_smem_bytes(a.n, sizeof(S), true, true);
  return launch_per_head(delta_backward_kernel<S, DELTA>, a.n, smem, launch_threads(a.n.dk, a.n.dv, threads),
                         stream, a, work, stage);
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
