// Host emulation of the subset of CUDA used by csrc/cuda/*.cu, so that the REAL kernel sources
// compile with a C++20 host compiler and run on the CPU (tests on machines without a GPU):
//
//   g++ -std=c++20 -pthread -include cuda_emu/cuda_emulation.h -x c++ cuda/lt_delta.cu ...
//
// Execution model:
//   - a launch runs its blocks one after another; the threads of a block are fibers (ucontext) on
//     the launching thread, resumed in turn, each running until it waits at a barrier or returns:
//     __syncthreads() waits until every thread still in the block has arrived (a thread that
//     returns from the kernel drops out of the barrier, as an exited CUDA thread does). Built
//     with ThreadSanitizer (or -DRFWP_EMU_THREADS) they are real std::threads meeting at a
//     mutex-and-condition-variable barrier instead, so that the sanitizer sees the accesses of
//     concurrent threads;
//   - threadIdx, blockIdx, blockDim, gridDim are thread_local;
//   - dynamic shared memory (RFWP_DYNAMIC_SHARED in common.cuh) is a per-block arena filled
//     with 0xFF bytes (NaN for floating point) before every block, so reading shared memory
//     that the block never wrote shows up as NaN in the results;
//   - static __shared__ variables become function-local statics: one copy shared by all
//     threads, which is per-block storage because blocks never overlap (launches are
//     serialised by a global mutex);
//   - atomics are std::atomic_ref operations;
//   - warps: threads 32w .. 32w+31 of a block form warp w, which has its own barrier and
//     exchange slots: __shfl_sync, __shfl_xor_sync, __shfl_up/down_sync, __ballot_sync,
//     __any/__all_sync and __syncwarp make the warp's threads meet (lockstep at every warp
//     intrinsic) and exchange values as on a GPU. A warp barrier orders only the threads of
//     that warp, so ThreadSanitizer still reports a missing __syncthreads() between threads
//     of different warps. Masks must name every thread of the warp (the kernels only use
//     full-warp intrinsics in warp-uniform code); anything else aborts;
//   - the launch is ::cuda_emu::launch(kernel, grid, block, smem_bytes, stream, args...) in place
//     of kernel<<<grid, block, smem_bytes, stream>>>(args...) (RFWP_LAUNCH in common.cuh); every
//     launch is appended to a log (grid, block, dynamic shared memory) that tests read.
#pragma once

#ifndef RFWP_CUDA_EMULATION
#define RFWP_CUDA_EMULATION 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(RFWP_EMU_THREADS)
#define RFWP_EMU_THREADS 1   // ThreadSanitizer checks real threads: a block's threads become std::threads
#endif

#include <math.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
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
enum cudaDeviceAttr { cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };

struct cudaFuncAttributes {
  std::size_t sharedSizeBytes = 0;
  int maxThreadsPerBlock = 1024;
  int numRegs = 0;
};

namespace cuda_emu {

// Limits of the emulated device (those of an sm_90 GPU).
constexpr int kMaxThreadsPerBlock = 1024;
constexpr std::size_t kDefaultSharedBytes = 48 * 1024;
constexpr std::size_t kMaxSharedBytesOptin = 227 * 1024;

inline thread_local cudaError_t last_error = cudaSuccess;
// What cudaDeviceGetAttribute reports as the opt-in limit (tests lower it to force the
// launchers' smaller layouts, or raise it above kMaxSharedBytesOptin to make
// cudaFuncSetAttribute fail as a driver would).
inline std::size_t reported_smem_optin = kMaxSharedBytesOptin;
#ifndef RFWP_EMU_THREADS
// A block's threads are fibers on the launching thread (the header comment); a barrier makes its fiber wait
// until every thread still in the block has arrived.
struct Fiber {
  ucontext_t context;
  char* stack = nullptr;
  dim3 thread;
  struct Warp* warp = nullptr;
  unsigned lane = 0, phase = 0;
  bool waiting = false, done = false;
};
inline Fiber* running_fiber = nullptr;   // the fiber the scheduler resumed last
inline ucontext_t scheduler_context;
// 0: the scheduler resumes a block's fibers in thread order; else in an order drawn afresh for every round
// from this seed, so that a kernel whose result depends on the order of its threads between barriers
// (a missing barrier) gives different results under different seeds.
inline unsigned schedule_seed = 0;

inline void yield_to_scheduler() { swapcontext(&running_fiber->context, &scheduler_context); }

class Barrier {
 public:
  explicit Barrier(std::ptrdiff_t expected) : expected_(expected) {}
  void arrive_and_wait() {
    if (++arrived_ == expected_) {
      release();
      return;
    }
    running_fiber->waiting = true;
    waiters_.push_back(running_fiber);
    yield_to_scheduler();   // resumed once the last thread has arrived
  }
  void arrive_and_drop() {   // an exited thread: the barrier no longer waits for it
    if (--expected_ == arrived_ && arrived_ > 0) release();
  }

 private:
  void release() {
    arrived_ = 0;
    for (Fiber* f : waiters_) f->waiting = false;
    waiters_.clear();
  }
  std::ptrdiff_t expected_, arrived_ = 0;
  std::vector<Fiber*> waiters_;
};
#else
// A block's threads are std::threads, and a barrier sleeps at once: std::barrier spins first, which with
// a block's threads far outnumbering the cores costs more than the kernel's work.
class Barrier {
 public:
  explicit Barrier(std::ptrdiff_t expected) : expected_(expected) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long long phase = phase_;
    if (++arrived_ == expected_) {
      release();
      return;
    }
    released_.wait(lock, [&] { return phase_ != phase; });
  }
  void arrive_and_drop() {   // an exited thread: the barrier no longer waits for it
    std::lock_guard<std::mutex> lock(mutex_);
    if (--expected_ == arrived_ && arrived_ > 0) release();
  }

 private:
  void release() {   // with mutex_ held
    arrived_ = 0;
    ++phase_;
    released_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable released_;
  std::ptrdiff_t expected_, arrived_ = 0;
  unsigned long long phase_ = 0;
};
#endif

inline Barrier* block_barrier = nullptr;
inline unsigned char* block_smem = nullptr;
inline std::size_t smem_limit = kDefaultSharedBytes;   // raised by cudaFuncSetAttribute

// One warp of the running block: its barrier and two sets of exchange slots (alternating
// between consecutive intrinsics, so that a fast lane's next write never meets a slow lane's
// read of the previous exchange: both sides of one barrier separate them).
struct Warp {
  Barrier bar;
  unsigned size;                          // threads in this warp (the last may be partial)
  unsigned long long slots[2][32];
  explicit Warp(unsigned n) : bar(static_cast<std::ptrdiff_t>(n)), size(n), slots{} {}
};
inline thread_local Warp* this_warp = nullptr;
inline thread_local unsigned this_lane = 0;
inline thread_local unsigned warp_phase = 0;

// Launch log (tests compare the configuration a launcher asked for with cuda_limits).
struct LaunchRecord {
  unsigned grid, block;
  std::size_t smem;
};
inline std::vector<LaunchRecord>& launch_log() {
  static std::vector<LaunchRecord> log;
  return log;
}

inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

inline unsigned char* dynamic_shared_memory() { return block_smem; }

inline dim3 thread_index(std::size_t tid, dim3 block) {
  return dim3(static_cast<unsigned int>(tid % block.x), static_cast<unsigned int>((tid / block.x) % block.y),
              static_cast<unsigned int>(tid / (static_cast<std::size_t>(block.x) * block.y)));
}

#ifndef RFWP_EMU_THREADS
constexpr std::size_t kFiberStackBytes = 256 * 1024;
inline std::function<void()> fiber_body;   // the running block's kernel call

inline void fiber_entry() {
  fiber_body();
  this_warp->bar.arrive_and_drop();   // an exited thread leaves its warp and block
  block_barrier->arrive_and_drop();
  running_fiber->done = true;         // uc_link returns to the scheduler
}

// Runs one block: resumes its runnable fibers in turn until every one has returned.
inline void run_block(std::size_t nthreads, dim3 block, std::vector<std::unique_ptr<Warp>>& warps) {
  static std::vector<std::unique_ptr<char[]>> stacks;   // reused by later blocks and launches
  while (stacks.size() < nthreads) stacks.emplace_back(new char[kFiberStackBytes]);
  std::vector<Fiber> fibers(nthreads);
  for (std::size_t tid = 0; tid < nthreads; ++tid) {
    Fiber& f = fibers[tid];
    f.stack = stacks[tid].get();
    f.thread = thread_index(tid, block);
    f.warp = warps[tid / 32].get();
    f.lane = static_cast<unsigned>(tid % 32);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = kFiberStackBytes;
    f.context.uc_link = &scheduler_context;
    makecontext(&f.context, fiber_entry, 0);
  }
  std::vector<std::size_t> order(nthreads);
  for (std::size_t i = 0; i < nthreads; ++i) order[i] = i;
  std::minstd_rand draw(schedule_seed);
  for (std::size_t left = nthreads; left > 0;) {
    bool resumed = false;
    if (schedule_seed != 0) std::shuffle(order.begin(), order.end(), draw);
    for (std::size_t i : order) {
      Fiber& f = fibers[i];
      if (f.done || f.waiting) continue;
      threadIdx = f.thread;
      this_warp = f.warp;
      this_lane = f.lane;
      warp_phase = f.phase;
      running_fiber = &f;
      swapcontext(&scheduler_context, &f.context);
      f.phase = warp_phase;
      resumed = true;
      left -= f.done;
    }
    if (!resumed) {
      std::fprintf(stderr, "cuda emulation: deadlock: every thread left waits at a barrier the others never reach\n");
      std::abort();
    }
  }
  running_fiber = nullptr;
}
#endif

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
  launch_log().push_back({grid.x * grid.y * grid.z, static_cast<unsigned>(nthreads), smem});
  const std::tuple<Params...> params(static_cast<Params>(args)...);   // by value, like CUDA
  std::vector<std::max_align_t> arena((smem + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t) + 1);
  for (unsigned int bz = 0; bz < grid.z; ++bz)
    for (unsigned int by = 0; by < grid.y; ++by)
      for (unsigned int bx = 0; bx < grid.x; ++bx) {
        std::memset(arena.data(), 0xFF, arena.size() * sizeof(std::max_align_t));
        Barrier bar(static_cast<std::ptrdiff_t>(nthreads));
        block_barrier = &bar;
        block_smem = reinterpret_cast<unsigned char*>(arena.data());
        std::vector<std::unique_ptr<Warp>> warps;
        for (std::size_t w = 0; w * 32 < nthreads; ++w)
          warps.push_back(std::make_unique<Warp>(static_cast<unsigned>(std::min<std::size_t>(32, nthreads - 32 * w))));
#ifndef RFWP_EMU_THREADS
        blockIdx = dim3(bx, by, bz);
        blockDim = block;
        gridDim = grid;
        fiber_body = [&] { std::apply(kernel, params); };
        run_block(nthreads, block, warps);
        fiber_body = nullptr;
#else
        std::vector<std::thread> threads;
        threads.reserve(nthreads);
        for (std::size_t tid = 0; tid < nthreads; ++tid) {
          threads.emplace_back([&, tid, bx, by, bz] {
            this_warp = warps[tid / 32].get();
            this_lane = static_cast<unsigned>(tid % 32);
            warp_phase = 0;
            threadIdx = thread_index(tid, block);
            blockIdx = dim3(bx, by, bz);
            blockDim = block;
            gridDim = grid;
            std::apply(kernel, params);
            this_warp->bar.arrive_and_drop();   // an exited thread leaves its warp and block
            bar.arrive_and_drop();
          });
        }
        for (auto& t : threads) t.join();
#endif
        block_barrier = nullptr;
        block_smem = nullptr;
      }
  smem_limit = kDefaultSharedBytes;
}

}  // namespace cuda_emu

// ------------------------------------------------------------------------- device functions

inline void __syncthreads() { ::cuda_emu::block_barrier->arrive_and_wait(); }

namespace cuda_emu {

inline void check_mask(unsigned mask, const char* what) {
  const unsigned n = this_warp->size;
  const unsigned full = n == 32 ? 0xffffffffu : ((1u << n) - 1u);
  if ((mask & full) != full) {
    std::fprintf(stderr, "cuda emulation: %s with mask 0x%08x in a warp of %u threads: only "
                 "full-warp masks are emulated\n", what, mask, n);
    std::abort();
  }
}

// Every lane publishes `value`, the warp meets, every lane reads lane `src`'s value.
template <typename T>
T exchange(unsigned mask, T value, unsigned src, const char* what) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffles move at most 8 bytes");
  check_mask(mask, what);
  Warp& w = *this_warp;
  unsigned long long* slots = w.slots[warp_phase];
  warp_phase ^= 1u;
  std::memcpy(&slots[this_lane], &value, sizeof(T));
  w.bar.arrive_and_wait();
  T out = value;
  if (src < w.size) std::memcpy(&out, &slots[src], sizeof(T));
  return out;
}

}  // namespace cuda_emu

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::cuda_emu::check_mask(mask, "__syncwarp");
  ::cuda_emu::this_warp->bar.arrive_and_wait();
}

// width: a power of two <= 32 splitting the warp into segments (CUDA semantics).
template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const unsigned lane = ::cuda_emu::this_lane, w = static_cast<unsigned>(width);
  const unsigned src = (lane & ~(w - 1u)) + (static_cast<unsigned>(src_lane) & (w - 1u));
  return ::cuda_emu::exchange(mask, var, src, "__shfl_sync");
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  const unsigned lane = ::cuda_emu::this_lane, w = static_cast<unsigned>(width);
  unsigned src = lane ^ static_cast<unsigned>(lane_mask);
  if (src >= ((lane / w) + 1u) * w) src = lane;   // a later segment: the lane's own value
  return ::cuda_emu::exchange(mask, var, src, "__shfl_xor_sync");
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const unsigned lane = ::cuda_emu::this_lane, w = static_cast<unsigned>(width);
  unsigned src = lane + delta;
  if ((src & ~(w - 1u)) != (lane & ~(w - 1u))) src = lane;
  return ::cuda_emu::exchange(mask, var, src, "__shfl_down_sync");
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const unsigned lane = ::cuda_emu::this_lane, w = static_cast<unsigned>(width);
  unsigned src = lane - delta;
  if (delta > (lane & (w - 1u))) src = lane;
  return ::cuda_emu::exchange(mask, var, src, "__shfl_up_sync");
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  ::cuda_emu::check_mask(mask, "__ballot_sync");
  ::cuda_emu::Warp& w = *::cuda_emu::this_warp;
  unsigned long long* slots = w.slots[::cuda_emu::warp_phase];
  ::cuda_emu::warp_phase ^= 1u;
  slots[::cuda_emu::this_lane] = predicate != 0;
  w.bar.arrive_and_wait();
  unsigned bits = 0;
  for (unsigned l = 0; l < w.size; ++l) bits |= static_cast<unsigned>(slots[l] != 0) << l;
  return bits & mask;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) == (mask & (::cuda_emu::this_warp->size == 32
                                                        ? 0xffffffffu
                                                        : ((1u << ::cuda_emu::this_warp->size) - 1u)));
}
inline unsigned __activemask() { return 0xffffffffu; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
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
  if (attr == cudaDevAttrMaxThreadsPerBlock) {
    *value = ::cuda_emu::kMaxThreadsPerBlock;
    return cudaSuccess;
  }
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
  *value = static_cast<int>(::cuda_emu::reported_smem_optin);
  return cudaSuccess;
}
// The emulator does not see __launch_bounds__: a kernel may have any block size it allows.
template <typename F>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F) {
  *attr = cudaFuncAttributes{};
  attr->maxThreadsPerBlock = ::cuda_emu::kMaxThreadsPerBlock;
  return cudaSuccess;
}
// Raises the shared-memory limit of the next launch (the emulator does not track kernels).
// A failure also sets the last error, as CUDA does.
inline cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<std::size_t>(value) > ::cuda_emu::kMaxSharedBytesOptin)
    return ::cuda_emu::last_error = cudaErrorInvalidValue;
  ::cuda_emu::smem_limit = static_cast<std::size_t>(value);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
