// Shared device helpers of the CUDA recurrences, and the two constructs that differ between
// nvcc and the host-compiler emulation (csrc/cuda_emu/cuda_emulation.h, which defines
// RFWP_CUDA_EMULATION): the dynamic shared memory declaration and the kernel launch.
//
// Block structure used by every kernel (one block per (batch, head) pair, a whole number of
// warps, at most kMaxThreads threads):
//   - row phases (matrix-vector products): `Lanes` gives each row `width` consecutive lanes of
//     one warp (a power of two, as many as the block allows); each lane sums a strided part of
//     the row and the lanes combine with __shfl_xor_sync in a fixed tree: deterministic, and a
//     row of a d x d matrix costs d / width steps instead of d. Elements of a matrix that a row
//     phase updates are owned by the lane that reads them, so updates need no barrier;
//   - column phases (transposed products) use the same lanes over the rows of a column;
//   - block-wide scalars (softmax max/sum, dot products, the beta gradients) are reduced by a
//     warp with __shfl_xor_sync (several warps may compute the same scalar redundantly to save
//     a barrier; every warp gets the bitwise same value);
//   - the vectors of the next step are loaded into registers while the current step computes
//     (StepVectors), and the reset flags are read 64 steps at a time (ResetFlags), so a step has
//     no dependent global-memory round trip at its start;
//   - indices inside a block are 32-bit; 64-bit only for the base offset of a step or a block.
// Matrices in shared memory use an odd leading dimension so that both row and column sweeps
// are free of bank conflicts.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>

#include "../fastweight_params.h"
#include "fastweight_cuda.h"

#ifdef RFWP_CUDA_EMULATION
#define RFWP_DYNAMIC_SHARED(name) unsigned char* name = ::cuda_emu::dynamic_shared_memory()
#define RFWP_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ::cuda_emu::launch(kernel, grid, block, smem, stream, __VA_ARGS__)
#else
#include <cuda_runtime.h>
#define RFWP_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#define RFWP_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#endif

// Every recurrence kernel: at most kMaxThreads threads per block, so ptxas keeps the
// registers per thread at or below 65536 / kMaxThreads and any block the launcher makes fits
// the register file.
#define RFWP_KERNEL __global__ void __launch_bounds__(::rfwp::cuda::kMaxThreads, 1)

namespace rfwp {
namespace cuda {

constexpr int kMaxThreads = 512;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kPrefetchRegs = 2;   // step-vector elements per thread held in registers

__host__ __device__ inline int padded_ld(int cols) { return (cols % 2 == 0) ? cols + 1 : cols; }

__device__ inline float dexp(float x) { return expf(x); }
__device__ inline double dexp(double x) { return exp(x); }
__device__ inline float dtanh(float x) { return tanhf(x); }
__device__ inline double dtanh(double x) { return tanh(x); }

template <typename S>
__device__ inline S dmax(S a, S b) { return a > b ? a : b; }

template <typename S>
__device__ inline S dsigmoid(S x) { return S(1) / (S(1) + dexp(-x)); }

// ------------------------------------------------------------------ lanes and reductions

// `width` consecutive lanes per row (a power of two dividing 32, width * rows <= threads when
// possible); group g handles rows g, g + groups, ... Loops over rows run the same number of
// times in every thread (`for (i0 = 0; i0 < rows; i0 += groups)`), so the shuffles inside
// see whole warps.
struct Lanes {
  int width, lane, group, groups;
  __device__ Lanes(int rows, int nt, int tid) {
    int w = 1;
    while (w < kWarp && 2 * w * rows <= nt) w *= 2;
    width = w;
    lane = tid & (w - 1);
    group = tid / w;
    groups = nt / w;
  }
};

// Sum over the `width` lanes of a group (xor tree: every lane gets the same value).
template <typename S>
__device__ inline S group_sum(S x, int width) {
  for (int o = width >> 1; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

template <typename S>
__device__ inline S warp_sum(S x) { return group_sum(x, kWarp); }

template <typename S>
__device__ inline S warp_max(S x) {
  for (int o = kWarp >> 1; o > 0; o >>= 1) x = dmax(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// a . b over n entries, by one warp (all lanes get the sum).
template <typename S>
__device__ inline S warp_dot(const S* a, const S* b, int n, int lane) {
  S s = 0;
  for (int j = lane; j < n; j += kWarp) s += a[j] * b[j];
  return warp_sum(s);
}

// out = softmax(x) over n entries, by one warp: max and sum by xor trees; each lane
// normalises the entries it wrote.
template <typename S>
__device__ inline void warp_softmax(const S* x, S* out, int n, int lane) {
  S m = -S(INFINITY);
  for (int j = lane; j < n; j += kWarp) m = dmax(m, x[j]);
  m = warp_max(m);
  S z = 0;
  for (int j = lane; j < n; j += kWarp) {
    const S e = dexp(x[j] - m);
    out[j] = e;
    z += e;
  }
  const S inv = S(1) / warp_sum(z);
  for (int j = lane; j < n; j += kWarp) out[j] *= inv;
}

// ---------------------------------------------------------------------------- offsets

// Offsets of one (b, h) block.
struct BlockIdx {
  int bh, b, h, BH, B;
  __device__ BlockIdx(const Dims& n, int bh_)
      : bh(bh_), b(bh_ / n.H), h(bh_ % n.H), BH(n.B * n.H), B(n.B) {}
  __device__ std::size_t vec(int t, int len) const {
    return (static_cast<std::size_t>(t) * BH + bh) * static_cast<std::size_t>(len);
  }
  __device__ std::size_t scal(int t) const { return static_cast<std::size_t>(t) * BH + bh; }
  __device__ std::size_t mat(std::size_t size) const { return static_cast<std::size_t>(bh) * size; }
  __device__ std::size_t ckpt(int c, std::size_t size) const {
    return (static_cast<std::size_t>(c) * BH + bh) * size;
  }
};

// Reset flags of entry b, read 64 steps at a time (one byte per lane, two ballots) instead of
// one global load per step. at(t) must be called by every thread of the block with the same
// t (it contains warp intrinsics); any order of t works.
struct ResetFlags {
  const uint8_t* r;
  int T, B, b, base;
  unsigned long long bits;
  __device__ ResetFlags(const uint8_t* r_, const Dims& n, int b_)
      : r(r_), T(n.T), B(n.B), b(b_), base(INT_MIN / 2), bits(0) {}
  __device__ bool at(int t) {
    if (r == nullptr || t < 0 || t >= T) return false;
    if (t < base || t >= base + 64) load(t & ~31);
    return ((bits >> (t - base)) & 1ull) != 0;
  }
  __device__ void load(int t0) {
    const int lane = static_cast<int>(threadIdx.x) & (kWarp - 1);
    const int s0 = t0 + lane, s1 = t0 + kWarp + lane;
    const int f0 = s0 < T ? r[static_cast<std::size_t>(s0) * B + b] : 0;
    const int f1 = s1 < T ? r[static_cast<std::size_t>(s1) * B + b] : 0;
    bits = static_cast<unsigned long long>(__ballot_sync(kFullMask, f0)) |
           (static_cast<unsigned long long>(__ballot_sync(kFullMask, f1)) << 32);
    base = t0;
  }
};

// ---------------------------------------------------------------- prefetched step vectors

// A per-step vector in global memory: element o of step t is base[(t - origin) * stride + o].
template <typename S>
struct Segment {
  const S* base;
  int stride, len, origin;
};

// Input x [T, B, H, len] of this block.
template <typename S>
__device__ inline Segment<S> per_step(const S* x, const BlockIdx& blk, int len) {
  return {x + static_cast<std::size_t>(blk.bh) * len, blk.BH * len, len, 0};
}

// The concatenation of a step's vectors (segments), copied to a shared-memory buffer by the
// whole block. `segs(f)` calls f(segment) for each segment in order (a lambda of the kernel:
// the segments are rebuilt from the kernel arguments when needed instead of held in
// registers). fetch(t) issues the loads of step t into registers (kPrefetchRegs elements per
// thread) and returns at once; store(t, dst) writes step t to dst, from the registers when
// fetch(t) was the last fetch, else straight from global memory. Elements beyond
// kPrefetchRegs * threads (tiny blocks) are always loaded in store().
template <typename S>
struct StepVectors {
  const S* p[kPrefetchRegs];
  int stride[kPrefetchRegs], origin[kPrefetchRegs];
  S val[kPrefetchRegs];
  int L, pending;

  template <typename Segs>
  __device__ StepVectors(Segs segs, int tid, int nt) : L(0), pending(INT_MIN) {
#pragma unroll
    for (int r = 0; r < kPrefetchRegs; ++r) {
      p[r] = nullptr;
      stride[r] = origin[r] = 0;
    }
    segs([&](const Segment<S>& s) {
#pragma unroll
      for (int r = 0; r < kPrefetchRegs; ++r) {
        const int e = tid + r * nt - L;
        if (e >= 0 && e < s.len) {
          p[r] = s.base + e;
          stride[r] = s.stride;
          origin[r] = s.origin;
        }
      }
      L += s.len;
    });
  }

  __device__ void fetch(int t) {
#pragma unroll
    for (int r = 0; r < kPrefetchRegs; ++r)
      if (p[r] != nullptr) val[r] = p[r][static_cast<long long>(t - origin[r]) * stride[r]];
    pending = t;
  }

  template <typename Segs>
  __device__ void store(int t, S* dst, Segs segs, int tid, int nt) {
    const bool have = pending == t;
#pragma unroll
    for (int r = 0; r < kPrefetchRegs; ++r)
      if (p[r] != nullptr)
        dst[tid + r * nt] = have ? val[r] : p[r][static_cast<long long>(t - origin[r]) * stride[r]];
    if (tid + kPrefetchRegs * nt < L) {   // tiny blocks: the rest straight from global memory
      int start = 0;
      segs([&](const Segment<S>& s) {
        for (int e = tid + kPrefetchRegs * nt; e < L; e += nt)
          if (e >= start && e < start + s.len)
            dst[e] = s.base[static_cast<long long>(t - s.origin) * s.stride + (e - start)];
        start += s.len;
      });
    }
    pending = INT_MIN;
  }
};

// --------------------------------------------------------------------- shared memory

// Bump allocator over the dynamic shared memory (scalar type S).
template <typename S>
struct SmemCursor {
  S* p;
  __host__ __device__ explicit SmemCursor(void* base) : p(static_cast<S*>(base)) {}
  __host__ __device__ S* take(std::size_t n) {
    S* r = p;
    p += n;
    return r;
  }
  __host__ __device__ S* mat(int rows, int cols) { return take(static_cast<std::size_t>(rows) * padded_ld(cols)); }
};

// Host: size of a sequence of takes.
struct SmemSize {
  std::size_t n = 0;
  SmemSize& mat(int rows, int cols) {
    n += static_cast<std::size_t>(rows) * padded_ld(cols);
    return *this;
  }
  SmemSize& vec(long long len) {
    n += static_cast<std::size_t>(len);
    return *this;
  }
};

// ---------------------------------------------------------------------------- launching

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Block size for a `threads` request (0: the default, about 4 matrix cells per thread):
// whole warps, at least one, at most kMaxThreads.
inline int launch_threads_for(int dk, int dv, int threads) {
  if (threads <= 0) {
    const long long cells = static_cast<long long>(dk) * dv;
    const long long t = (cells + 3) / 4;
    threads = t > kMaxThreads ? kMaxThreads : static_cast<int>(t);
  }
  if (threads > kMaxThreads) threads = kMaxThreads;
  threads = round_up(threads < kWarp ? kWarp : threads, kWarp);
  return threads;
}

// Launch `kernel(args...)` with one block per (b, h) pair and `smem` bytes of dynamic shared
// memory, raising the kernel's limit above the 48 KiB default when needed. Returns 0 or a
// CUDA error code; a failed attribute call does not leave the error pending for later calls.
template <typename Kernel, typename... Args>
int launch_per_head(Kernel kernel, const Dims& n, std::size_t smem, int threads,
                    cudaStream_t stream, Args... args) {
  if (n.B == 0 || n.H == 0) return 0;
  cudaFuncAttributes fa;
  cudaError_t err = cudaFuncGetAttributes(&fa, kernel);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return static_cast<int>(err);
  }
  // never more threads than the compiled kernel allows (its registers and launch bounds)
  if (fa.maxThreadsPerBlock < threads) threads = fa.maxThreadsPerBlock / kWarp * kWarp;
  if (threads < kWarp) return static_cast<int>(cudaErrorInvalidConfiguration);
  if (smem > 48 * 1024) {
    int dev = 0, limit = 0;
    if ((err = cudaGetDevice(&dev)) != cudaSuccess ||
        (err = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess) {
      cudaGetLastError();
      return static_cast<int>(err);
    }
    if (smem + fa.sharedSizeBytes > static_cast<std::size_t>(limit))
      return static_cast<int>(cudaErrorInvalidConfiguration);
    err = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) {
      cudaGetLastError();   // clear it: the caller falls back, later launches must not see it
      return static_cast<int>(err);
    }
  }
  RFWP_LAUNCH(kernel, dim3(static_cast<unsigned>(n.B) * static_cast<unsigned>(n.H)), dim3(threads),
              smem, stream, args...);
  return static_cast<int>(cudaGetLastError());
}

// ------------------------------------------------------------------- sums over the batch

// Internal linkage: each .cu file that launches the kernel has its own instance (a kernel
// template shared across translation units of a non-relocatable build is not portable).
namespace {

constexpr int kSumThreads = 128;

// out[h][e] = Σ_b part[b][h][e], b in order (deterministic; zero for B = 0).
template <typename S>
__global__ void __launch_bounds__(kSumThreads) batch_sum_kernel(const S* part, S* out, int B, int H, int len) {
  const int h = blockIdx.y;
  const int e = static_cast<int>(blockIdx.x) * kSumThreads + static_cast<int>(threadIdx.x);
  if (e >= len) return;
  S s = 0;
  for (int b = 0; b < B; ++b) s += part[(static_cast<std::size_t>(b) * H + h) * len + e];
  out[static_cast<std::size_t>(h) * len + e] = s;
}

// Launches batch_sum_kernel for `len` elements per head (nothing when H or len is 0); returns 0
// or a CUDA error code.
template <typename S>
int launch_batch_sum(const S* part, S* out, int B, int H, int len, cudaStream_t stream) {
  if (H == 0 || len == 0) return 0;
  const dim3 grid(static_cast<unsigned>((len + kSumThreads - 1) / kSumThreads), static_cast<unsigned>(H));
  auto kernel = batch_sum_kernel<S>;
  RFWP_LAUNCH(kernel, grid, dim3(kSumThreads), 0, stream, part, out, B, H, len);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

}  // namespace cuda
}  // namespace rfwp
