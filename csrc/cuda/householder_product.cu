// CUDA kernels of the gated / multi-step delta rule shared by `gated_delta` (Gated DeltaNet,
// ICLR 2025, Eq. 10: a decay alpha_t, nh = 1) and `delta_product` (DeltaProduct, NeurIPS 2025,
// Sec. 3: no decay, nh Householder steps per input), forward and backward. One block per
// (batch, head); see common.cuh for the thread layout and cpu/householder_product_impl.h for
// the equations of the backward.
//
// Forward: the fast weights W [dv, dk] live in shared memory; every row evolves on its own
// within a step (decay, then per sub-step j: vb = W_i . k_j reduced over the row's lanes,
// u = beta_j (v_j - vb), W_i += u k_j; then y_i = W_i . q), so a lane only ever touches the
// elements it owns and the forward needs no barrier. Step vectors are read from global memory
// (every row reads the same k, q: cache hits). Shared memory: one matrix, whatever nh.
//
// Backward: for each checkpoint chunk, last to first:
//   recompute (row-owned, no barrier): per step the states W_{t-1} (after the reset),
//     P_1..P_{nh-1} and W_t into nh + 1 workspace slots, and u_j, v_j - vb_j;
//   reverse, per step t and sub-step j = nh-1..0 (G = dL/dP_{j+1} in shared memory):
//     Row:  G_i += gy_i q (last sub-step: the read);  gu_i = G_i . k_j;  gv_i = beta gu_i,
//           gvb_i = -beta gu_i, gu_i (v_i - vb_i) kept for gbeta;
//     Col:  gk_c = Σ_i G_ic u_i + P_ic gvb_i;  last sub-step: gq_c = Σ_i P_ic gy_i + k_c (u . gy)
//           (P = P_j, alpha W_{t-1} for j = 0);  one warp: gbeta = Σ_i gu_i (v_i - vb_i);
//     Row:  G_i += gvb_i k_j;  j = 0 with a decay: galpha = <G, W_{t-1}>, G = alpha G;
//           G = 0 after a reset at t (no gradient crosses it).
#include <string>

#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

// Offset of step t's j-th vector of a [T, B, H, nh, len] array.
__device__ inline std::size_t sub(const BlockIdx& blk, int t, int j, int nh, int len) {
  return blk.vec(t, nh * len) + static_cast<std::size_t>(j) * len;
}

template <typename S>
RFWP_KERNEL product_forward_kernel(ProductFwdArgs<S> a) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int dk = n.dk, dv = n.dv, ld = padded_ld(dk), mat = dv * dk, nh = a.nh;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* W = cur.mat(dv, dk);
  const Lanes rows(dv, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  const S* W0 = a.W0 + blk.mat(mat);
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int c = rows.lane; c < dk; c += rows.width) W[i * ld + c] = W0[i * dk + c];
  for (int t = 0; t < n.T; ++t) {
    const bool rst = flags.at(t);
    S* ckpt = (n.chunk > 0 && t % n.chunk == 0) ? a.ckpt + blk.ckpt(t / n.chunk, mat) : nullptr;
    const S alpha = a.alpha != nullptr ? a.alpha[blk.scal(t)] : S(1);
    const S* q = a.q + blk.vec(t, dk);
    for (int i0 = 0; i0 < dv; i0 += rows.groups) {
      const int i = i0 + rows.group;
      const bool on = i < dv;
      S* Wi = W + (on ? i : 0) * ld;
      if (on)
        for (int c = rows.lane; c < dk; c += rows.width) {
          S w = Wi[c];
          if (ckpt != nullptr) ckpt[i * dk + c] = w;
          Wi[c] = rst ? S(0) : alpha * w;              // Gated DeltaNet Eq. 10: the decay
        }
      for (int j = 0; j < nh; ++j) {
        const S* k = a.k + sub(blk, t, j, nh, dk);
        S vb = 0;
        if (on)
          for (int c = rows.lane; c < dk; c += rows.width) vb += Wi[c] * k[c];
        vb = group_sum(vb, rows.width);                // vb = P_{j-1} k_j
        if (on) {
          const S u = a.beta[blk.vec(t, nh) + j] * (a.v[sub(blk, t, j, nh, dv) + i] - vb);
          for (int c = rows.lane; c < dk; c += rows.width) Wi[c] += u * k[c];   // the delta rule
        }
      }
      S yq = 0;
      if (on)
        for (int c = rows.lane; c < dk; c += rows.width) yq += Wi[c] * q[c];
      yq = group_sum(yq, rows.width);
      if (on && rows.lane == 0) a.y[blk.vec(t, dv) + i] = yq;   // y_t = W_t q_t
    }
  }
  S* Wout = a.W + blk.mat(mat);
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int c = rows.lane; c < dk; c += rows.width) Wout[i * dk + c] = W[i * ld + c];
}

template <typename S>
RFWP_KERNEL product_backward_kernel(ProductBwdArgs<S> a, S* work) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, warp = tid / kWarp, wl = tid & (kWarp - 1);
  const int dk = n.dk, dv = n.dv, ld = padded_ld(dk), mat = dv * dk, nh = a.nh, C = n.chunk;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* G = cur.mat(dv, dk);
  S* gvb = cur.take(dv);
  S* gbp = cur.take(dv);
  S* gal = cur.take(dv);
  const Lanes rows(dv, nt, tid), cols(dk, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  // workspace of this block: per step nh + 1 matrices (W_{t-1}, P_1..P_{nh-1}, W_t), then
  // per step and sub-step (u, v - vb) [2][dv]
  const std::size_t per_step = static_cast<std::size_t>(nh + 1) * mat;
  S* slots = work + static_cast<std::size_t>(blk.bh) * C * (per_step + 2 * static_cast<std::size_t>(nh) * dv);
  S* uv = slots + static_cast<std::size_t>(C) * per_step;
  auto slot = [&](int jt, int j) { return slots + jt * per_step + static_cast<std::size_t>(j) * mat; };
  auto uvec = [&](int jt, int j) { return uv + (static_cast<std::size_t>(jt) * nh + j) * 2 * dv; };

  const S* gW = a.gW != nullptr ? a.gW + blk.mat(mat) : nullptr;
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int c = rows.lane; c < dk; c += rows.width) G[i * ld + c] = gW != nullptr ? gW[i * dk + c] : S(0);
  for (int ch = num_chunks(n.T, C) - 1; ch >= 0; --ch) {
    const int t0 = ch * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    __syncthreads();   // the previous chunk's column phases have read the workspace
    // ---- recompute the chunk (each lane reads back only what it wrote)
    const S* ck = a.ckpt + blk.ckpt(ch, mat);
    for (int t = t0; t < t1; ++t) {
      const int jt = t - t0;
      const bool rst = flags.at(t);
      const S alpha = a.alpha != nullptr ? a.alpha[blk.scal(t)] : S(1);
      for (int i0 = 0; i0 < dv; i0 += rows.groups) {
        const int i = i0 + rows.group;
        const bool on = i < dv;
        if (on)
          for (int c = rows.lane; c < dk; c += rows.width) {
            const S w = rst ? S(0) : (jt == 0 ? ck[i * dk + c] : slot(jt - 1, nh)[i * dk + c]);
            slot(jt, 0)[i * dk + c] = w;
          }
        for (int j = 0; j < nh; ++j) {
          const S* k = a.k + sub(blk, t, j, nh, dk);
          const S* P = slot(jt, j);
          const S ps = j == 0 ? alpha : S(1);
          S vb = 0;
          if (on)
            for (int c = rows.lane; c < dk; c += rows.width) vb += ps * P[i * dk + c] * k[c];
          vb = group_sum(vb, rows.width);
          if (on) {
            const S diff = a.v[sub(blk, t, j, nh, dv) + i] - vb;
            const S u = a.beta[blk.vec(t, nh) + j] * diff;
            S* next = slot(jt, j + 1);
            for (int c = rows.lane; c < dk; c += rows.width) next[i * dk + c] = ps * P[i * dk + c] + u * k[c];
            if (rows.lane == 0) {
              uvec(jt, j)[i] = u;
              uvec(jt, j)[dv + i] = diff;
            }
          }
        }
      }
    }
    // ---- walk the chunk backwards
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      const bool rst = flags.at(t);
      const S alpha = a.alpha != nullptr ? a.alpha[blk.scal(t)] : S(1);
      const S* q = a.q + blk.vec(t, dk);
      const S* gy = a.gy + blk.vec(t, dv);
      for (int j = nh - 1; j >= 0; --j) {
        const bool last = j == nh - 1;
        const S* k = a.k + sub(blk, t, j, nh, dk);
        const S beta = a.beta[blk.vec(t, nh) + j];
        const S* u = uvec(jt, j);
        const S* P = slot(jt, j);
        const S ps = j == 0 ? alpha : S(1);
        __syncthreads();   // u, diff of the recompute; the previous phase's reads of gvb, G
        for (int i0 = 0; i0 < dv; i0 += rows.groups) {
          const int i = i0 + rows.group;
          S gu = 0;
          if (i < dv) {
            S* Gi = G + i * ld;
            const S g = last ? gy[i] : S(0);
            for (int c = rows.lane; c < dk; c += rows.width) {
              const S x = Gi[c] + g * q[c];              // the read y_t = W_t q_t
              Gi[c] = x;
              gu += x * k[c];
            }
          }
          gu = group_sum(gu, rows.width);
          if (i < dv && rows.lane == 0) {
            gvb[i] = -beta * gu;
            a.gv[sub(blk, t, j, nh, dv) + i] = beta * gu;
            gbp[i] = gu * u[dv + i];
          }
        }
        __syncthreads();
        const S ugy = last ? warp_dot(u, gy, dv, wl) : S(0);   // u . gy, by every warp
        for (int c0 = 0; c0 < dk; c0 += cols.groups) {
          const int c = c0 + cols.group;
          S gk = 0, gq = 0;
          if (c < dk) {
            for (int i = cols.lane; i < dv; i += cols.width) {
              const S p = ps * P[i * dk + c];
              gk += G[i * ld + c] * u[i] + p * gvb[i];
              if (last) gq += p * gy[i];
            }
          }
          gk = group_sum(gk, cols.width);
          gq = group_sum(gq, cols.width);
          if (c < dk && cols.lane == 0) {
            a.gk[sub(blk, t, j, nh, dk) + c] = gk;
            if (last) a.gq[blk.vec(t, dk) + c] = gq + a.k[sub(blk, t, nh - 1, nh, dk) + c] * ugy;
          }
        }
        if (warp == 0) {
          S gb = 0;
          for (int i = wl; i < dv; i += kWarp) gb += gbp[i];
          gb = warp_sum(gb);
          if (wl == 0) a.gbeta[blk.vec(t, nh) + j] = gb;
        }
        __syncthreads();   // the column phase has read G
        const bool decay = j == 0 && a.alpha != nullptr;
        for (int i0 = 0; i0 < dv; i0 += rows.groups) {
          const int i = i0 + rows.group;
          S ga = 0;
          if (i < dv) {
            S* Gi = G + i * ld;
            const S* Wp = slot(jt, 0) + i * dk;
            for (int c = rows.lane; c < dk; c += rows.width) {
              S x = Gi[c] + gvb[i] * k[c];               // now dL/dP_{j-1}
              if (decay) {
                ga += x * Wp[c];                         // galpha = <dL/dP_0, W_{t-1}>
                x *= alpha;
              }
              if (j == 0 && rst) x = S(0);               // no gradient crosses a reset
              Gi[c] = x;
            }
          }
          if (decay) {
            ga = group_sum(ga, rows.width);
            if (i < dv && rows.lane == 0) gal[i] = ga;
          }
        }
        if (decay) {
          __syncthreads();
          if (warp == 0) {
            S s = 0;
            for (int i = wl; i < dv; i += kWarp) s += gal[i];
            s = warp_sum(s);
            if (wl == 0) a.galpha[blk.scal(t)] = s;
          }
        }
      }
    }
  }
  __syncthreads();
  S* gW0 = a.gW0 + blk.mat(mat);
  for (int i = rows.group; i < dv; i += rows.groups)
    for (int c = rows.lane; c < dk; c += rows.width) gW0[i * dk + c] = G[i * ld + c];
}

}  // namespace

std::size_t product_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool) {
  SmemSize s;
  s.mat(n.dv, n.dk);
  if (backward) s.vec(3LL * n.dv);
  return s.n * elem;
}

std::size_t product_workspace_elems(const Dims& n, int nh) {
  const std::size_t mat = static_cast<std::size_t>(n.dv) * n.dk;
  return static_cast<std::size_t>(n.B) * n.H * n.chunk *
         (static_cast<std::size_t>(nh + 1) * mat + 2 * static_cast<std::size_t>(nh) * n.dv);
}

template <typename S>
int product_forward(const ProductFwdArgs<S>& a, int threads, cudaStream_t stream) {
  return launch_per_head(product_forward_kernel<S>, a.n, product_smem_bytes(a.n, sizeof(S), false, false),
                         launch_threads(a.n.dk, a.n.dv, threads), stream, a);
}

template <typename S>
int product_backward(const ProductBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  return launch_per_head(product_backward_kernel<S>, a.n, product_smem_bytes(a.n, sizeof(S), true, false),
                         launch_threads(a.n.dk, a.n.dv, threads), stream, a, work);
}

#define RFWP_INSTANTIATE(S)                                                               \
  template int product_forward<S>(const ProductFwdArgs<S>&, int, cudaStream_t);           \
  template int product_backward<S>(const ProductBwdArgs<S>&, S*, int, cudaStream_t);
RFWP_INSTANTIATE(float)
RFWP_INSTANTIATE(double)
#undef RFWP_INSTANTIATE

}  // namespace cuda
}  // namespace rfwp
