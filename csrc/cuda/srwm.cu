// CUDA kernels of the modern self-referential weight matrix (SRWM paper, ICML 2022, Eq. 5-8)
// with the softmax feature map, forward and backward. One block per (batch, head); see
// common.cuh for the thread layout and cpu/srwm_impl.h for the equations of the backward.
//
// The head's W = W_init + dW has R = 3d + 4 rows (y, q, k: d each; 4 learning-rate rows).
// dW (forward) and G (backward) live in shared memory when they fit the device, else in their
// output buffers in global memory (the same code: each element is touched by its owner lane,
// and read by others only after a barrier); W_init is read from global memory (shared by the
// batch: cache hits). Forward, per step:
//   Row:   (checkpoint, reset) p_r = W_r . x_t, reduced over the row's lanes; y_t = p[0, d);
//   Warp0: qs = softmax(p[d, 2d)), ks = softmax(p[2d, 3d)), sg = sigmoid(p[3d, 3d + 4)), qs - ks;
//   Row:   e_r = W_r . (qs - ks);  dW_r += sg[block(r)] e_r ks.
// Backward (G = dL/dW_t in shared memory), per checkpoint chunk, last to first:
//   recompute: dW_{t-1} (after the reset) of every step into a workspace slot (each lane reads
//     back only what it wrote), and qs, ks, sg, e;
//   reverse, per step: Row: gu_r = G_r . ks, ge_r = sg_blk gu_r, gu_r e_r (for gsg);
//     Col: gks_c = Σ_r G_rc u_r - W_rc ge_r,  gqs_c = Σ_r W_rc ge_r;  Warp0: gsg per block;
//     Warp0: gp = [gy, softmax'(gqs), softmax'(gks), gsg sg (1 - sg)];
//     Col: gx_c = Σ_r W_rc gp_r;  Row: J = ge (x) (qs - ks) + gp (x) x_t; the block's W_init
//     gradient += J (global, owned elements); G += J, or G = 0 after a reset at t.
// A second kernel sums the per-(b, h) W_init gradients over b in order (deterministic).
#include <string>

#include "common.cuh"

namespace rfwp {
namespace cuda {
namespace {

constexpr int kRates = 4;

__host__ __device__ inline int srwm_rows(int d) { return 3 * d + kRates; }
__device__ inline int row_block(int r, int d) { return r < 3 * d ? r / d : 3; }

// Vectors of one step kept by the backward's recomputation: qs, ks [d], sg [4], e [R].
__host__ __device__ inline int step_vector_len(int d) { return 2 * d + kRates + srwm_rows(d); }

// Shared memory of the forward: dW (when staged), then x, p, qs, ks, qs - ks, sg.
template <typename S>
struct FwdSmem {
  S *M, *x, *p, *qs, *ks, *df, *sg;
  __device__ FwdSmem(void* base, int d, bool stage) {
    SmemCursor<S> cur(base);
    const int R = srwm_rows(d);
    M = stage ? cur.mat(R, d) : nullptr;
    x = cur.take(d);
    p = cur.take(R);
    qs = cur.take(d);
    ks = cur.take(d);
    df = cur.take(d);
    sg = cur.take(kRates);
  }
};

// Warp 0 (all of it): qs, ks, sg and qs - ks from p (Eq. 5's q, k, β through φ and σ).
template <typename S>
__device__ inline void activate(const S* p, int d, S* qs, S* ks, S* sg, S* df, int lane) {
  warp_softmax(p + d, qs, d, lane);
  warp_softmax(p + 2 * d, ks, d, lane);
  if (lane < kRates) sg[lane] = dsigmoid(p[3 * d + lane]);
  for (int c = lane; c < d; c += kWarp) df[c] = qs[c] - ks[c];   // entries this lane wrote
}

// Row phase of Eq. 5: p_r = (W_init + dW)_r . x for the rows of this thread's group. state(r, c)
// returns dW_{t-1}[r][c] (after the reset) and does the caller's bookkeeping (checkpoint, slot).
template <typename S, typename State>
__device__ inline void read_rows(const Lanes& rows, int d, const S* Wi, const S* x, S* p, State state) {
  const int R = srwm_rows(d);
  for (int r0 = 0; r0 < R; r0 += rows.groups) {
    const int r = r0 + rows.group;
    S acc = 0;
    if (r < R)
      for (int c = rows.lane; c < d; c += rows.width) acc += (Wi[r * d + c] + state(r, c)) * x[c];
    acc = group_sum(acc, rows.width);                    // SRWM Eq. 5: W_{t-1} φ(x_t)
    if (r < R && rows.lane == 0) p[r] = acc;
  }
}

// Row phase of Eq. 6-8: e_r = (W_init + dW)_r . (qs - ks) (Eq. 6-7: v - v̄), then
// write(r, c, u_r) for the owned elements with u_r = sg[block(r)] e_r (Eq. 8: dW += u (x) ks);
// keep(r, e_r) by lane 0 of the row's group.
template <typename S, typename Get, typename Write, typename Keep>
__device__ inline void write_rows(const Lanes& rows, int d, const S* Wi, const S* df, const S* sg,
                                  Get dw, Write write, Keep keep) {
  const int R = srwm_rows(d);
  for (int r0 = 0; r0 < R; r0 += rows.groups) {
    const int r = r0 + rows.group;
    S e = 0;
    if (r < R)
      for (int c = rows.lane; c < d; c += rows.width) e += (Wi[r * d + c] + dw(r, c)) * df[c];
    e = group_sum(e, rows.width);
    if (r < R) {
      if (rows.lane == 0) keep(r, e);
      const S u = sg[row_block(r, d)] * e;
      for (int c = rows.lane; c < d; c += rows.width) write(r, c, u);
    }
  }
}

// `stage`: dW in shared memory, else in the output a.dW itself (global memory; every element is
// only ever touched by the lane that owns it, so the kernel is the same).
template <typename S>
RFWP_KERNEL srwm_forward_kernel(SrwmFwdArgs<S> a, bool stage) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, d = n.dv, R = srwm_rows(d);
  const int mat = R * d, ld = stage ? padded_ld(d) : d;
  RFWP_DYNAMIC_SHARED(smem_raw);
  const FwdSmem<S> sm(smem_raw, d, stage);
  S* out = a.dW + blk.mat(mat);
  S* dW = stage ? sm.M : out;
  const Lanes rows(R, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  const S* Wi = a.Winit + static_cast<std::size_t>(blk.h) * mat;
  const S* dW0 = a.dW0 + blk.mat(mat);
  for (int r = rows.group; r < R; r += rows.groups)
    for (int c = rows.lane; c < d; c += rows.width) dW[r * ld + c] = dW0[r * d + c];
  for (int t = 0; t < n.T; ++t) {
    const bool rst = flags.at(t);
    S* ckpt = (n.chunk > 0 && t % n.chunk == 0) ? a.ckpt + blk.ckpt(t / n.chunk, mat) : nullptr;
    __syncthreads();   // the previous step has read x, qs, ks, sg
    for (int c = tid; c < d; c += nt) sm.x[c] = a.x[blk.vec(t, d) + c];
    __syncthreads();
    read_rows(rows, d, Wi, sm.x, sm.p, [&](int r, int c) {
      const S w = dW[r * ld + c];
      if (ckpt != nullptr) ckpt[r * d + c] = w;
      if (rst) dW[r * ld + c] = S(0);
      return rst ? S(0) : w;
    });
    __syncthreads();
    if (tid < kWarp) activate(sm.p, d, sm.qs, sm.ks, sm.sg, sm.df, tid);
    for (int c = tid; c < d; c += nt) a.y[blk.vec(t, d) + c] = sm.p[c];   // y_t
    __syncthreads();
    write_rows(rows, d, Wi, sm.df, sm.sg, [&](int r, int c) { return dW[r * ld + c]; },
               [&](int r, int c, S u) { dW[r * ld + c] += u * sm.ks[c]; }, [](int, S) {});
  }
  if (stage)
    for (int r = rows.group; r < R; r += rows.groups)
      for (int c = rows.lane; c < d; c += rows.width) out[r * d + c] = dW[r * ld + c];
}

// `stage`: G in shared memory, else in the output a.gdW0 itself (global memory; its column
// phases read it after a barrier, like the shared copy).
template <typename S>
RFWP_KERNEL srwm_backward_kernel(SrwmBwdArgs<S> a, S* work, bool stage) {
  const Dims n = a.n;
  const BlockIdx blk(n, blockIdx.x);
  const int tid = threadIdx.x, nt = blockDim.x, wl = tid & (kWarp - 1);
  const int d = n.dv, R = srwm_rows(d), mat = R * d, C = n.chunk, ld = stage ? padded_ld(d) : d;
  const int L = step_vector_len(d);
  RFWP_DYNAMIC_SHARED(smem_raw);
  SmemCursor<S> cur(smem_raw);
  S* gdW0 = a.gdW0 + blk.mat(mat);
  S* G = stage ? cur.mat(R, d) : gdW0;
  S* x = cur.take(d);
  S* gy = cur.take(d);
  S* vec = cur.take(L);              // qs | ks | sg | e of the step
  S* df = cur.take(d);
  S* p = cur.take(R);                // the recompute's p; the reverse's gp
  S* ge = cur.take(R);
  S* gue = cur.take(R);              // gu_r e_r
  S* gqs = cur.take(d);
  S* gks = cur.take(d);
  S* gsg = cur.take(kRates);
  S* qs = vec;
  S* ks = vec + d;
  S* sg = vec + 2 * d;
  S* e = vec + 2 * d + kRates;
  const Lanes rows(R, nt, tid), cols(d, nt, tid);
  ResetFlags flags(a.reset, n, blk.b);
  const S* Wi = a.Winit + static_cast<std::size_t>(blk.h) * mat;
  // workspace of this block: dW_{t-1} [C][R][d], then the step vectors [C][L]
  S* slots = work + static_cast<std::size_t>(blk.bh) * C * (static_cast<std::size_t>(mat) + L);
  S* vecs = slots + static_cast<std::size_t>(C) * mat;
  S* part = a.gWinit_part + blk.mat(mat);

  const S* gdW = a.gdW != nullptr ? a.gdW + blk.mat(mat) : nullptr;
  for (int r = rows.group; r < R; r += rows.groups)
    for (int c = rows.lane; c < d; c += rows.width) {
      G[r * ld + c] = gdW != nullptr ? gdW[r * d + c] : S(0);
      part[r * d + c] = S(0);
    }
  for (int ch = num_chunks(n.T, C) - 1; ch >= 0; --ch) {
    const int t0 = ch * C, t1 = (t0 + C < n.T) ? t0 + C : n.T;
    const S* ck = a.ckpt + blk.ckpt(ch, mat);
    // ---- recompute the chunk
    for (int t = t0; t < t1; ++t) {
      const int jt = t - t0;
      const bool rst = flags.at(t);
      S* cur_slot = slots + static_cast<std::size_t>(jt) * mat;
      __syncthreads();   // the previous step (or the previous chunk's reverse) has read x, vec
      for (int c = tid; c < d; c += nt) x[c] = a.x[blk.vec(t, d) + c];
      __syncthreads();
      read_rows(rows, d, Wi, x, p, [&](int r, int c) {
        // dW_{t-1}: the checkpoint, or what this lane wrote for step t - 1
        const S w = rst ? S(0) : (jt == 0 ? ck[r * d + c] : cur_slot[r * d + c]);
        cur_slot[r * d + c] = w;
        return w;
      });
      __syncthreads();
      if (tid < kWarp) activate(p, d, qs, ks, sg, df, tid);
      __syncthreads();
      S* kept = vecs + static_cast<std::size_t>(jt) * L;
      for (int i = tid; i < 2 * d + kRates; i += nt) kept[i] = vec[i];
      S* next = t + 1 < t1 ? cur_slot + mat : nullptr;   // dW_t, the next step's state before its reset
      write_rows(rows, d, Wi, df, sg, [&](int r, int c) { return cur_slot[r * d + c]; },
                 [&](int r, int c, S u) {
                   if (next != nullptr) next[r * d + c] = cur_slot[r * d + c] + u * ks[c];
                 },
                 [&](int r, S e) { kept[2 * d + kRates + r] = e; });
    }
    // ---- walk the chunk backwards
    for (int t = t1 - 1; t >= t0; --t) {
      const int jt = t - t0;
      const bool rst = flags.at(t);
      const S* dWp = slots + static_cast<std::size_t>(jt) * mat;
      const S* kept = vecs + static_cast<std::size_t>(jt) * L;
      __syncthreads();   // the recompute's vectors are written; the previous step has read these
      for (int i = tid; i < L; i += nt) vec[i] = kept[i];
      for (int c = tid; c < d; c += nt) {
        x[c] = a.x[blk.vec(t, d) + c];
        gy[c] = a.gy[blk.vec(t, d) + c];
        df[c] = kept[c] - kept[d + c];
      }
      __syncthreads();
      for (int r0 = 0; r0 < R; r0 += rows.groups) {      // dW_t = dW_{t-1} + u (x) ks
        const int r = r0 + rows.group;
        S gu = 0;
        if (r < R)
          for (int c = rows.lane; c < d; c += rows.width) gu += G[r * ld + c] * ks[c];
        gu = group_sum(gu, rows.width);
        if (r < R && rows.lane == 0) {
          ge[r] = sg[row_block(r, d)] * gu;
          gue[r] = gu * e[r];
        }
      }
      __syncthreads();
      for (int c0 = 0; c0 < d; c0 += cols.groups) {      // e = W (qs - ks); G^T u
        const int c = c0 + cols.group;
        S gq = 0, gk = 0;
        if (c < d)
          for (int r = cols.lane; r < R; r += cols.width) {
            const S wge = (Wi[r * d + c] + dWp[r * d + c]) * ge[r];
            gq += wge;
            gk += G[r * ld + c] * sg[row_block(r, d)] * e[r] - wge;
          }
        gq = group_sum(gq, cols.width);
        gk = group_sum(gk, cols.width);
        if (c < d && cols.lane == 0) {
          gqs[c] = gq;
          gks[c] = gk;
        }
      }
      if (tid < kWarp)
        for (int b = 0; b < kRates; ++b) {
          S s = 0;
          const int lo = b < 3 ? b * d : 3 * d, hi = b < 3 ? lo + d : R;
          for (int r = lo + wl; r < hi; r += kWarp) s += gue[r];
          s = warp_sum(s);
          if (wl == 0) gsg[b] = s;
        }
      __syncthreads();
      if (tid < kWarp) {                                  // gp = dL/d[y, q, k, b]
        const S sq = warp_dot(qs, gqs, d, wl), sk = warp_dot(ks, gks, d, wl);
        for (int c = wl; c < d; c += kWarp) {
          p[c] = gy[c];
          p[d + c] = qs[c] * (gqs[c] - sq);
          p[2 * d + c] = ks[c] * (gks[c] - sk);
        }
        if (wl < kRates) p[3 * d + wl] = gsg[wl] * sg[wl] * (S(1) - sg[wl]);
      }
      __syncthreads();
      for (int c0 = 0; c0 < d; c0 += cols.groups) {      // p = W x: gx = W^T gp
        const int c = c0 + cols.group;
        S gx = 0;
        if (c < d)
          for (int r = cols.lane; r < R; r += cols.width) gx += (Wi[r * d + c] + dWp[r * d + c]) * p[r];
        gx = group_sum(gx, cols.width);
        if (c < d && cols.lane == 0) a.gx[blk.vec(t, d) + c] = gx;
      }
      for (int r = rows.group; r < R; r += rows.groups)
        for (int c = rows.lane; c < d; c += rows.width) {
          const S j = ge[r] * df[c] + p[r] * x[c];       // dL/dW_{t-1} through step t
          part[r * d + c] += j;
          G[r * ld + c] = rst ? S(0) : G[r * ld + c] + j;
        }
    }
  }
  if (stage)
    for (int r = rows.group; r < R; r += rows.groups)
      for (int c = rows.lane; c < d; c += rows.width) gdW0[r * d + c] = G[r * ld + c];
}

}  // namespace

std::size_t srwm_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage) {
  const int d = n.dv, R = srwm_rows(d);
  SmemSize s;
  if (stage) s.mat(R, d);
  if (backward) s.vec(2LL * d + step_vector_len(d) + d + 3LL * R + 2LL * d + kRates);
  else s.vec(d + R + 3LL * d + kRates);
  return s.n * elem;
}

std::size_t srwm_workspace_elems(const Dims& n) {
  const int d = n.dv;
  return static_cast<std::size_t>(n.B) * n.H * n.chunk *
         (static_cast<std::size_t>(srwm_rows(d)) * d + step_vector_len(d));
}

int srwm_threads(const Dims& n, int threads) { return launch_threads(n.dv, srwm_rows(n.dv), threads); }

// The staged layout (the matrix in shared memory) when it fits the device, else the matrix in
// global memory (smem_request).
template <typename S>
int srwm_forward(const SrwmFwdArgs<S>& a, int threads, cudaStream_t stream) {
  const std::size_t smem = smem_request("srwm", a.n, sizeof(S), false, device_smem_optin());
  const bool stage = smem == srwm_smem_bytes(a.n, sizeof(S), false, true);
  return launch_per_head(srwm_forward_kernel<S>, a.n, smem, srwm_threads(a.n, threads), stream, a, stage);
}

template <typename S>
int srwm_backward(const SrwmBwdArgs<S>& a, S* work, int threads, cudaStream_t stream) {
  const std::size_t smem = smem_request("srwm", a.n, sizeof(S), true, device_smem_optin());
  const bool stage = smem == srwm_smem_bytes(a.n, sizeof(S), true, true);
  int err = launch_per_head(srwm_backward_kernel<S>, a.n, smem, srwm_threads(a.n, threads), stream, a,
                            work, stage);
  if (err != 0) return err;
  return launch_batch_sum(a.gWinit_part, a.gWinit, a.n.B, a.n.H, srwm_rows(a.n.dv) * a.n.dv, stream);
}

#define RFWP_INSTANTIATE(S)                                                          \
  template int srwm_forward<S>(const SrwmFwdArgs<S>&, int, cudaStream_t);            \
  template int srwm_backward<S>(const SrwmBwdArgs<S>&, S*, int, cudaStream_t);
RFWP_INSTANTIATE(float)
RFWP_INSTANTIATE(double)
#undef RFWP_INSTANTIATE

}  // namespace cuda
}  // namespace rfwp
