// CUDA kernels of the Recurrent Delta Net (RFWP paper Eq. 15-18, then the delta rule Eq. 8, 10
// and the read Eq. 7) with the softmax feature map on q and k. One block per (batch, head);
// the head's recurrent slow weights Rq, Rk, Rv [d, d] and rb [d] are staged in shared memory.
// The slow-weight gradients are written as per-(b, h) partials and summed over b in a fixed
// order by a second kernel (no atomics).
#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

template <typename S>
__device__ inline void load_head_weights(const S* Rq, const S* Rk, const S* Rv, const S* rb, int h,
                                         int d, int ld, S* sRq, S* sRk, S* sRv, S* srb, int tid,
                                         int nt) {
  const std::size_t mat = static_cast<std::size_t>(d) * d, o = static_cast<std::size_t>(h) * mat;
  for (std::size_t e = tid; e < mat; e += nt) {
    const int i = static_cast<int>(e / d), j = static_cast<int>(e % d);
    sRq[i * ld + j] = Rq[o + e];
    sRk[i * ld + j] = Rk[o + e];
    sRv[i * ld + j] = Rv[o + e];
  }
  for (int j = tid; j < d; j += nt) srb[j] = rb[static_cast<std::size_t>(h) * d + j];
}

// Forward. Per step t:
//   P(t)  element loop: write of step t-1, checkpoint, reset; load xq, xk, xv, xb;
//         h = tanh(y_{t-1}) (0 after a reset);
//   R1(t) row loop: pre-activations xq + Rq h, xk + Rk h, v = xv + Rv h; thread 0: xb + rb.h;
//   S(t)  thread 0: q = softmax, β = σ; thread 1: k = softmax;
//   R2(t) row loop: the delta-rule write and the read as in the Delta Net kernel.
template <typename S>
__global__ void rdn_forward_kernel(RdnFwdArgs<S> a) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int d = n.dk, ld = padded_ld(d), head = blk.bh % n.H;
  const std::size_t mat = static_cast<std::size_t>(d) * d;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* W = cur.take(static_cast<std::size_t>(d) * ld);
  S* sRq = cur.take(static_cast<std::size_t>(d) * ld);
  S* sRk = cur.take(static_cast<std::size_t>(d) * ld);
  S* sRv = cur.take(static_cast<std::size_t>(d) * ld);
  S* srb = cur.take(d);
  S* kbuf = cur.take(2 * d);
  S* qs = cur.take(d);
  S* vs = cur.take(d);
  S* aq = cur.take(d);
  S* ak = cur.take(d);
  S* hs = cur.take(d);
  S* yprev = cur.take(d);
  S* us = cur.take(d);
  __shared__ S s_ab, s_beta;

  load_head_weights(a.Rq, a.Rk, a.Rv, a.rb, head, d, ld, sRq, sRk, sRv, srb, tid, nt);
  for (std::size_t e = tid; e < mat; e += nt) W[(e / d) * ld + e % d] = a.W0[blk.mat(mat) + e];
  for (int i = tid; i < d; i += nt) yprev[i] = a.y0[blk.mat(d) + i];
  __syncthreads();
  for (int t = 0; t < n.T; ++t) {
    S* kc = kbuf + (t & 1) * d;
    const S* kp = kbuf + ((t + 1) & 1) * d;
    const bool rst = blk.reset(a.reset, t);
    for (std::size_t e = tid; e < mat; e += nt) {
      const int i = static_cast<int>(e / d), j = static_cast<int>(e % d);
      S w = W[i * ld + j];
      if (t > 0) w += us[i] * kp[j];
      if (n.chunk > 0 && t % n.chunk == 0) a.ckpt[blk.ckpt(t / n.chunk, mat) + e] = w;
      W[i * ld + j] = rst ? S(0) : w;
    }
    for (int i = tid; i < d; i += nt) {
      aq[i] = a.xq[blk.vec(t, d) + i];
      ak[i] = a.xk[blk.vec(t, d) + i];
      vs[i] = a.xv[blk.vec(t, d) + i];
      hs[i] = rst ? S(0) : dtanh(yprev[i]);
    }
    if (tid == 0) s_ab = a.xb[blk.scal(t)];
    __syncthreads();
    for (int i = tid; i < d; i += nt) {
      S pq = 0, pk = 0, pv = 0;
      for (int j = 0; j < d; ++j) {
        pq += sRq[i * ld + j] * hs[j];       // RFWP Eq. 17
        pk += sRk[i * ld + j] * hs[j];       // RFWP Eq. 15
        pv += sRv[i * ld + j] * hs[j];       // RFWP Eq. 16
      }
      aq[i] += pq;
      ak[i] += pk;
      vs[i] += pv;
    }
    if (tid == 0) {
      S pb = 0;
      for (int j = 0; j < d; ++j) pb += srb[j] * hs[j];
      s_ab += pb;                            // RFWP Eq. 18 (pre-sigmoid)
    }
    __syncthreads();
    if (tid == 0) {
      softmax_serial(aq, qs, d);
      s_beta = dsigmoid(s_ab);
    }
    if (tid == (nt > 1 ? 1 : 0)) softmax_serial(ak, kc, d);
    __syncthreads();
    for (int i = tid; i < d; i += nt) {
      const S* Wi = W + i * ld;
      S vb = 0, wq = 0, kq = 0;
      for (int j = 0; j < d; ++j) {
        vb += Wi[j] * kc[j];                 // RFWP Eq. 10
        wq += Wi[j] * qs[j];
        kq += kc[j] * qs[j];
      }
      const S u = s_beta * (vs[i] - vb);     // RFWP Eq. 8
      us[i] = u;
      const S y = wq + u * kq;               // RFWP Eq. 7
      yprev[i] = y;
      a.y[blk.vec(t, d) + i] = y;
      a.q[blk.vec(t, d) + i] = qs[i];
      a.k[blk.vec(t, d) + i] = kc[i];
      a.v[blk.vec(t, d) + i] = vs[i];
      a.h[blk.vec(t, d) + i] = hs[i];
    }
    if (tid == 0) a.beta[blk.scal(t)] = s_beta;
    __syncthreads();
  }
  const S* kl = kbuf + ((n.T - 1) & 1) * d;
  for (std::size_t e = tid; e < mat; e += nt) {
    const int i = static_cast<int>(e / d), j = static_cast<int>(e % d);
    a.W[blk.mat(mat) + e] = W[i * ld + j] + us[i] * kl[j];
  }
}

// Backward: per checkpoint chunk (last first) recompute W'_t, u, v - v̄ from the saved
// activations (q, k, v, β, h = tanh(y_{t-1}) of the forward), then per step t:
//   L(t):   copy W'_t; load vectors; gy = dL/dy_t + carry;
//   Row(t): G_i += gy_i q, gu_i = G_i.k, gv_i = β gu_i, gv̄_i = -β gu_i;
//   Col(t): gk, gq as in the Delta Net; thread 0: gβ and gab = gβ β (1 - β);
//   S(t):   softmax backward: gaq = q (gq - q.gq), gak = k (gk - k.gk);
//   F(t):   element loop: G += gv̄ ⊗ k (zero on reset), partial gRq += gaq ⊗ h, gRk, gRv;
//           column loop: gh = Rq^T gaq + Rk^T gak + Rv^T gv + rb gab, carry = gh (1 - h²).
template <typename S>
__global__ void rdn_backward_kernel(RdnBwdArgs<S> a, S* work) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int d = n.dk, ld = padded_ld(d), head = blk.bh % n.H, C = n.chunk;
  const std::size_t mat = static_cast<std::size_t>(d) * d;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* G = cur.take(static_cast<std::size_t>(d) * ld);
  S* Wr = cur.take(static_cast<std::size_t>(d) * ld);
  S* sRq = cur.take(static_cast<std::size_t>(d) * ld);
  S* sRk = cur.take(static_cast<std::size_t>(d) * ld);
  S* sRv = cur.take(static_cast<std::size_t>(d) * ld);
  S* srb = cur.take(d);
  S* kbuf = cur.take(2 * d);
  S* qs = cur.take(d);
  S* vs = cur.take(d);
  S* us = cur.take(d);
  S* ds = cur.take(d);
  S* gys = cur.take(d);
  S* hs = cur.take(d);
  S* gus = cur.take(d);
  S* gvb = cur.take(d);
  S* gvs = cur.take(d);
  S* gq = cur.take(d);
  S* gk = cur.take(d);
  S* gaq = cur.take(d);
  S* gak = cur.take(d);
  S* carry = cur.take(d);
  __shared__ S s_beta, s_gab;
  S* wbuf = work + static_cast<std::size_t>(blk.bh) * C * (mat + 2 * static_cast<std::size_t>(d));
  S* vbuf = wbuf + static_cast<std::size_t>(C) * mat;
  S* gRq = a.gRq_part + blk.mat(mat);
  S* gRk = a.gRk_part + blk.mat(mat);
  S* gRv = a.gRv_part + blk.mat(mat);
  S* grb = a.grb_part + blk.mat(d);

  load_head_weights(a.Rq, a.Rk, a.Rv, a.rb, head, d, ld, sRq, sRk, sRv, srb, tid, nt);
  for (std::size_t e = tid; e < mat; e += nt) {
    G[(e / d) * ld + e % d] = a.gW != nullptr ? a.gW[blk.mat(mat) + e] : S(0);
    gRq[e] = S(0);
    gRk[e] = S(0);
    gRv[e] = S(0);
  }
  for (int j = tid; j < d; j += nt) {
    grb[j] = S(0);
    carry[j] = S(0);
  }
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    // ---- recompute the chunk
    for (std::size_t e = tid; e < mat; e += nt) Wr[(e / d) * ld + e % d] = a.ckpt[blk.ckpt(c, mat) + e];
    for (int t = t0; t < t1; ++t) {
      const int jt = t - t0;
      S* kc = kbuf + (t & 1) * d;
      const S* kp = kbuf + ((t + 1) & 1) * d;
      const bool rst = blk.reset(a.reset, t);
      for (std::size_t e = tid; e < mat; e += nt) {
        const int i = static_cast<int>(e / d), j = static_cast<int>(e % d);
        S w = Wr[i * ld + j];
        if (t > t0) w += us[i] * kp[j];
        if (rst) w = S(0);
        Wr[i * ld + j] = w;
        wbuf[jt * mat + e] = w;
      }
      for (int i = tid; i < d; i += nt) {
        kc[i] = a.k[blk.vec(t, d) + i];
        vs[i] = a.v[blk.vec(t, d) + i];
      }
      if (tid == 0) s_beta = a.beta[blk.scal(t)];
      __syncthreads();
      for (int i = tid; i < d; i += nt) {
        S vb = 0;
        for (int j = 0; j < d; ++j) vb += Wr[i * ld + j] * kc[j];
        const S diff = vs[i] - vb;
        us[i] = s_beta * diff;
        vbuf[(2 * jt) * d + i] = us[i];
        vbuf[(2 * jt + 1) * d + i] = diff;
      }
      __syncthreads();
    }
    // ---- walk the chunk backwards
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      S* kc = kbuf + (t & 1) * d;
      const bool rst = blk.reset(a.reset, t);
      for (std::size_t e = tid; e < mat; e += nt) Wr[(e / d) * ld + e % d] = wbuf[jt * mat + e];
      for (int i = tid; i < d; i += nt) {
        kc[i] = a.k[blk.vec(t, d) + i];
        qs[i] = a.q[blk.vec(t, d) + i];
        us[i] = vbuf[(2 * jt) * d + i];
        ds[i] = vbuf[(2 * jt + 1) * d + i];
        gys[i] = a.gy[blk.vec(t, d) + i] + carry[i];
        hs[i] = a.h[blk.vec(t, d) + i];      // tanh(y_{t-1}) kept by the forward (0 after reset)
      }
      if (tid == 0) s_beta = a.beta[blk.scal(t)];
      __syncthreads();
      for (int i = tid; i < d; i += nt) {
        const S g = gys[i];
        S* Gi = G + i * ld;
        S gu = 0;
        for (int j = 0; j < d; ++j) {
          const S x = Gi[j] + g * qs[j];
          Gi[j] = x;
          gu += x * kc[j];
        }
        gus[i] = gu;
        gvb[i] = -s_beta * gu;
        gvs[i] = s_beta * gu;
        a.gxv[blk.vec(t, d) + i] = gvs[i];
      }
      __syncthreads();
      for (int j = tid; j < d; j += nt) {
        S gkj = 0, gqj = 0, ugy = 0;
        for (int i = 0; i < d; ++i) {
          const S w = Wr[i * ld + j];
          gkj += G[i * ld + j] * us[i] + w * gvb[i];
          gqj += w * gys[i];
          ugy += us[i] * gys[i];
        }
        gk[j] = gkj;
        gq[j] = gqj + kc[j] * ugy;
      }
      if (tid == 0) {
        S gb = 0;
        for (int i = 0; i < d; ++i) gb += gus[i] * ds[i];
        s_gab = gb * s_beta * (S(1) - s_beta);   // through σ (RFWP Eq. 18)
        a.gxb[blk.scal(t)] = s_gab;
      }
      __syncthreads();
      for (int j = tid; j < d; j += nt) {
        S qg = 0, kg = 0;
        for (int i = 0; i < d; ++i) {
          qg += qs[i] * gq[i];
          kg += kc[i] * gk[i];
        }
        gaq[j] = qs[j] * (gq[j] - qg);        // softmax backward (RFWP Eq. 17)
        gak[j] = kc[j] * (gk[j] - kg);        // softmax backward (RFWP Eq. 15)
        a.gxq[blk.vec(t, d) + j] = gaq[j];
        a.gxk[blk.vec(t, d) + j] = gak[j];
      }
      __syncthreads();
      for (std::size_t e = tid; e < mat; e += nt) {
        const int i = static_cast<int>(e / d), j = static_cast<int>(e % d);
        G[i * ld + j] = rst ? S(0) : G[i * ld + j] + gvb[i] * kc[j];
        if (!rst) {
          gRq[e] += gaq[i] * hs[j];
          gRk[e] += gak[i] * hs[j];
          gRv[e] += gvs[i] * hs[j];
        }
      }
      for (int j = tid; j < d; j += nt) {
        S gh = srb[j] * s_gab;
        for (int i = 0; i < d; ++i)
          gh += sRq[i * ld + j] * gaq[i] + sRk[i * ld + j] * gak[i] + sRv[i * ld + j] * gvs[i];
        if (!rst) grb[j] += s_gab * hs[j];
        carry[j] = rst ? S(0) : gh * (S(1) - hs[j] * hs[j]);   // through h = tanh(y_{t-1})
      }
      __syncthreads();
    }
  }
  for (std::size_t e = tid; e < mat; e += nt) a.gW0[blk.mat(mat) + e] = G[(e / d) * ld + e % d];
  for (int j = tid; j < d; j += nt) a.gy0[blk.mat(d) + j] = carry[j];
}

// out[h, e] = sum over b = 0..B-1 (in that order) of part[b, h, e].
template <typename S>
__global__ void sum_over_batch_kernel(const S* part, S* out, int B, int H, std::size_t len) {
  const std::size_t total = static_cast<std::size_t>(H) * len;
  for (std::size_t x = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < total;
       x += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t h = x / len, e = x % len;
    S s = 0;
    for (int b = 0; b < B; ++b) s += part[(static_cast<std::size_t>(b) * H + h) * len + e];
    out[x] = s;
  }
}

template <typename S>
int launch_sum(const S* part, S* out, int B, int H, std::size_t len, cudaStream_t stream) {
  const std::size_t total = static_cast<std::size_t>(H) * len;
  if (total == 0) return 0;
  const int threads = 128;
  std::size_t blocks = (total + threads - 1) / threads;
  if (blocks > 4096) blocks = 4096;
  auto kernel = sum_over_batch_kernel<S>;
  RFWP_LAUNCH(kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, stream, part, out, B, H, len);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

std::size_t rdn_smem_bytes(const Dims& n, std::size_t elem, bool backward) {
  SmemSize s;
  if (backward)
    s.mat(n.dk, n.dk).mat(n.dk, n.dk).mat(n.dk, n.dk).mat(n.dk, n.dk).mat(n.dk, n.dk).vec(17 * n.dk);
  else
    s.mat(n.dk, n.dk).mat(n.dk, n.dk).mat(n.dk, n.dk).mat(n.dk, n.dk).vec(10 * n.dk);
  return s.n * elem;
}

std::size_t rdn_workspace_elems(const Dims& n) {
  const std::size_t d = n.dk;
  return static_cast<std::size_t>(n.B) * n.H * n.chunk * (d * d + 2 * d);
}

template <typename S>
int rdn_forward(const RdnFwdArgs<S>& a, int threads, cudaStream_t stream) {
  if (threads <= 0) threads = default_threads(a.n.dk, a.n.dk);
  return launch_per_head(rdn_forward_kernel<S>, a.n, rdn_smem_bytes(a.n, sizeof(S), false),
                         threads, stream, a);
}

template <typename S>
int rdn_backward(const RdnBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  if (threads <= 0) threads = default_threads(a.n.dk, a.n.dk);
  int err = launch_per_head(rdn_backward_kernel<S>, a.n, rdn_smem_bytes(a.n, sizeof(S), true),
                            threads, stream, a, work);
  if (err != 0) return err;
  const std::size_t d = a.n.dk;
  if ((err = launch_sum(a.gRq_part, a.gRq, a.n.B, a.n.H, d * d, stream)) != 0) return err;
  if ((err = launch_sum(a.gRk_part, a.gRk, a.n.B, a.n.H, d * d, stream)) != 0) return err;
  if ((err = launch_sum(a.gRv_part, a.gRv, a.n.B, a.n.H, d * d, stream)) != 0) return err;
  return launch_sum(a.grb_part, a.grb, a.n.B, a.n.H, d, stream);
}

template int rdn_forward<float>(const RdnFwdArgs<float>&, int, cudaStream_t);
template int rdn_forward<double>(const RdnFwdArgs<double>&, int, cudaStream_t);
template int rdn_backward<float>(const RdnBwdArgs<float>&, float*, int, cudaStream_t);
template int rdn_backward<double>(const RdnBwdArgs<double>&, double*, int, cudaStream_t);

}  // namespace cuda
}  // namespace rfwp
