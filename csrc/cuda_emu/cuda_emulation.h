// Host emulation of the subset of CUDA used by csrc/cuda/*.cu, so that the REAL kernel sources
// compile with a C++20 host compiler and run on the CPU (tests on machines without a GPU):
//
//   g++ -std=c++20 -pthread -include cuda_emu/cuda_emulation.h -x c++ cuda/lt_delta.cu ...
//
// Execution model:
//   - a launch runs its blocks one after another; the threads of a block are real std::threads
//     that meet at a std::barrier for __syncthreads() (a thread that returns from the kernel
//     drops out of the barrier, as an exited CUDA thread does);
//   - threadIdx, blockIdx, blockDim, gridDim are thread_local;
//   - dynamic shared memory (RFWP_DYNAMIC_SHARED in common.cuh) is a per-block arena filled
//     with 0xFF bytes (NaN for floating point) before every block, so reading shared memory
//     that the block never wrote shows up as NaN in the results;
//   - static __shared__ variables become function-local statics: one copy shared by all
//     threads, which is per-block storage because blocks never overlap (launches are
//     serialised by a global mutex);
//   - atomics are std::atomic_ref operations;
//   - the launch is ::cuda_emu::launch(kernel, grid, block, smem_bytes, stream, args...) in place
//     of kernel<<<grid, block, smem_bytes, stream>>>(args...) (RFWP_LAUNCH in common.cuh).
// Warp-level intrinsics (__shfl_*, __ballot_*) are not emulated; the kernels do not use them.
#pragma once

#ifndef RFWP_CUDA_EMULATION
#define RFWP_CUDA_EMULATION 1
#endif

#include <math.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

// ------------------------------------------------------------------- qualifiers and types

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Function-local static: shared by the block's threads; blocks run one at a time.
#define __shared__ static

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;

inline thread_local dim3 threadIdx{0, 0, 0};
inline thread_local dim3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};
constexpr int warpSize = 32;

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };

namespace cuda_emu {

// Limits of the emulated device (those of an sm_90 GPU).
constexpr int kMaxThreadsPerBlock = 1024;
constexpr std::size_t kDefaultSharedBytes = 48 * 1024;
constexpr std::size_t kMaxSharedBytesOptin = 227 * 1024;

inline thread_local cudaError_t last_error = cudaSuccess;
inline std::barrier<>* block_barrier = nullptr;
inline unsigned char* block_smem = nullptr;
inline std::size_t smem_limit = kDefaultSharedBytes;   // raised by cudaFuncSetAttribute

inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

inline unsigned char* dynamic_shared_memory() { return block_smem; }

// Run kernel(args...) over `grid` blocks of `block` threads (see the header comment).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t,
            Args&&... args) {
  const std::size_t nthreads = static_cast<std::size_t>(block.x) * block.y * block.z;
  if (nthreads == 0 || nthreads > kMaxThreadsPerBlock || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || smem > smem_limit) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  std::lock_guard<std::mutex> lock(launch_mutex());
  const std::tuple<Params...> params(static_cast<Params>(args)...);   // by value, like CUDA
  std::vector<std::max_align_t> arena((smem + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t) + 1);
  for (unsigned int bz = 0; bz < grid.z; ++bz)
    for (unsigned int by = 0; by < grid.y; ++by)
      for (unsigned int bx = 0; bx < grid.x; ++bx) {
        std::memset(arena.data(), 0xFF, arena.size() * sizeof(std::max_align_t));
        std::barrier<> bar(static_cast<std::ptrdiff_t>(nthreads));
        block_barrier = &bar;
        block_smem = reinterpret_cast<unsigned char*>(arena.data());
        std::vector<std::thread> threads;
        threads.reserve(nthreads);
        for (std::size_t tid = 0; tid < nthreads; ++tid) {
          threads.emplace_back([&, tid, bx, by, bz] {
            threadIdx = dim3(static_cast<unsigned int>(tid % block.x),
                             static_cast<unsigned int>((tid / block.x) % block.y),
                             static_cast<unsigned int>(tid / (static_cast<std::size_t>(block.x) * block.y)));
            blockIdx = dim3(bx, by, bz);
            blockDim = block;
            gridDim = grid;
            std::apply(kernel, params);
            bar.arrive_and_drop();
          });
        }
        for (auto& t : threads) t.join();
        block_barrier = nullptr;
        block_smem = nullptr;
      }
  smem_limit = kDefaultSharedBytes;
}

}  // namespace cuda_emu

// ------------------------------------------------------------------------- device functions

inline void __syncthreads() { ::cuda_emu::block_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

template <typename T>
inline T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
template <typename T>
inline T atomicSub(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_sub(v);
}
template <typename T>
inline T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v);
}
template <typename T>
inline T atomicCAS(T* p, T expected, T desired) {
  std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired);
  return expected;   // the old value in both cases
}
template <typename T>
inline T atomicMax(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (old < v && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (v < old && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}

// --------------------------------------------------------------------------- runtime API

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = ::cuda_emu::last_error;
  ::cuda_emu::last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return ::cuda_emu::last_error; }
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    default: return "unspecified launch failure";
  }
}
inline cudaError_t cudaGetDevice(int* dev) {
  *dev = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
  *value = static_cast<int>(::cuda_emu::kMaxSharedBytesOptin);
  return cudaSuccess;
}
// Raises the shared-memory limit of the next launch (the emulator does not track kernels).
inline cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<std::size_t>(value) > ::cuda_emu::kMaxSharedBytesOptin)
    return cudaErrorInvalidValue;
  ::cuda_emu::smem_limit = static_cast<std::size_t>(value);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
