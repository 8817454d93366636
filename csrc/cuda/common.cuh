// Shared device helpers of the CUDA recurrences, and the two constructs that differ between
// nvcc and the host-compiler emulation (csrc/cuda_emu/cuda_emulation.h, which defines
// RFWP_CUDA_EMULATION): the dynamic shared memory declaration and the kernel launch.
//
// Block structure used by every kernel (one block per (batch, head) pair):
//   - "element" loops: e = tid, tid + blockDim, ... over a dv x dk matrix (any block size,
//     any matrix size; each element always belongs to the same thread);
//   - "row" loops: thread i owns row i (i = tid, tid + blockDim, ...) and reduces over the
//     key dimension sequentially in a fixed order (no atomics, deterministic);
//   - "column" loops: the same over columns, for transposed products.
// Matrices in shared memory use an odd leading dimension so that both row and column
// sweeps are free of bank conflicts.
#pragma once

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

namespace rfwp {
namespace cuda {

__host__ __device__ inline int padded_ld(int cols) { return (cols % 2 == 0) ? cols + 1 : cols; }

__device__ inline float dexp(float x) { return expf(x); }
__device__ inline double dexp(double x) { return exp(x); }
__device__ inline float dtanh(float x) { return tanhf(x); }
__device__ inline double dtanh(double x) { return tanh(x); }

template <typename S>
__device__ inline S dmax(S a, S b) { return a > b ? a : b; }

template <typename S>
__device__ inline S dsigmoid(S x) { return S(1) / (S(1) + dexp(-x)); }

// out = softmax(x) over n entries, by ONE thread (sequential, deterministic).
template <typename S>
__device__ inline void softmax_serial(const S* x, S* out, int n) {
  S m = x[0];
  for (int j = 1; j < n; ++j) m = dmax(m, x[j]);
  S z = 0;
  for (int j = 0; j < n; ++j) {
    out[j] = dexp(x[j] - m);
    z += out[j];
  }
  const S inv = S(1) / z;
  for (int j = 0; j < n; ++j) out[j] *= inv;
}

// Offsets of one (b, h) block.
struct BlockIdx {
  int bh, b, BH, B;
  __device__ BlockIdx(const Dims& n, int bh_) : bh(bh_), b(bh_ / n.H), BH(n.B * n.H), B(n.B) {}
  __device__ std::size_t vec(int t, int len) const {
    return (static_cast<std::size_t>(t) * BH + bh) * len;
  }
  __device__ std::size_t scal(int t) const { return static_cast<std::size_t>(t) * BH + bh; }
  __device__ std::size_t mat(std::size_t size) const { return static_cast<std::size_t>(bh) * size; }
  __device__ std::size_t ckpt(int c, std::size_t size) const {
    return (static_cast<std::size_t>(c) * BH + bh) * size;
  }
  __device__ bool reset(const uint8_t* r, int t) const {
    return r != nullptr && r[static_cast<std::size_t>(t) * B + b] != 0;
  }
};

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
};

// Host: size of a sequence of takes.
struct SmemSize {
  std::size_t n = 0;
  SmemSize& mat(int rows, int cols) {
    n += static_cast<std::size_t>(rows) * padded_ld(cols);
    return *this;
  }
  SmemSize& vec(int len) {
    n += static_cast<std::size_t>(len);
    return *this;
  }
};

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Launch `kernel(args...)` with one block per (b, h) pair and `smem` bytes of dynamic shared
// memory (raising the kernel's limit above the 48 KiB default when needed).
template <typename Kernel, typename... Args>
int launch_per_head(Kernel kernel, const Dims& n, std::size_t smem, int threads,
                    cudaStream_t stream, Args... args) {
  if (smem > 48 * 1024) {
    int dev = 0, limit = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (smem > static_cast<std::size_t>(limit)) return static_cast<int>(cudaErrorInvalidConfiguration);
    const cudaError_t err = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem));
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  if (n.B == 0 || n.H == 0) return 0;
  RFWP_LAUNCH(kernel, dim3(n.B * n.H), dim3(threads), smem, stream, args...);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cuda
}  // namespace rfwp
