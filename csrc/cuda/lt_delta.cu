// CUDA kernels of the Linear Transformer (RFWP paper Eq. 6-7) and Delta Net (RFWP Eq. 8-10)
// recurrences, forward and backward. One block per (batch, head); see common.cuh for the
// thread layout. The fast weights of the block live in shared memory for the whole sequence.
#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

// Forward. Per step t, two phases separated by __syncthreads:
//   P(t) element loop: apply the write of step t-1 (W += u_{t-1} ⊗ k_{t-1}), store the
//        checkpoint when t % chunk == 0, apply the reset; load k_t, q_t, v_t, β_t.
//   R(t) row loop:     v̄_i = W_i . k, u_i = β (v_i - v̄_i) (delta) or v_i (lt),
//                      y_i = W_i . q + u_i (k . q)  (= (W + u ⊗ k)_i . q, RFWP Eq. 7).
// k is double-buffered because P(t) reads k_{t-1} while loading k_t.
template <typename S, bool DELTA>
__global__ void delta_forward_kernel(DeltaFwdArgs<S> a) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int dk = n.dk, dv = n.dv, ld = padded_ld(dk);
  const std::size_t mat = static_cast<std::size_t>(dv) * dk;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* W = cur.take(static_cast<std::size_t>(dv) * ld);
  S* kbuf = cur.take(2 * dk);
  S* qs = cur.take(dk);
  S* vs = cur.take(dv);
  S* us = cur.take(dv);
  __shared__ S s_beta;

  for (std::size_t e = tid; e < mat; e += nt) W[(e / dk) * ld + e % dk] = a.W0[blk.mat(mat) + e];
  for (int t = 0; t < n.T; ++t) {
    S* kc = kbuf + (t & 1) * dk;
    const S* kp = kbuf + ((t + 1) & 1) * dk;
    const bool rst = blk.reset(a.reset, t);
    for (std::size_t e = tid; e < mat; e += nt) {
      const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
      S w = W[i * ld + j];
      if (t > 0) w += us[i] * kp[j];                 // RFWP Eq. 6 / 8: the write of step t-1
      if (n.chunk > 0 && t % n.chunk == 0) a.ckpt[blk.ckpt(t / n.chunk, mat) + e] = w;
      if (rst) w = S(0);
      W[i * ld + j] = w;
    }
    for (int j = tid; j < dk; j += nt) {
      kc[j] = a.k[blk.vec(t, dk) + j];
      qs[j] = a.q[blk.vec(t, dk) + j];
    }
    for (int i = tid; i < dv; i += nt) vs[i] = a.v[blk.vec(t, dv) + i];
    if (tid == 0) s_beta = DELTA ? a.beta[blk.scal(t)] : S(1);
    __syncthreads();
    for (int i = tid; i < dv; i += nt) {
      const S* Wi = W + i * ld;
      S vb = 0, wq = 0, kq = 0;
      for (int j = 0; j < dk; ++j) {
        vb += Wi[j] * kc[j];                         // RFWP Eq. 10: v̄ = W_{t-1} k
        wq += Wi[j] * qs[j];
        kq += kc[j] * qs[j];
      }
      const S u = DELTA ? s_beta * (vs[i] - vb) : vs[i];
      us[i] = u;
      a.y[blk.vec(t, dv) + i] = wq + u * kq;         // RFWP Eq. 7: y = W_t q
    }
    __syncthreads();
  }
  const S* klast = kbuf + ((n.T - 1) & 1) * dk;
  for (std::size_t e = tid; e < mat; e += nt) {
    const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
    a.W[blk.mat(mat) + e] = W[i * ld + j] + us[i] * klast[j];
  }
}

// Backward. For each checkpoint chunk, last to first:
//   recompute: from the checkpoint, run the forward writes of the chunk, storing W'_t (state
//              after the reset, before the write of step t), u_t and v_t - v̄_t in the
//              workspace (same two phases as the forward);
//   reverse:   per step t (G = dL/dW_t in shared memory):
//     L(t) element loop: G += gv̄_{t+1} ⊗ k_{t+1}, zero G if reset at t+1 (finishing step
//          t+1); copy W'_t into shared memory; load the step's vectors;
//     Row(t): G_i += gy_i q (the read y = W_t q), gu_i = G_i . k, gv_i = β gu_i,
//             gv̄_i = -β gu_i  (lt: gv_i = gu_i, no v̄);
//     Col(t): gk_j = Σ_i G_ij u_i + W'_ij gv̄_i,  gq_j = Σ_i W'_ij gy_i + k_j (u . gy);
//             thread 0: gβ = Σ_i gu_i (v_i - v̄_i).
template <typename S, bool DELTA>
__global__ void delta_backward_kernel(DeltaBwdArgs<S> a, S* work) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int dk = n.dk, dv = n.dv, ld = padded_ld(dk), C = n.chunk;
  const std::size_t mat = static_cast<std::size_t>(dv) * dk;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* G = cur.take(static_cast<std::size_t>(dv) * ld);
  S* Wr = cur.take(static_cast<std::size_t>(dv) * ld);   // running W (recompute), then W'_t
  S* kbuf = cur.take(2 * dk);
  S* qs = cur.take(dk);
  S* vs = cur.take(dv);
  S* us = cur.take(dv);
  S* ds = cur.take(dv);
  S* gys = cur.take(dv);
  S* gus = cur.take(dv);
  S* gvb = cur.take(dv);
  __shared__ S s_beta;
  // workspace of this block: W' [C, dv, dk], then (u, v - v̄) [C, 2, dv]
  S* wbuf = work + static_cast<std::size_t>(blk.bh) * C * (mat + 2 * static_cast<std::size_t>(dv));
  S* vbuf = wbuf + static_cast<std::size_t>(C) * mat;

  for (std::size_t e = tid; e < mat; e += nt)
    G[(e / dk) * ld + e % dk] = a.gW != nullptr ? a.gW[blk.mat(mat) + e] : S(0);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    // ---- recompute the chunk
    for (std::size_t e = tid; e < mat; e += nt) Wr[(e / dk) * ld + e % dk] = a.ckpt[blk.ckpt(c, mat) + e];
    for (int t = t0; t < t1; ++t) {
      const int jt = t - t0;
      S* kc = kbuf + (t & 1) * dk;
      const S* kp = kbuf + ((t + 1) & 1) * dk;
      const bool rst = blk.reset(a.reset, t);
      for (std::size_t e = tid; e < mat; e += nt) {
        const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
        S w = Wr[i * ld + j];
        if (t > t0) w += us[i] * kp[j];
        if (rst) w = S(0);
        Wr[i * ld + j] = w;
        wbuf[jt * mat + e] = w;
      }
      for (int j = tid; j < dk; j += nt) kc[j] = a.k[blk.vec(t, dk) + j];
      for (int i = tid; i < dv; i += nt) vs[i] = a.v[blk.vec(t, dv) + i];
      if (tid == 0) s_beta = DELTA ? a.beta[blk.scal(t)] : S(1);
      __syncthreads();
      for (int i = tid; i < dv; i += nt) {
        S vb = 0;
        if (DELTA) {
          const S* Wi = Wr + i * ld;
          for (int j = 0; j < dk; ++j) vb += Wi[j] * kc[j];
        }
        const S diff = vs[i] - vb;
        const S u = DELTA ? s_beta * diff : vs[i];
        us[i] = u;
        vbuf[(2 * jt) * dv + i] = u;
        vbuf[(2 * jt + 1) * dv + i] = diff;
      }
      __syncthreads();
    }
    // ---- walk the chunk backwards
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      S* kc = kbuf + (t & 1) * dk;
      const S* kn = kbuf + ((t + 1) & 1) * dk;
      const bool rst_next = (t + 1 < t1) && blk.reset(a.reset, t + 1);
      for (std::size_t e = tid; e < mat; e += nt) {
        const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
        if (t + 1 < t1) {
          S g = G[i * ld + j];
          if (DELTA) g += gvb[i] * kn[j];            // dL/dW'_{t+1} = G + gv̄ ⊗ k
          G[i * ld + j] = rst_next ? S(0) : g;       // no gradient crosses a reset
        }
        Wr[i * ld + j] = wbuf[jt * mat + e];
      }
      for (int j = tid; j < dk; j += nt) {
        kc[j] = a.k[blk.vec(t, dk) + j];
        qs[j] = a.q[blk.vec(t, dk) + j];
      }
      for (int i = tid; i < dv; i += nt) {
        gys[i] = a.gy[blk.vec(t, dv) + i];
        us[i] = vbuf[(2 * jt) * dv + i];
        ds[i] = vbuf[(2 * jt + 1) * dv + i];
      }
      if (tid == 0) s_beta = DELTA ? a.beta[blk.scal(t)] : S(1);
      __syncthreads();
      for (int i = tid; i < dv; i += nt) {
        S* Gi = G + i * ld;
        const S g = gys[i];
        S gu = 0;
        for (int j = 0; j < dk; ++j) {
          const S v = Gi[j] + g * qs[j];
          Gi[j] = v;
          gu += v * kc[j];
        }
        gus[i] = gu;
        gvb[i] = DELTA ? -s_beta * gu : S(0);
        a.gv[blk.vec(t, dv) + i] = DELTA ? s_beta * gu : gu;
      }
      __syncthreads();
      for (int j = tid; j < dk; j += nt) {
        S gk = 0, gq = 0, ugy = 0;
        for (int i = 0; i < dv; ++i) {
          const S w = Wr[i * ld + j];
          gk += G[i * ld + j] * us[i] + w * gvb[i];
          gq += w * gys[i];
          ugy += us[i] * gys[i];
        }
        a.gk[blk.vec(t, dk) + j] = gk;
        a.gq[blk.vec(t, dk) + j] = gq + kc[j] * ugy;
      }
      if (DELTA && tid == 0) {
        S gb = 0;
        for (int i = 0; i < dv; ++i) gb += gus[i] * ds[i];
        a.gbeta[blk.scal(t)] = gb;
      }
      __syncthreads();
    }
    // finish step t0 of this chunk
    const bool rst0 = blk.reset(a.reset, t0);
    const S* k0 = kbuf + (t0 & 1) * dk;
    for (std::size_t e = tid; e < mat; e += nt) {
      const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
      S g = G[i * ld + j];
      if (DELTA) g += gvb[i] * k0[j];
      G[i * ld + j] = rst0 ? S(0) : g;
    }
    __syncthreads();
  }
  for (std::size_t e = tid; e < mat; e += nt) a.gW0[blk.mat(mat) + e] = G[(e / dk) * ld + e % dk];
}

}  // namespace

int default_threads(int dk, int dv) {
  const int cells = dk * dv;
  const int t = round_up(cells < 32 ? 32 : cells, 32);
  return t < 256 ? t : 256;
}

std::size_t lt_delta_smem_bytes(const Dims& n, std::size_t elem, bool backward) {
  SmemSize s;
  if (backward)
    s.mat(n.dv, n.dk).mat(n.dv, n.dk).vec(3 * n.dk).vec(6 * n.dv);
  else
    s.mat(n.dv, n.dk).vec(3 * n.dk).vec(2 * n.dv);
  return s.n * elem;
}

std::size_t lt_delta_workspace_elems(const Dims& n) {
  return static_cast<std::size_t>(n.B) * n.H * n.chunk *
         (static_cast<std::size_t>(n.dv) * n.dk + 2 * static_cast<std::size_t>(n.dv));
}

template <typename S>
int lt_forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream) {
  if (threads <= 0) threads = default_threads(a.n.dk, a.n.dv);
  return launch_per_head(delta_forward_kernel<S, false>, a.n,
                         lt_delta_smem_bytes(a.n, sizeof(S), false), threads, stream, a);
}
template <typename S>
int delta_forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream) {
  if (threads <= 0) threads = default_threads(a.n.dk, a.n.dv);
  return launch_per_head(delta_forward_kernel<S, true>, a.n,
                         lt_delta_smem_bytes(a.n, sizeof(S), false), threads, stream, a);
}

template <typename S>
int lt_backward(const DeltaBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  if (threads <= 0) threads = default_threads(a.n.dk, a.n.dv);
  return launch_per_head(delta_backward_kernel<S, false>, a.n,
                         lt_delta_smem_bytes(a.n, sizeof(S), true), threads, stream, a, work);
}
template <typename S>
int delta_backward(const DeltaBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  if (threads <= 0) threads = default_threads(a.n.dk, a.n.dv);
  return launch_per_head(delta_backward_kernel<S, true>, a.n,
                         lt_delta_smem_bytes(a.n, sizeof(S), true), threads, stream, a, work);
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
