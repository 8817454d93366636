// CUDA kernels of the Delta RNN, version B (RFWP paper Eq. 12 with f = softmax): the
// feedforward fast weights W [dv, dk] and the recurrent fast weights R [dv, dv] are both
// written by the delta rule (RFWP Eq. 8, 10); y_t = W_t q_t + R_t softmax(y_{t-1}).
// One block per (batch, head); see common.cuh for the thread layout.
#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

// Forward. Per step t:
//   P(t) element loops over W and R: apply the writes of step t-1, checkpoint, reset;
//        load the step's vectors; thread 0: s = softmax(y_{t-1}) (uniform after a reset);
//   R(t) row loop: v̄, W q, u for W; v̄_r, R s, u_r for R; y_i = (W_i.q + u_i k.q) + (R_i.s + ur_i kr.s).
template <typename S>
__global__ void delta_rnn_forward_kernel(DeltaRnnFwdArgs<S> a) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int dk = n.dk, dv = n.dv, ldk = padded_ld(dk), ldv = padded_ld(dv);
  const std::size_t matW = static_cast<std::size_t>(dv) * dk, matR = static_cast<std::size_t>(dv) * dv;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* W = cur.take(static_cast<std::size_t>(dv) * ldk);
  S* R = cur.take(static_cast<std::size_t>(dv) * ldv);
  S* kbuf = cur.take(2 * dk);
  S* qs = cur.take(dk);
  S* krbuf = cur.take(2 * dv);
  S* vs = cur.take(dv);
  S* vrs = cur.take(dv);
  S* ss = cur.take(dv);
  S* yprev = cur.take(dv);
  S* us = cur.take(dv);
  S* urs = cur.take(dv);
  __shared__ S s_beta, s_beta_r;

  for (std::size_t e = tid; e < matW; e += nt) W[(e / dk) * ldk + e % dk] = a.W0[blk.mat(matW) + e];
  for (std::size_t e = tid; e < matR; e += nt) R[(e / dv) * ldv + e % dv] = a.R0[blk.mat(matR) + e];
  for (int i = tid; i < dv; i += nt) yprev[i] = a.y0[blk.mat(dv) + i];
  __syncthreads();
  for (int t = 0; t < n.T; ++t) {
    S* kc = kbuf + (t & 1) * dk;
    const S* kp = kbuf + ((t + 1) & 1) * dk;
    S* krc = krbuf + (t & 1) * dv;
    const S* krp = krbuf + ((t + 1) & 1) * dv;
    const bool rst = blk.reset(a.reset, t);
    const bool ck = (n.chunk > 0 && t % n.chunk == 0);
    for (std::size_t e = tid; e < matW; e += nt) {
      const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
      S w = W[i * ldk + j];
      if (t > 0) w += us[i] * kp[j];
      if (ck) a.ckptW[blk.ckpt(t / n.chunk, matW) + e] = w;
      W[i * ldk + j] = rst ? S(0) : w;
    }
    for (std::size_t e = tid; e < matR; e += nt) {
      const int i = static_cast<int>(e / dv), j = static_cast<int>(e % dv);
      S r = R[i * ldv + j];
      if (t > 0) r += urs[i] * krp[j];
      if (ck) a.ckptR[blk.ckpt(t / n.chunk, matR) + e] = r;
      R[i * ldv + j] = rst ? S(0) : r;
    }
    for (int j = tid; j < dk; j += nt) {
      kc[j] = a.k[blk.vec(t, dk) + j];
      qs[j] = a.q[blk.vec(t, dk) + j];
    }
    for (int i = tid; i < dv; i += nt) {
      vs[i] = a.v[blk.vec(t, dv) + i];
      krc[i] = a.kr[blk.vec(t, dv) + i];
      vrs[i] = a.vr[blk.vec(t, dv) + i];
    }
    if (tid == 0) {
      s_beta = a.beta[blk.scal(t)];
      s_beta_r = a.beta_r[blk.scal(t)];
      if (rst) {
        for (int i = 0; i < dv; ++i) ss[i] = S(1) / S(dv);   // softmax(0)
      } else {
        softmax_serial(yprev, ss, dv);     // recurrent query f(y_{t-1}), RFWP Eq. 12
      }
    }
    __syncthreads();
    for (int i = tid; i < dv; i += nt) {
      const S* Wi = W + i * ldk;
      const S* Ri = R + i * ldv;
      S vb = 0, wq = 0, kq = 0;
      for (int j = 0; j < dk; ++j) {
        vb += Wi[j] * kc[j];                // RFWP Eq. 10 for W
        wq += Wi[j] * qs[j];
        kq += kc[j] * qs[j];
      }
      S vrb = 0, rs = 0, krs = 0;
      for (int j = 0; j < dv; ++j) {
        vrb += Ri[j] * krc[j];              // RFWP Eq. 10 for R
        rs += Ri[j] * ss[j];
        krs += krc[j] * ss[j];
      }
      const S u = s_beta * (vs[i] - vb);    // RFWP Eq. 8
      const S ur = s_beta_r * (vrs[i] - vrb);
      us[i] = u;
      urs[i] = ur;
      const S y = (wq + u * kq) + (rs + ur * krs);   // RFWP Eq. 12
      yprev[i] = y;
      a.y[blk.vec(t, dv) + i] = y;
      a.s[blk.vec(t, dv) + i] = ss[i];       // kept for the backward
    }
    __syncthreads();
  }
  const S* kl = kbuf + ((n.T - 1) & 1) * dk;
  const S* krl = krbuf + ((n.T - 1) & 1) * dv;
  for (std::size_t e = tid; e < matW; e += nt) {
    const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
    a.W[blk.mat(matW) + e] = W[i * ldk + j] + us[i] * kl[j];
  }
  for (std::size_t e = tid; e < matR; e += nt) {
    const int i = static_cast<int>(e / dv), j = static_cast<int>(e % dv);
    a.R[blk.mat(matR) + e] = R[i * ldv + j] + urs[i] * krl[j];
  }
}

// Backward: per checkpoint chunk (last first), recompute W'_t, R'_t, u, v - v̄, u_r, v_r - v̄_r
// into the workspace, then per step t:
//   L(t):   finish step t+1 (G += gv̄ ⊗ k, GR += gv̄_r ⊗ kr, zero on its reset); copy W'_t, R'_t;
//           load vectors incl. s = softmax(y_{t-1}) kept by the forward; gy = dL/dy_t + carry;
//   Row(t): G_i += gy_i q, gu_i = G_i.k;  GR_i += gy_i s, gur_i = GR_i.kr;  (R_t s)_i;
//   Col(t): gk, gq (columns of W), gkr, gs (columns of R); the carry into y_{t-1}:
//           s_j (gs_j - s.gs), with s.gs = (R_t s).gy; thread 0: gβ, gβ_r.
template <typename S>
__global__ void delta_rnn_backward_kernel(DeltaRnnBwdArgs<S> a, S* work) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int dk = n.dk, dv = n.dv, ldk = padded_ld(dk), ldv = padded_ld(dv), C = n.chunk;
  const std::size_t matW = static_cast<std::size_t>(dv) * dk, matR = static_cast<std::size_t>(dv) * dv;
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* G = cur.take(static_cast<std::size_t>(dv) * ldk);
  S* GR = cur.take(static_cast<std::size_t>(dv) * ldv);
  S* Wr = cur.take(static_cast<std::size_t>(dv) * ldk);
  S* Rr = cur.take(static_cast<std::size_t>(dv) * ldv);
  S* kbuf = cur.take(2 * dk);
  S* qs = cur.take(dk);
  S* krbuf = cur.take(2 * dv);
  S* ss = cur.take(dv);
  S* gys = cur.take(dv);
  S* vs = cur.take(dv);
  S* vrs = cur.take(dv);
  S* us = cur.take(dv);
  S* ds = cur.take(dv);
  S* urs = cur.take(dv);
  S* drs = cur.take(dv);
  S* gus = cur.take(dv);
  S* gvb = cur.take(dv);
  S* gurs = cur.take(dv);
  S* gvrb = cur.take(dv);
  S* rsf = cur.take(dv);
  S* carry = cur.take(dv);
  __shared__ S s_beta, s_beta_r;
  // workspace of this block: W' [C, dv, dk], R' [C, dv, dv], (u, v-v̄, ur, vr-v̄r) [C, 4, dv]
  S* wbuf = work + static_cast<std::size_t>(blk.bh) * C * (matW + matR + 4 * static_cast<std::size_t>(dv));
  S* rbuf = wbuf + static_cast<std::size_t>(C) * matW;
  S* vbuf = rbuf + static_cast<std::size_t>(C) * matR;

  for (std::size_t e = tid; e < matW; e += nt)
    G[(e / dk) * ldk + e % dk] = a.gW != nullptr ? a.gW[blk.mat(matW) + e] : S(0);
  for (std::size_t e = tid; e < matR; e += nt)
    GR[(e / dv) * ldv + e % dv] = a.gR != nullptr ? a.gR[blk.mat(matR) + e] : S(0);
  for (int i = tid; i < dv; i += nt) carry[i] = S(0);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    // ---- recompute the chunk
    for (std::size_t e = tid; e < matW; e += nt) Wr[(e / dk) * ldk + e % dk] = a.ckptW[blk.ckpt(c, matW) + e];
    for (std::size_t e = tid; e < matR; e += nt) Rr[(e / dv) * ldv + e % dv] = a.ckptR[blk.ckpt(c, matR) + e];
    for (int t = t0; t < t1; ++t) {
      const int jt = t - t0;
      S* kc = kbuf + (t & 1) * dk;
      const S* kp = kbuf + ((t + 1) & 1) * dk;
      S* krc = krbuf + (t & 1) * dv;
      const S* krp = krbuf + ((t + 1) & 1) * dv;
      const bool rst = blk.reset(a.reset, t);
      for (std::size_t e = tid; e < matW; e += nt) {
        const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
        S w = Wr[i * ldk + j];
        if (t > t0) w += us[i] * kp[j];
        if (rst) w = S(0);
        Wr[i * ldk + j] = w;
        wbuf[jt * matW + e] = w;
      }
      for (std::size_t e = tid; e < matR; e += nt) {
        const int i = static_cast<int>(e / dv), j = static_cast<int>(e % dv);
        S r = Rr[i * ldv + j];
        if (t > t0) r += urs[i] * krp[j];
        if (rst) r = S(0);
        Rr[i * ldv + j] = r;
        rbuf[jt * matR + e] = r;
      }
      for (int j = tid; j < dk; j += nt) kc[j] = a.k[blk.vec(t, dk) + j];
      for (int i = tid; i < dv; i += nt) {
        krc[i] = a.kr[blk.vec(t, dv) + i];
        vs[i] = a.v[blk.vec(t, dv) + i];
        vrs[i] = a.vr[blk.vec(t, dv) + i];
      }
      if (tid == 0) {
        s_beta = a.beta[blk.scal(t)];
        s_beta_r = a.beta_r[blk.scal(t)];
      }
      __syncthreads();
      for (int i = tid; i < dv; i += nt) {
        const S* Wi = Wr + i * ldk;
        const S* Ri = Rr + i * ldv;
        S vb = 0, vrb = 0;
        for (int j = 0; j < dk; ++j) vb += Wi[j] * kc[j];
        for (int j = 0; j < dv; ++j) vrb += Ri[j] * krc[j];
        const S d1 = vs[i] - vb, d2 = vrs[i] - vrb;
        us[i] = s_beta * d1;
        urs[i] = s_beta_r * d2;
        S* vj = vbuf + static_cast<std::size_t>(4 * jt) * dv;
        vj[i] = us[i];
        vj[dv + i] = d1;
        vj[2 * dv + i] = urs[i];
        vj[3 * dv + i] = d2;
      }
      __syncthreads();
    }
    // ---- walk the chunk backwards
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      S* kc = kbuf + (t & 1) * dk;
      const S* kn = kbuf + ((t + 1) & 1) * dk;
      S* krc = krbuf + (t & 1) * dv;
      const S* krn = krbuf + ((t + 1) & 1) * dv;
      const bool has_next = t + 1 < t1;
      const bool rst_next = has_next && blk.reset(a.reset, t + 1);
      const bool rst = blk.reset(a.reset, t);
      for (std::size_t e = tid; e < matW; e += nt) {
        const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
        if (has_next) G[i * ldk + j] = rst_next ? S(0) : G[i * ldk + j] + gvb[i] * kn[j];
        Wr[i * ldk + j] = wbuf[jt * matW + e];
      }
      for (std::size_t e = tid; e < matR; e += nt) {
        const int i = static_cast<int>(e / dv), j = static_cast<int>(e % dv);
        if (has_next) GR[i * ldv + j] = rst_next ? S(0) : GR[i * ldv + j] + gvrb[i] * krn[j];
        Rr[i * ldv + j] = rbuf[jt * matR + e];
      }
      for (int j = tid; j < dk; j += nt) {
        kc[j] = a.k[blk.vec(t, dk) + j];
        qs[j] = a.q[blk.vec(t, dk) + j];
      }
      const S* vj = vbuf + static_cast<std::size_t>(4 * jt) * dv;
      for (int i = tid; i < dv; i += nt) {
        krc[i] = a.kr[blk.vec(t, dv) + i];
        gys[i] = a.gy[blk.vec(t, dv) + i] + carry[i];
        us[i] = vj[i];
        ds[i] = vj[dv + i];
        urs[i] = vj[2 * dv + i];
        drs[i] = vj[3 * dv + i];
      }
      for (int i = tid; i < dv; i += nt) ss[i] = a.s[blk.vec(t, dv) + i];   // softmax(y_{t-1})
      if (tid == 0) {
        s_beta = a.beta[blk.scal(t)];
        s_beta_r = a.beta_r[blk.scal(t)];
      }
      __syncthreads();
      for (int i = tid; i < dv; i += nt) {
        const S g = gys[i];
        S* Gi = G + i * ldk;
        S gu = 0;
        for (int j = 0; j < dk; ++j) {
          const S x = Gi[j] + g * qs[j];     // the read W_t q
          Gi[j] = x;
          gu += x * kc[j];
        }
        S* GRi = GR + i * ldv;
        const S* Ri = Rr + i * ldv;
        S gur = 0, rs = 0, krs = 0;
        for (int j = 0; j < dv; ++j) {
          const S x = GRi[j] + g * ss[j];    // the read R_t s
          GRi[j] = x;
          gur += x * krc[j];
          rs += Ri[j] * ss[j];
          krs += krc[j] * ss[j];
        }
        gus[i] = gu;
        gvb[i] = -s_beta * gu;
        gurs[i] = gur;
        gvrb[i] = -s_beta_r * gur;
        rsf[i] = rs + urs[i] * krs;          // (R_t s)_i
        a.gv[blk.vec(t, dv) + i] = s_beta * gu;
        a.gvr[blk.vec(t, dv) + i] = s_beta_r * gur;
      }
      __syncthreads();
      for (int c2 = tid; c2 < dk + dv; c2 += nt) {
        if (c2 < dk) {
          const int j = c2;
          S gk = 0, gq = 0, ugy = 0;
          for (int i = 0; i < dv; ++i) {
            const S w = Wr[i * ldk + j];
            gk += G[i * ldk + j] * us[i] + w * gvb[i];
            gq += w * gys[i];
            ugy += us[i] * gys[i];
          }
          a.gk[blk.vec(t, dk) + j] = gk;
          a.gq[blk.vec(t, dk) + j] = gq + kc[j] * ugy;
        } else {
          const int j = c2 - dk;
          S gkr = 0, gs = 0, urgy = 0, sgs = 0;
          for (int i = 0; i < dv; ++i) {
            const S r = Rr[i * ldv + j];
            gkr += GR[i * ldv + j] * urs[i] + r * gvrb[i];
            gs += r * gys[i];
            urgy += urs[i] * gys[i];
            sgs += rsf[i] * gys[i];
          }
          a.gkr[blk.vec(t, dv) + j] = gkr;
          gs += krc[j] * urgy;                       // (R_t^T gy)_j
          carry[j] = rst ? S(0) : ss[j] * (gs - sgs);   // softmax backward into y_{t-1}
        }
      }
      if (tid == 0) {
        S gb = 0, gbr = 0;
        for (int i = 0; i < dv; ++i) {
          gb += gus[i] * ds[i];
          gbr += gurs[i] * drs[i];
        }
        a.gbeta[blk.scal(t)] = gb;
        a.gbeta_r[blk.scal(t)] = gbr;
      }
      __syncthreads();
    }
    const bool rst0 = blk.reset(a.reset, t0);
    const S* k0 = kbuf + (t0 & 1) * dk;
    const S* kr0 = krbuf + (t0 & 1) * dv;
    for (std::size_t e = tid; e < matW; e += nt) {
      const int i = static_cast<int>(e / dk), j = static_cast<int>(e % dk);
      G[i * ldk + j] = rst0 ? S(0) : G[i * ldk + j] + gvb[i] * k0[j];
    }
    for (std::size_t e = tid; e < matR; e += nt) {
      const int i = static_cast<int>(e / dv), j = static_cast<int>(e % dv);
      GR[i * ldv + j] = rst0 ? S(0) : GR[i * ldv + j] + gvrb[i] * kr0[j];
    }
    __syncthreads();
  }
  for (std::size_t e = tid; e < matW; e += nt) a.gW0[blk.mat(matW) + e] = G[(e / dk) * ldk + e % dk];
  for (std::size_t e = tid; e < matR; e += nt) a.gR0[blk.mat(matR) + e] = GR[(e / dv) * ldv + e % dv];
  for (int i = tid; i < dv; i += nt) a.gy0[blk.mat(dv) + i] = carry[i];
}

}  // namespace

std::size_t delta_rnn_smem_bytes(const Dims& n, std::size_t elem, bool backward) {
  SmemSize s;
  if (backward)
    s.mat(n.dv, n.dk).mat(n.dv, n.dv).mat(n.dv, n.dk).mat(n.dv, n.dv).vec(3 * n.dk).vec(17 * n.dv);
  else
    s.mat(n.dv, n.dk).mat(n.dv, n.dv).vec(3 * n.dk).vec(8 * n.dv);
  return s.n * elem;
}

std::size_t delta_rnn_workspace_elems(const Dims& n) {
  const std::size_t dv = n.dv, dk = n.dk;
  return static_cast<std::size_t>(n.B) * n.H * n.chunk * (dv * dk + dv * dv + 4 * dv);
}

template <typename S>
int delta_rnn_forward(const DeltaRnnFwdArgs<S>& a, int threads, cudaStream_t stream) {
  if (threads <= 0) threads = default_threads(a.n.dk, a.n.dv);
  return launch_per_head(delta_rnn_forward_kernel<S>, a.n,
                         delta_rnn_smem_bytes(a.n, sizeof(S), false), threads, stream, a);
}

template <typename S>
int delta_rnn_backward(const DeltaRnnBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  if (threads <= 0) threads = default_threads(a.n.dk, a.n.dv);
  return launch_per_head(delta_rnn_backward_kernel<S>, a.n,
                         delta_rnn_smem_bytes(a.n, sizeof(S), true), threads, stream, a, work);
}

template int delta_rnn_forward<float>(const DeltaRnnFwdArgs<float>&, int, cudaStream_t);
template int delta_rnn_forward<double>(const DeltaRnnFwdArgs<double>&, int, cudaStream_t);
template int delta_rnn_backward<float>(const DeltaRnnBwdArgs<float>&, float*, int, cudaStream_t);
template int delta_rnn_backward<double>(const DeltaRnnBwdArgs<double>&, double*, int, cudaStream_t);

}  // namespace cuda
}  // namespace rfwp
