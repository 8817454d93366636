// CUDA kernels of the Recurrent Delta Net (RFWP paper Eq. 15-18, then the delta rule Eq. 8, 10
// and the read Eq. 7) with the softmax feature map on q and k. One block per (batch, head);
// the head's recurrent slow weights Rq, Rk, Rv [d, d] are staged in shared memory when they
// fit (`stage`), else read from global memory (they are shared by the batch: L2/L1 hits).
// The slow-weight gradients are outer-product sums over (t, b) taken after the recurrence by a
// separate kernel, in a fixed order (no atomics).
#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

// Forward. h_t = tanh(y_{t-1}) (0 after a reset) is formed by the lane that computes y_{t-1}.
// Per step t, three barriers:
//   Pre(t):  rows of [Rq; Rk; Rv; rb] (3d + 1 rows, lanes per row): xq + Rq h, xk + Rk h,
//            v = xv + Rv h, xb + rb.h   (RFWP Eq. 15-18 before the activations);
//   Act(t):  warp 0: q = softmax, β = σ; warp 1 (or 0): k = softmax (warp-parallel, at once);
//   Row(t):  the delta rule as in the Delta Net kernel (deferred write of step t-1 by the
//            element's owner, v̄, W q, k.q), y_t, and h_{t+1} = tanh(y_t).
template <typename S>
RFWP_KERNEL rdn_forward_kernel(RdnFwdArgs<S> a, bool stage) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, warp = tid / kWarp, wl = tid & (kWarp - 1);
  const int nwarps = nt / kWarp;
  const int d = n.dk, ld = padded_ld(d), mat = d * d;
  const int L = 3 * d + 1;   // xq | xk | xv | xb
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* W = cur.mat(d, d);
  S* sR = stage ? cur.take(3 * static_cast<std::size_t>(d) * ld) : nullptr;   // Rq | Rk | Rv
  S* srb = cur.take(d);
  S* xs = cur.take(L);
  S* pre = cur.take(3 * static_cast<std::size_t>(d) + 1);   // aq | ak | v | ab
  S* qs = cur.take(d);
  S* ks = cur.take(2 * static_cast<std::size_t>(d));        // k of steps t and t-1
  S* hs = cur.take(d);
  S* us = cur.take(2 * static_cast<std::size_t>(d));
  S* sbeta = cur.take(1);
  const Lanes rows(d, nt, tid), prows(3 * d + 1, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  auto segs = [&](auto&& f) {
    f(per_step(a.xq, blk, d));
    f(per_step(a.xk, blk, d));
    f(per_step(a.xv, blk, d));
    f(per_step(a.xb, blk, 1));
  };
  StepVectors<S> step(segs, tid, nt);
  // slow weights: rows of the stacked [Rq; Rk; Rv] (3d x d), with leading dimension ldR
  const std::size_t ho = static_cast<std::size_t>(blk.h) * mat;
  if (stage) {
    for (int r = prows.group; r < 3 * d; r += prows.groups) {
      const S* src = (r < d ? a.Rq : r < 2 * d ? a.Rk : a.Rv) + ho + (r % d) * d;
      for (int j = prows.lane; j < d; j += prows.width) sR[r * ld + j] = src[j];
    }
  }
  for (int j = tid; j < d; j += nt) srb[j] = a.rb[static_cast<std::size_t>(blk.h) * d + j];
  const S* W0 = a.W0 + blk.mat(mat);
  for (int i = rows.group; i < d; i += rows.groups)
    for (int j = rows.lane; j < d; j += rows.width) W[i * ld + j] = W0[i * d + j];
  {
    const bool rst0 = flags.at(0);
    for (int j = tid; j < d; j += nt) hs[j] = rst0 ? S(0) : dtanh(a.y0[blk.mat(d) + j]);
  }
  if (n.T > 0) step.fetch(0);
  for (int t = 0; t < n.T; ++t) {
    step.store(t, xs, segs, tid, nt);
    if (t + 1 < n.T) step.fetch(t + 1);
    const bool rst = flags.at(t), rst_next = flags.at(t + 1);
    S* ckpt = (n.chunk > 0 && t % n.chunk == 0) ? a.ckpt + blk.ckpt(t / n.chunk, mat) : nullptr;
    __syncthreads();
    // ---- pre-activations
    for (int r0 = 0; r0 < 3 * d + 1; r0 += prows.groups) {
      const int r = r0 + prows.group;
      S acc = 0;
      if (r < 3 * d + 1) {
        const S* Rrow = r == 3 * d ? srb
                        : stage    ? sR + r * ld
                                   : (r < d ? a.Rq : r < 2 * d ? a.Rk : a.Rv) + ho + (r % d) * d;
        for (int j = prows.lane; j < d; j += prows.width) acc += Rrow[j] * hs[j];   // RFWP Eq. 15-18
      }
      acc = group_sum(acc, prows.width);
      if (r < 3 * d + 1 && prows.lane == 0) {
        const S x = xs[r] + acc;
        pre[r] = x;
        if (r >= 2 * d && r < 3 * d) a.v[blk.vec(t, d) + (r - 2 * d)] = x;   // v = xv + Rv h
      }
    }
    __syncthreads();
    // ---- activations: the two softmaxes on different warps
    S* kc = ks + (t & 1) * d;
    if (warp == 0) {
      warp_softmax(pre, qs, d, wl);           // q = softmax(xq + Rq h), RFWP Eq. 17
      if (wl == 0) {
        const S b = dsigmoid(pre[3 * d]);     // β = σ(xb + rb.h), RFWP Eq. 18
        sbeta[0] = b;
        a.beta[blk.scal(t)] = b;
      }
      for (int j = wl; j < d; j += kWarp) a.q[blk.vec(t, d) + j] = qs[j];
    }
    if (warp == (nwarps > 1 ? 1 : 0)) {
      warp_softmax(pre + d, kc, d, wl);       // k = softmax(xk + Rk h), RFWP Eq. 15
      for (int j = wl; j < d; j += kWarp) a.k[blk.vec(t, d) + j] = kc[j];
    }
    __syncthreads();
    // ---- delta rule and read
    const S* kp = ks + ((t + 1) & 1) * d;
    const S* u_prev = us + ((t + 1) & 1) * d;
    S* u_cur = us + (t & 1) * d;
    const S beta = sbeta[0];
    for (int i0 = 0; i0 < d; i0 += rows.groups) {
      const int i = i0 + rows.group;
      S vb = 0, wq = 0, kq = 0;
      if (i < d) {
        S* Wi = W + i * ld;
        const S up = t > 0 ? u_prev[i] : S(0);
        for (int j = rows.lane; j < d; j += rows.width) {
          S w = Wi[j];
          if (t > 0) w += up * kp[j];
          if (ckpt != nullptr) ckpt[i * d + j] = w;
          if (rst) w = S(0);
          Wi[j] = w;
          vb += w * kc[j];                     // RFWP Eq. 10
          wq += w * qs[j];
          kq += kc[j] * qs[j];
        }
      }
      vb = group_sum(vb, rows.width);
      wq = group_sum(wq, rows.width);
      kq = group_sum(kq, rows.width);
      if (i < d && rows.lane == 0) {
        const S u = beta * (pre[2 * d + i] - vb);   // RFWP Eq. 8
        u_cur[i] = u;
        const S y = wq + u * kq;                    // RFWP Eq. 7
        a.y[blk.vec(t, d) + i] = y;
        a.h[blk.vec(t, d) + i] = hs[i];
        hs[i] = rst_next ? S(0) : dtanh(y);          // h_{t+1}, RFWP Eq. 15-18
      }
    }
  }
  __syncthreads();
  const S* kl = ks + ((n.T + 1) & 1) * d;
  const S* ul = us + ((n.T + 1) & 1) * d;
  S* Wout = a.W + blk.mat(mat);
  for (int i = rows.group; i < d; i += rows.groups)
    for (int j = rows.lane; j < d; j += rows.width)
      Wout[i * d + j] = n.T > 0 ? W[i * ld + j] + ul[i] * kl[j] : W[i * ld + j];
}

// Backward: per checkpoint chunk (last first) recompute W'_t, u, v - v̄ from the saved
// activations (as the Delta Net backward), then per step t, four barriers:
//   Row(t): gy = dL/dy_t + carry; G_ij = [finish step t+1] + gy_i q_j, gu_i = G_i.k;
//           gv_i = β gu_i (= dL/dxv), gv̄_i = -β gu_i;
//   Col(t): gk, gq as in the Delta Net (W'_t from the workspace); warp 0: gβ and
//           gab = gβ β (1 - β);
//   Act(t): softmax backward gaq = q (gq - q.gq), gak = k (gk - k.gk) (every warp forms
//           the two dot products itself);
//   Rec(t): columns of Rq, Rk, Rv: gh = Rq^T gaq + Rk^T gak + Rv^T gv + rb gab,
//           carry = gh (1 - h²) (0 when step t reset: h_t = 0 is a constant).
template <typename S>
RFWP_KERNEL rdn_backward_kernel(RdnBwdArgs<S> a, S* work, bool stage) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, warp = tid / kWarp, wl = tid & (kWarp - 1);
  const int d = n.dk, ld = padded_ld(d), C = n.chunk, mat = d * d;
  const int Lr = 2 * d + 1;   // recompute: k | v | beta
  const int Lb = 6 * d + 1;   // k | q | h | gy | u | diff | beta
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* G = cur.mat(d, d);
  S* Wr = stage ? cur.mat(d, d) : nullptr;
  S* sR = stage ? cur.take(3 * static_cast<std::size_t>(d) * ld) : nullptr;
  S* srb = cur.take(d);
  S* rr = cur.take(3 * static_cast<std::size_t>(Lr));
  S* sb = cur.take(3 * static_cast<std::size_t>(Lb));
  S* us = cur.take(2 * static_cast<std::size_t>(d));
  S* gvb = cur.take(2 * static_cast<std::size_t>(d));
  S* gys = cur.take(d);
  S* gvs = cur.take(d);
  S* gbp = cur.take(d);
  S* gq = cur.take(d);
  S* gk = cur.take(d);
  S* gaq = cur.take(d);
  S* gak = cur.take(d);
  S* carry = cur.take(d);
  S* sgab = cur.take(1);
  const Lanes rows(d, nt, tid), cols(d, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  S* wbuf = work + static_cast<std::size_t>(blk.bh) * C * (static_cast<std::size_t>(mat) + 2 * d);
  S* vbuf = wbuf + static_cast<std::size_t>(C) * mat;
  const std::size_t ho = static_cast<std::size_t>(blk.h) * mat;
  const int ldR = stage ? ld : d;
  const S* Rq = stage ? sR : a.Rq + ho;
  const S* Rk = stage ? sR + static_cast<std::size_t>(d) * ld : a.Rk + ho;
  const S* Rv = stage ? sR + 2 * static_cast<std::size_t>(d) * ld : a.Rv + ho;
  if (stage) {
    for (int i = rows.group; i < d; i += rows.groups)
      for (int j = rows.lane; j < d; j += rows.width) {
        sR[i * ld + j] = a.Rq[ho + i * d + j];
        sR[(d + i) * ld + j] = a.Rk[ho + i * d + j];
        sR[(2 * d + i) * ld + j] = a.Rv[ho + i * d + j];
      }
  }
  for (int j = tid; j < d; j += nt) {
    srb[j] = a.rb[static_cast<std::size_t>(blk.h) * d + j];
    carry[j] = S(0);
  }
  const S* gW = a.gW != nullptr ? a.gW + blk.mat(mat) : nullptr;
  for (int i = rows.group; i < d; i += rows.groups)
    for (int j = rows.lane; j < d; j += rows.width) G[i * ld + j] = gW != nullptr ? gW[i * d + j] : S(0);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    __syncthreads();   // the previous chunk's column phase has read the workspace
    // ---- recompute the chunk
    {
      auto rsegs = [&](auto&& f) {
        f(per_step(a.k, blk, d));
        f(per_step(a.v, blk, d));
        f(per_step(a.beta, blk, 1));
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
        S* wt = wbuf + static_cast<std::size_t>(jt) * mat;
        const S* wprev = jt > 0 ? wt - mat : wt;
        const S* u_prev = us + ((jt + 1) & 1) * d;
        S* u_cur = us + (jt & 1) * d;
        __syncthreads();
        const S *kc = vec, *vc = vec + d;
        const S beta = vec[2 * d];
        for (int i0 = 0; i0 < d; i0 += rows.groups) {
          const int i = i0 + rows.group;
          S vb = 0;
          if (i < d) {
            const S up = jt > 0 ? u_prev[i] : S(0);
            for (int j = rows.lane; j < d; j += rows.width) {
              S w = jt == 0 ? ck[i * d + j] : (Wr != nullptr ? Wr[i * ld + j] : wprev[i * d + j]) + up * kp[j];
              if (rst) w = S(0);
              if (Wr != nullptr) Wr[i * ld + j] = w;
              wt[i * d + j] = w;
              vb += w * kc[j];
            }
          }
          vb = group_sum(vb, rows.width);
          if (i < d && rows.lane == 0) {
            const S diff = vc[i] - vb;
            u_cur[i] = beta * diff;
            vbuf[(2 * jt) * d + i] = u_cur[i];
            vbuf[(2 * jt + 1) * d + i] = diff;
          }
        }
      }
    }
    __syncthreads();   // u, v - v̄ of the chunk's last step, read by other threads below
    // ---- walk the chunk backwards
    auto segs = [&](auto&& f) {
      f(per_step(a.k, blk, d));
      f(per_step(a.q, blk, d));
      f(per_step(a.h, blk, d));                  // tanh(y_{t-1}) kept by the forward
      f(per_step(a.gy, blk, d));
      f(Segment<S>{vbuf, 2 * d, d, t0});        // u_t
      f(Segment<S>{vbuf + d, 2 * d, d, t0});    // v_t - v̄_t
      f(per_step(a.beta, blk, 1));
    };
    StepVectors<S> step(segs, tid, nt);
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      S* vec = sb + (t % 3) * Lb;
      const S* kn = sb + ((t + 1) % 3) * Lb;
      step.store(t, vec, segs, tid, nt);
      if (t - 1 >= t0) step.fetch(t - 1);
      const bool has_next = t + 1 < n.T;
      const bool rst_next = flags.at(t + 1);
      const bool rst = flags.at(t);
      const S* gvb_next = gvb + ((t + 1) & 1) * d;
      S* gvb_cur = gvb + (t & 1) * d;
      __syncthreads();
      const S *kc = vec, *qc = vec + d, *hc = vec + 2 * d, *gyc = vec + 3 * d, *uc = vec + 4 * d,
              *dc = vec + 5 * d;
      const S beta = vec[6 * d];
      for (int i0 = 0; i0 < d; i0 += rows.groups) {
        const int i = i0 + rows.group;
        S gu = 0;
        if (i < d) {
          const S g = gyc[i] + carry[i];
          const S gn = has_next ? gvb_next[i] : S(0);
          S* Gi = G + i * ld;
          for (int j = rows.lane; j < d; j += rows.width) {
            S x = Gi[j];
            if (has_next) x = rst_next ? S(0) : x + gn * kn[j];   // finish step t+1
            x += g * qc[j];                                       // the read y_t = W_t q_t
            Gi[j] = x;
            gu += x * kc[j];
          }
        }
        gu = group_sum(gu, rows.width);
        if (i < d && rows.lane == 0) {
          gys[i] = gyc[i] + carry[i];
          gvb_cur[i] = -beta * gu;
          gvs[i] = beta * gu;
          gbp[i] = gu * dc[i];
          a.gxv[blk.vec(t, d) + i] = beta * gu;
        }
      }
      __syncthreads();
      const S ugy = warp_dot(uc, gys, d, wl);
      const S* wt = wbuf + static_cast<std::size_t>(jt) * mat;
      for (int j0 = 0; j0 < d; j0 += cols.groups) {
        const int j = j0 + cols.group;
        S gkj = 0, gqj = 0;
        if (j < d) {
          for (int i = cols.lane; i < d; i += cols.width) {
            const S w = wt[i * d + j];
            gkj += G[i * ld + j] * uc[i] + w * gvb_cur[i];
            gqj += w * gys[i];
          }
        }
        gkj = group_sum(gkj, cols.width);
        gqj = group_sum(gqj, cols.width);
        if (j < d && cols.lane == 0) {
          gk[j] = gkj;
          gq[j] = gqj + kc[j] * ugy;
        }
      }
      if (warp == 0) {
        S gb = 0;
        for (int i = wl; i < d; i += kWarp) gb += gbp[i];
        gb = warp_sum(gb);
        if (wl == 0) {
          const S gab = gb * beta * (S(1) - beta);    // through σ (RFWP Eq. 18)
          sgab[0] = gab;
          a.gxb[blk.scal(t)] = gab;
        }
      }
      __syncthreads();
      {
        const S qg = warp_dot(qc, gq, d, wl), kg = warp_dot(kc, gk, d, wl);
        for (int j = tid; j < d; j += nt) {
          const S x = qc[j] * (gq[j] - qg);            // softmax backward (RFWP Eq. 17)
          const S y = kc[j] * (gk[j] - kg);            // softmax backward (RFWP Eq. 15)
          gaq[j] = x;
          gak[j] = y;
          a.gxq[blk.vec(t, d) + j] = x;
          a.gxk[blk.vec(t, d) + j] = y;
        }
      }
      __syncthreads();
      const S gab = sgab[0];
      for (int j0 = 0; j0 < d; j0 += cols.groups) {
        const int j = j0 + cols.group;
        S gh = 0;
        if (j < d) {
          for (int i = cols.lane; i < d; i += cols.width)
            gh += Rq[i * ldR + j] * gaq[i] + Rk[i * ldR + j] * gak[i] + Rv[i * ldR + j] * gvs[i];
        }
        gh = group_sum(gh, cols.width);
        if (j < d && cols.lane == 0) {
          gh += srb[j] * gab;
          carry[j] = rst ? S(0) : gh * (S(1) - hc[j] * hc[j]);   // through h = tanh(y_{t-1})
        }
      }
    }
  }
  __syncthreads();
  const bool rst0 = flags.at(0);
  const S* k0 = sb;
  S* gW0 = a.gW0 + blk.mat(mat);
  for (int i = rows.group; i < d; i += rows.groups)
    for (int j = rows.lane; j < d; j += rows.width) {
      S g = G[i * ld + j];
      if (n.T > 0) g = rst0 ? S(0) : g + gvb[i] * k0[j];
      gW0[i * d + j] = g;
    }
  for (int j = tid; j < d; j += nt) a.gy0[blk.mat(d) + j] = carry[j];
}

// out_z[h, i, j] = Σ_{m = 0 .. M-1} A_z[m, h, i] X[m, h, j], m = t B + b in increasing order
// (deterministic), for z = 0 .. gridDim.z - 1: the slow-weight gradients Σ_{t,b} ga ⊗ h of rdn
// (h_t = 0 after a reset, so reset steps add nothing). A block computes a 32 x 32 tile of
// outputs (8 per thread), taking M in slices of 16 staged in shared memory.
constexpr int kTile = 32, kSlice = 16, kOuterThreads = 128, kRowsPerThread = kTile * kTile / kOuterThreads;

template <typename S>
__global__ void __launch_bounds__(kOuterThreads)
    outer_sum_kernel(const S* A0, const S* A1, const S* A2, int la, const S* X, int lx, int M, int H,
                     S* out0, S* out1, S* out2) {
  __shared__ S sa[kSlice][kTile];
  __shared__ S sx[kSlice][kTile];
  const S* A = blockIdx.z == 0 ? A0 : blockIdx.z == 1 ? A1 : A2;
  S* out = blockIdx.z == 0 ? out0 : blockIdx.z == 1 ? out1 : out2;
  const int tiles_j = (lx + kTile - 1) / kTile;
  const int ti = static_cast<int>(blockIdx.x) / tiles_j, tj = static_cast<int>(blockIdx.x) % tiles_j;
  const int h = blockIdx.y, tid = threadIdx.x;
  const int lj = tid % kTile, li0 = tid / kTile, step = kOuterThreads / kTile;
  S acc[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) acc[r] = S(0);
  for (int m0 = 0; m0 < M; m0 += kSlice) {
    for (int e = tid; e < kSlice * kTile; e += kOuterThreads) {
      const int mm = e / kTile, c = e % kTile, m = m0 + mm;
      const int ii = ti * kTile + c, jj = tj * kTile + c;
      sa[mm][c] = (m < M && ii < la) ? A[(static_cast<std::size_t>(m) * H + h) * la + ii] : S(0);
      sx[mm][c] = (m < M && jj < lx) ? X[(static_cast<std::size_t>(m) * H + h) * lx + jj] : S(0);
    }
    __syncthreads();
    for (int mm = 0; mm < kSlice; ++mm) {
      const S x = sx[mm][lj];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) acc[r] += sa[mm][li0 + step * r] * x;
    }
    __syncthreads();
  }
  const int j = tj * kTile + lj;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = ti * kTile + li0 + step * r;
    if (i < la && j < lx) out[(static_cast<std::size_t>(h) * la + i) * lx + j] = acc[r];
  }
}

// The n (1 to 3) sums out_z = Σ A_z ⊗ X in one launch.
template <typename S>
int launch_outer_sum(int n, const S* A0, const S* A1, const S* A2, int la, const S* X, int lx, int M, int H,
                     S* out0, S* out1, S* out2, cudaStream_t stream) {
  if (H == 0 || la == 0 || lx == 0) return 0;
  const dim3 grid(static_cast<unsigned>(((la + kTile - 1) / kTile) * ((lx + kTile - 1) / kTile)),
                  static_cast<unsigned>(H), static_cast<unsigned>(n));
  auto kernel = outer_sum_kernel<S>;
  RFWP_LAUNCH(kernel, grid, dim3(kOuterThreads), 0, stream, A0, A1, A2, la, X, lx, M, H, out0, out1, out2);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

std::size_t rdn_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage) {
  const int d = n.dk;
  SmemSize s;
  if (backward) {
    s.mat(d, d);
    if (stage) s.mat(d, d).mat(3 * d, d);
    s.vec(d).vec(3LL * (2 * d + 1)).vec(3LL * (6 * d + 1)).vec(13LL * d + 1);
  } else {
    s.mat(d, d);
    if (stage) s.mat(3 * d, d);
    s.vec(d).vec(3LL * d + 1).vec(3LL * d + 1).vec(6LL * d).vec(1);
  }
  return s.n * elem;
}

std::size_t rdn_workspace_elems(const Dims& n) {
  const std::size_t d = n.dk;
  return static_cast<std::size_t>(n.B) * n.H * n.chunk * (d * d + 2 * d);
}

template <typename S>
int rdn_forward(const RdnFwdArgs<S>& a, int threads, cudaStream_t stream) {
  const std::size_t smem = smem_request("rdn", a.n, sizeof(S), false, device_smem_optin());
  const bool stage = smem == rdn_smem_bytes(a.n, sizeof(S), false, true);
  return launch_per_head(rdn_forward_kernel<S>, a.n, smem, launch_threads(a.n.dk, a.n.dk, threads), stream, a, stage);
}

template <typename S>
int rdn_backward(const RdnBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  const std::size_t smem = smem_request("rdn", a.n, sizeof(S), true, device_smem_optin());
  const bool stage = smem == rdn_smem_bytes(a.n, sizeof(S), true, true);
  int err = launch_per_head(rdn_backward_kernel<S>, a.n, smem, launch_threads(a.n.dk, a.n.dk, threads), stream, a,
                            work, stage);
  if (err != 0) return err;
  const int d = a.n.dk, M = a.n.T * a.n.B, H = a.n.H;
  const S *gxq = a.gxq, *gxk = a.gxk, *gxv = a.gxv, *gxb = a.gxb;
  if ((err = launch_outer_sum(3, gxq, gxk, gxv, d, a.h, d, M, H, a.gRq, a.gRk, a.gRv, stream)) != 0) return err;
  return launch_outer_sum(1, gxb, gxb, gxb, 1, a.h, d, M, H, a.grb, a.grb, a.grb, stream);
}

template int rdn_forward<float>(const RdnFwdArgs<float>&, int, cudaStream_t);
template int rdn_forward<double>(const RdnFwdArgs<double>&, int, cudaStream_t);
template int rdn_backward<float>(const RdnBwdArgs<float>&, float*, int, cudaStream_t);
template int rdn_backward<double>(const RdnBwdArgs<double>&, double*, int, cudaStream_t);

}  // namespace cuda
}  // namespace rfwp
