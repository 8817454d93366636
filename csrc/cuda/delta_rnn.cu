// CUDA kernels of the Delta RNN, version B (RFWP paper Eq. 12 with f = softmax): the
// feedforward fast weights W [dv, dk] and the recurrent fast weights R [dv, dv] are both
// written by the delta rule (RFWP Eq. 8, 10); y_t = W_t q_t + R_t softmax(y_{t-1}).
// One block per (batch, head); see common.cuh for the thread layout.
#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

// Forward. Per step t (step buffers rotate over three slots, u and u_r over two):
//   S(t):   s = softmax(y_{t-1}) (uniform after a reset): every warp reduces max and sum of
//           y_{t-1} itself (no extra barrier), the block writes s;
//   Row(t): for W and R, each element owned by one lane of its row's group: the deferred
//           writes of step t-1, checkpoint, reset; v̄, W q, k.q and v̄_r, R s, kr.s reduced
//           over the row's lanes; u = β (v - v̄), u_r = β_r (v_r - v̄_r);
//           y_i = (W_i.q + u_i k.q) + (R_i.s + ur_i kr.s)   (= W_t q + R_t s, RFWP Eq. 12).
template <typename S>
RFWP_KERNEL delta_rnn_forward_kernel(DeltaRnnFwdArgs<S> a) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, wl = tid & (kWarp - 1);
  const int dk = n.dk, dv = n.dv, ldk = padded_ld(dk), ldv = padded_ld(dv);
  const int matW = dv * dk, matR = dv * dv;
  const int L = 2 * dk + 3 * dv + 2;   // k | q | v | kr | vr | beta | beta_r
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* W = cur.mat(dv, dk);
  S* R = cur.mat(dv, dv);
  S* sbuf = cur.take(3 * static_cast<std::size_t>(L));
  S* ss = cur.take(dv);
  S* yprev = cur.take(dv);
  S* us = cur.take(2 * static_cast<std::size_t>(dv));
  S* urs = cur.take(2 * static_cast<std::size_t>(dv));
  const Lanes rows(dv, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  auto segs = [&](auto&& f) {
    f(per_step(a.k, blk, dk));
    f(per_step(a.q, blk, dk));
    f(per_step(a.v, blk, dv));
    f(per_step(a.kr, blk, dv));
    f(per_step(a.vr, blk, dv));
    f(per_step(a.beta, blk, 1));
    f(per_step(a.beta_r, blk, 1));
  };
  StepVectors<S> step(segs, tid, nt);

  const S* W0 = a.W0 + blk.mat(matW);
  const S* R0 = a.R0 + blk.mat(matR);
  for (int i = rows.group; i < dv; i += rows.groups) {
    for (int j = rows.lane; j < dk; j += rows.width) W[i * ldk + j] = W0[i * dk + j];
    for (int j = rows.lane; j < dv; j += rows.width) R[i * ldv + j] = R0[i * dv + j];
  }
  for (int i = tid; i < dv; i += nt) yprev[i] = a.y0[blk.mat(dv) + i];
  if (n.T > 0) step.fetch(0);
  for (int t = 0; t < n.T; ++t) {
    S* vec = sbuf + (t % 3) * L;
    const S* pv = sbuf + ((t + 2) % 3) * L;     // step t-1
    step.store(t, vec, segs, tid, nt);
    if (t + 1 < n.T) step.fetch(t + 1);
    const bool rst = flags.at(t);
    const bool ck = n.chunk > 0 && t % n.chunk == 0;
    S* ckW = ck ? a.ckptW + blk.ckpt(t / n.chunk, matW) : nullptr;
    S* ckR = ck ? a.ckptR + blk.ckpt(t / n.chunk, matR) : nullptr;
    __syncthreads();
    // recurrent query f(y_{t-1}) (RFWP Eq. 12): softmax, uniform after a reset (y = 0)
    {
      S m = -S(INFINITY), z = 0;
      if (!rst) {
        for (int j = wl; j < dv; j += kWarp) m = dmax(m, yprev[j]);
        m = warp_max(m);
        for (int j = wl; j < dv; j += kWarp) z += dexp(yprev[j] - m);
        z = warp_sum(z);
      }
      const S inv = S(1) / z;
      S* s_out = a.s + blk.vec(t, dv);
      for (int j = tid; j < dv; j += nt) {
        const S s = rst ? S(1) / S(dv) : dexp(yprev[j] - m) * inv;
        ss[j] = s;
        s_out[j] = s;                           // kept for the backward
      }
    }
    __syncthreads();
    const S *kc = vec, *qc = vec + dk, *vc = vec + 2 * dk, *krc = vec + 2 * dk + dv,
            *vrc = vec + 2 * dk + 2 * dv;
    const S beta = vec[2 * dk + 3 * dv], beta_r = vec[2 * dk + 3 * dv + 1];
    const S *kp = pv, *krp = pv + 2 * dk + dv;
    const S* u_prev = us + ((t + 1) & 1) * dv;
    const S* ur_prev = urs + ((t + 1) & 1) * dv;
    S* u_cur = us + (t & 1) * dv;
    S* ur_cur = urs + (t & 1) * dv;
    for (int i0 = 0; i0 < dv; i0 += rows.groups) {
      const int i = i0 + rows.group;
      S vb = 0, wq = 0, kq = 0, vrb = 0, rs = 0, krs = 0;
      if (i < dv) {
        S* Wi = W + i * ldk;
        S* Ri = R + i * ldv;
        const S up = t > 0 ? u_prev[i] : S(0), urp = t > 0 ? ur_prev[i] : S(0);
        for (int j = rows.lane; j < dk; j += rows.width) {
          S w = Wi[j];
          if (t > 0) w += up * kp[j];
          if (ck) ckW[i * dk + j] = w;
          if (rst) w = S(0);
          Wi[j] = w;
          vb += w * kc[j];                    // RFWP Eq. 10 for W
          wq += w * qc[j];
          kq += kc[j] * qc[j];
        }
        for (int j = rows.lane; j < dv; j += rows.width) {
          S r = Ri[j];
          if (t > 0) r += urp * krp[j];
          if (ck) ckR[i * dv + j] = r;
          if (rst) r = S(0);
          Ri[j] = r;
          vrb += r * krc[j];                  // RFWP Eq. 10 for R
          rs += r * ss[j];
          krs += krc[j] * ss[j];
        }
      }
      vb = group_sum(vb, rows.width);
      wq = group_sum(wq, rows.width);
      kq = group_sum(kq, rows.width);
      vrb = group_sum(vrb, rows.width);
      rs = group_sum(rs, rows.width);
      krs = group_sum(krs, rows.width);
      if (i < dv && rows.lane == 0) {
        const S u = beta * (vc[i] - vb);      // RFWP Eq. 8
        const S ur = beta_r * (vrc[i] - vrb);
        u_cur[i] = u;
        ur_cur[i] = ur;
        const S y = (wq + u * kq) + (rs + ur * krs);   // RFWP Eq. 12
        yprev[i] = y;
        a.y[blk.vec(t, dv) + i] = y;
      }
    }
  }
  __syncthreads();
  const S* kl = sbuf + ((n.T + 2) % 3) * L;
  const S* krl = kl + 2 * dk + dv;
  const S* ul = us + ((n.T + 1) & 1) * dv;
  const S* url = urs + ((n.T + 1) & 1) * dv;
  S* Wout = a.W + blk.mat(matW);
  S* Rout = a.R + blk.mat(matR);
  for (int i = rows.group; i < dv; i += rows.groups) {
    for (int j = rows.lane; j < dk; j += rows.width)
      Wout[i * dk + j] = n.T > 0 ? W[i * ldk + j] + ul[i] * kl[j] : W[i * ldk + j];
    for (int j = rows.lane; j < dv; j += rows.width)
      Rout[i * dv + j] = n.T > 0 ? R[i * ldv + j] + url[i] * krl[j] : R[i * ldv + j];
  }
}

// Backward: per checkpoint chunk (last first), recompute W'_t, R'_t into the workspace and
// u, v - v̄, u_r, v_r - v̄_r (one barrier per step; the running states in shared memory when
// `stage`), then per step t:
//   Row(t): gy = dL/dy_t + carry; G_ij = [finish step t+1] + gy_i q_j, gu_i = G_i.k;
//           GR_ij = [finish step t+1] + gy_i s_j, gur_i = GR_i.kr; (R_t s)_i from R'_t;
//   Col(t): gk, gq (columns of W), gkr, gs (columns of R) with W'_t, R'_t from the workspace;
//           the carry into y_{t-1}: s_j (gs_j - s.gs) with s.gs = (R_t s).gy (softmax
//           backward); warps 0 and 1: gβ, gβ_r.
template <typename S>
RFWP_KERNEL delta_rnn_backward_kernel(DeltaRnnBwdArgs<S> a, S* work, bool stage) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, warp = tid / kWarp, wl = tid & (kWarp - 1);
  const int nwarps = nt / kWarp;
  const int dk = n.dk, dv = n.dv, ldk = padded_ld(dk), ldv = padded_ld(dv), C = n.chunk;
  const int matW = dv * dk, matR = dv * dv;
  const int Lr = dk + 3 * dv + 2;       // recompute: k | v | kr | vr | beta | beta_r
  const int Lb = 2 * dk + 7 * dv + 2;   // k | q | kr | s | gy | u | d | ur | dr | beta | beta_r
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* G = cur.mat(dv, dk);
  S* GR = cur.mat(dv, dv);
  S* Wr = stage ? cur.mat(dv, dk) : nullptr;
  S* Rr = stage ? cur.mat(dv, dv) : nullptr;
  S* rr = cur.take(3 * static_cast<std::size_t>(Lr));
  S* sb = cur.take(3 * static_cast<std::size_t>(Lb));
  S* us = cur.take(2 * static_cast<std::size_t>(dv));     // u, u_r of the recompute
  S* urs = cur.take(2 * static_cast<std::size_t>(dv));
  S* gvb = cur.take(2 * static_cast<std::size_t>(dv));    // gv̄, gv̄_r of steps t and t+1
  S* gvrb = cur.take(2 * static_cast<std::size_t>(dv));
  S* gys = cur.take(dv);                                  // dL/dy_t including the carry
  S* rsf = cur.take(dv);                                  // (R_t s)_i
  S* gbp = cur.take(dv);                                  // gu_i (v_i - v̄_i)
  S* gbrp = cur.take(dv);
  S* carry = cur.take(dv);
  const Lanes rows(dv, nt, tid), cols(dk + dv, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  const std::size_t per_block = static_cast<std::size_t>(C) * (static_cast<std::size_t>(matW) + matR + 4 * dv);
  S* wbuf = work + static_cast<std::size_t>(blk.bh) * per_block;   // W' [C, dv, dk]
  S* rbuf = wbuf + static_cast<std::size_t>(C) * matW;             // R' [C, dv, dv]
  S* vbuf = rbuf + static_cast<std::size_t>(C) * matR;             // (u, d, ur, dr) [C, 4, dv]

  const S* gW = a.gW != nullptr ? a.gW + blk.mat(matW) : nullptr;
  const S* gR = a.gR != nullptr ? a.gR + blk.mat(matR) : nullptr;
  for (int i = rows.group; i < dv; i += rows.groups) {
    for (int j = rows.lane; j < dk; j += rows.width) G[i * ldk + j] = gW != nullptr ? gW[i * dk + j] : S(0);
    for (int j = rows.lane; j < dv; j += rows.width) GR[i * ldv + j] = gR != nullptr ? gR[i * dv + j] : S(0);
  }
  for (int i = tid; i < dv; i += nt) carry[i] = S(0);
  for (int c = num_chunks(n.T, C) - 1; c >= 0; --c) {
    const int t0 = c * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    __syncthreads();   // the previous chunk's column phase has read the workspace
    // ---- recompute the chunk
    {
      auto rsegs = [&](auto&& f) {
        f(per_step(a.k, blk, dk));
        f(per_step(a.v, blk, dv));
        f(per_step(a.kr, blk, dv));
        f(per_step(a.vr, blk, dv));
        f(per_step(a.beta, blk, 1));
        f(per_step(a.beta_r, blk, 1));
      };
      StepVectors<S> rstep(rsegs, tid, nt);
      const S* ckW = a.ckptW + blk.ckpt(c, matW);
      const S* ckR = a.ckptR + blk.ckpt(c, matR);
      rstep.fetch(t0);
      for (int t = t0; t < t1; ++t) {
        const int jt = t - t0;
        S* vec = rr + (jt % 3) * Lr;
        const S* pv = rr + ((jt + 2) % 3) * Lr;
        rstep.store(t, vec, rsegs, tid, nt);
        if (t + 1 < t1) rstep.fetch(t + 1);
        const bool rst = flags.at(t);
        S* wt = wbuf + static_cast<std::size_t>(jt) * matW;
        S* rt = rbuf + static_cast<std::size_t>(jt) * matR;
        const S* wprev = jt > 0 ? wt - matW : wt;
        const S* rprev = jt > 0 ? rt - matR : rt;
        const S* u_prev = us + ((jt + 1) & 1) * dv;
        const S* ur_prev = urs + ((jt + 1) & 1) * dv;
        S* u_cur = us + (jt & 1) * dv;
        S* ur_cur = urs + (jt & 1) * dv;
        __syncthreads();
        const S *kc = vec, *vc = vec + dk, *krc = vec + dk + dv, *vrc = vec + dk + 2 * dv;
        const S beta = vec[dk + 3 * dv], beta_r = vec[dk + 3 * dv + 1];
        const S *kp = pv, *krp = pv + dk + dv;
        for (int i0 = 0; i0 < dv; i0 += rows.groups) {
          const int i = i0 + rows.group;
          S vb = 0, vrb = 0;
          if (i < dv) {
            const S up = jt > 0 ? u_prev[i] : S(0), urp = jt > 0 ? ur_prev[i] : S(0);
            for (int j = rows.lane; j < dk; j += rows.width) {
              S w = jt == 0 ? ckW[i * dk + j] : (Wr != nullptr ? Wr[i * ldk + j] : wprev[i * dk + j]) + up * kp[j];
              if (rst) w = S(0);
              if (Wr != nullptr) Wr[i * ldk + j] = w;
              wt[i * dk + j] = w;
              vb += w * kc[j];
            }
            for (int j = rows.lane; j < dv; j += rows.width) {
              S r = jt == 0 ? ckR[i * dv + j] : (Rr != nullptr ? Rr[i * ldv + j] : rprev[i * dv + j]) + urp * krp[j];
              if (rst) r = S(0);
              if (Rr != nullptr) Rr[i * ldv + j] = r;
              rt[i * dv + j] = r;
              vrb += r * krc[j];
            }
          }
          vb = group_sum(vb, rows.width);
          vrb = group_sum(vrb, rows.width);
          if (i < dv && rows.lane == 0) {
            const S d1 = vc[i] - vb, d2 = vrc[i] - vrb;
            u_cur[i] = beta * d1;
            ur_cur[i] = beta_r * d2;
            S* vj = vbuf + static_cast<std::size_t>(4 * jt) * dv;
            vj[i] = u_cur[i];
            vj[dv + i] = d1;
            vj[2 * dv + i] = ur_cur[i];
            vj[3 * dv + i] = d2;
          }
        }
      }
    }
    __syncthreads();   // u, v - v̄ of the chunk's last step, read by other threads below
    // ---- walk the chunk backwards
    auto segs = [&](auto&& f) {
      f(per_step(a.k, blk, dk));
      f(per_step(a.q, blk, dk));
      f(per_step(a.kr, blk, dv));
      f(per_step(a.s, blk, dv));                 // softmax(y_{t-1}) kept by the forward
      f(per_step(a.gy, blk, dv));
      for (int x = 0; x < 4; ++x) f(Segment<S>{vbuf + x * dv, 4 * dv, dv, t0});
      f(per_step(a.beta, blk, 1));
      f(per_step(a.beta_r, blk, 1));
    };
    StepVectors<S> step(segs, tid, nt);
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      S* vec = sb + (t % 3) * Lb;
      const S* nv = sb + ((t + 1) % 3) * Lb;         // step t+1
      step.store(t, vec, segs, tid, nt);
      if (t - 1 >= t0) step.fetch(t - 1);
      const bool has_next = t + 1 < n.T;
      const bool rst_next = flags.at(t + 1);
      const bool rst = flags.at(t);
      const S* gvb_next = gvb + ((t + 1) & 1) * dv;
      const S* gvrb_next = gvrb + ((t + 1) & 1) * dv;
      S* gvb_cur = gvb + (t & 1) * dv;
      S* gvrb_cur = gvrb + (t & 1) * dv;
      const S* wt = wbuf + static_cast<std::size_t>(jt) * matW;
      const S* rt = rbuf + static_cast<std::size_t>(jt) * matR;
      __syncthreads();
      const S *kc = vec, *qc = vec + dk, *krc = vec + 2 * dk, *sc = vec + 2 * dk + dv,
              *gyc = vec + 2 * dk + 2 * dv, *uc = vec + 2 * dk + 3 * dv, *dc = vec + 2 * dk + 4 * dv,
              *urc = vec + 2 * dk + 5 * dv, *drc = vec + 2 * dk + 6 * dv;
      const S beta = vec[2 * dk + 7 * dv], beta_r = vec[2 * dk + 7 * dv + 1];
      const S *kn = nv, *krn = nv + 2 * dk;
      for (int i0 = 0; i0 < dv; i0 += rows.groups) {
        const int i = i0 + rows.group;
        S gu = 0, gur = 0, rs = 0, krs = 0;
        if (i < dv) {
          const S g = gyc[i] + carry[i];
          const S gn = has_next ? gvb_next[i] : S(0), grn = has_next ? gvrb_next[i] : S(0);
          S* Gi = G + i * ldk;
          for (int j = rows.lane; j < dk; j += rows.width) {
            S x = Gi[j];
            if (has_next) x = rst_next ? S(0) : x + gn * kn[j];   // finish step t+1
            x += g * qc[j];                   // the read W_t q
            Gi[j] = x;
            gu += x * kc[j];
          }
          S* GRi = GR + i * ldv;
          const S* Ri = rt + i * dv;
          for (int j = rows.lane; j < dv; j += rows.width) {
            S x = GRi[j];
            if (has_next) x = rst_next ? S(0) : x + grn * krn[j];
            x += g * sc[j];                   // the read R_t s
            GRi[j] = x;
            gur += x * krc[j];
            rs += Ri[j] * sc[j];
            krs += krc[j] * sc[j];
          }
        }
        gu = group_sum(gu, rows.width);
        gur = group_sum(gur, rows.width);
        rs = group_sum(rs, rows.width);
        krs = group_sum(krs, rows.width);
        if (i < dv && rows.lane == 0) {
          gys[i] = gyc[i] + carry[i];
          gvb_cur[i] = -beta * gu;
          gvrb_cur[i] = -beta_r * gur;
          rsf[i] = rs + urc[i] * krs;         // (R_t s)_i
          gbp[i] = gu * dc[i];
          gbrp[i] = gur * drc[i];
          a.gv[blk.vec(t, dv) + i] = beta * gu;
          a.gvr[blk.vec(t, dv) + i] = beta_r * gur;
        }
      }
      __syncthreads();
      const S ugy = warp_dot(uc, gys, dv, wl), urgy = warp_dot(urc, gys, dv, wl);
      const S sgs = warp_dot(rsf, gys, dv, wl);     // s . (R_t^T gy)
      for (int c0 = 0; c0 < dk + dv; c0 += cols.groups) {
        const int c2 = c0 + cols.group;
        S x1 = 0, x2 = 0;
        if (c2 < dk) {
          const int j = c2;
          for (int i = cols.lane; i < dv; i += cols.width) {
            const S w = wt[i * dk + j];
            x1 += G[i * ldk + j] * uc[i] + w * gvb_cur[i];   // gk
            x2 += w * gys[i];                                 // (W'^T gy)_j
          }
        } else if (c2 < dk + dv) {
          const int j = c2 - dk;
          for (int i = cols.lane; i < dv; i += cols.width) {
            const S r = rt[i * dv + j];
            x1 += GR[i * ldv + j] * urc[i] + r * gvrb_cur[i];  // gkr
            x2 += r * gys[i];
          }
        }
        x1 = group_sum(x1, cols.width);
        x2 = group_sum(x2, cols.width);
        if (cols.lane == 0) {
          if (c2 < dk) {
            a.gk[blk.vec(t, dk) + c2] = x1;
            a.gq[blk.vec(t, dk) + c2] = x2 + kc[c2] * ugy;
          } else if (c2 < dk + dv) {
            const int j = c2 - dk;
            a.gkr[blk.vec(t, dv) + j] = x1;
            const S gs = x2 + krc[j] * urgy;               // (R_t^T gy)_j
            carry[j] = rst ? S(0) : sc[j] * (gs - sgs);    // softmax backward into y_{t-1}
          }
        }
      }
      if (warp == 0 || warp == (nwarps > 1 ? 1 : 0)) {
        S gb = 0, gbr = 0;
        for (int i = wl; i < dv; i += kWarp) {
          if (warp == 0) gb += gbp[i];
          if (warp == (nwarps > 1 ? 1 : 0)) gbr += gbrp[i];
        }
        if (warp == 0) gb = warp_sum(gb);
        if (warp == (nwarps > 1 ? 1 : 0)) gbr = warp_sum(gbr);
        if (wl == 0) {
          if (warp == 0) a.gbeta[blk.scal(t)] = gb;
          if (warp == (nwarps > 1 ? 1 : 0)) a.gbeta_r[blk.scal(t)] = gbr;
        }
      }
    }
  }
  __syncthreads();
  const bool rst0 = flags.at(0);
  const S* k0 = sb;
  const S* kr0 = sb + 2 * dk;
  S* gW0 = a.gW0 + blk.mat(matW);
  S* gR0 = a.gR0 + blk.mat(matR);
  for (int i = rows.group; i < dv; i += rows.groups) {
    for (int j = rows.lane; j < dk; j += rows.width) {
      S g = G[i * ldk + j];
      if (n.T > 0) g = rst0 ? S(0) : g + gvb[i] * k0[j];
      gW0[i * dk + j] = g;
    }
    for (int j = rows.lane; j < dv; j += rows.width) {
      S g = GR[i * ldv + j];
      if (n.T > 0) g = rst0 ? S(0) : g + gvrb[i] * kr0[j];
      gR0[i * dv + j] = g;
    }
  }
  for (int i = tid; i < dv; i += nt) a.gy0[blk.mat(dv) + i] = carry[i];
}

}  // namespace

std::size_t delta_rnn_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage) {
  SmemSize s;
  if (backward) {
    s.mat(n.dv, n.dk).mat(n.dv, n.dv);
    if (stage) s.mat(n.dv, n.dk).mat(n.dv, n.dv);
    s.vec(3LL * (n.dk + 3 * n.dv + 2)).vec(3LL * (2 * n.dk + 7 * n.dv + 2)).vec(13LL * n.dv);
  } else {
    s.mat(n.dv, n.dk).mat(n.dv, n.dv).vec(3LL * (2 * n.dk + 3 * n.dv + 2)).vec(6LL * n.dv);
  }
  return s.n * elem;
}

std::size_t delta_rnn_workspace_elems(const Dims& n) {
  const std::size_t dv = n.dv, dk = n.dk;
  return static_cast<std::size_t>(n.B) * n.H * n.chunk * (dv * dk + dv * dv + 4 * dv);
}

template <typename S>
int delta_rnn_forward(const DeltaRnnFwdArgs<S>& a, int threads, cudaStream_t stream) {
  return launch_per_head(delta_rnn_forward_kernel<S>, a.n, delta_rnn_smem_bytes(a.n, sizeof(S), false, false),
                         launch_threads(a.n.dk, a.n.dv, threads), stream, a);
}

template <typename S>
int delta_rnn_backward(const DeltaRnnBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  const std::size_t smem = smem_request("delta_rnn", a.n, sizeof(S), true, device_smem_optin());
  const bool stage = smem == delta_rnn_smem_bytes(a.n, sizeof(S), true, true);
  return launch_per_head(delta_rnn_backward_kernel<S>, a.n, smem, launch_threads(a.n.dk, a.n.dv, threads),
                         stream, a, work, stage);
}

template int delta_rnn_forward<float>(const DeltaRnnFwdArgs<float>&, int, cudaStream_t);
template int delta_rnn_forward<double>(const DeltaRnnFwdArgs<double>&, int, cudaStream_t);
template int delta_rnn_backward<float>(const DeltaRnnBwdArgs<float>&, float*, int, cudaStream_t);
template int delta_rnn_backward<double>(const DeltaRnnBwdArgs<double>&, double*, int, cudaStream_t);

}  // namespace cuda
}  // namespace rfwp
