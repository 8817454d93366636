// Self-test of the CUDA emulation (and valid CUDA: also compiled by nvcc in the tests).
// One kernel exercising what the emulator promises: a static __shared__ array reduced over
// the block with __syncthreads(), half of the block returning early (the others keep
// synchronising), integer and float atomicAdd, atomicMax, atomicCAS, and dynamic shared
// memory that holds 0xFF bytes (NaN) until written (emulation only).
#include "../cuda/common.cuh"

namespace {

__global__ void selftest_kernel(int* counter, float* fsum, int* maxv, int* cas_winner,
                                int* block_sums, float* smem_probe) {
  __shared__ int part[1024];
  RFWP_DYNAMIC_SHARED(dyn);
  float* dynf = reinterpret_cast<float*>(dyn);
  const int tid = threadIdx.x, nt = blockDim.x;
  if (tid == 0) smem_probe[blockIdx.x] = dynf[0];   // before anyone writes it
  __syncthreads();
  part[tid] = tid + 1;
  dynf[tid] = 1.0f;
  atomicAdd(counter, 1);
  atomicAdd(fsum, 0.5f);
  atomicMax(maxv, static_cast<int>(blockIdx.x) * nt + tid);
  atomicCAS(cas_winner, -1, static_cast<int>(blockIdx.x) * nt + tid);
  __syncthreads();
  int width = nt;                        // tree reduction; threads exit as they finish
  while (width > 1) {
    const int half = (width + 1) / 2;
    if (tid >= half) return;
    if (tid + half < width) part[tid] += part[tid + half];
    width = half;
    __syncthreads();
  }
  if (tid == 0) block_sums[blockIdx.x] = part[0] + static_cast<int>(dynf[nt - 1]) - 1;
}

}  // namespace

// Host launcher (pointers to device memory; host memory in the emulation).
extern "C" int rfwp_emu_selftest(int blocks, int threads, int* counter, float* fsum, int* maxv,
                                 int* cas_winner, int* block_sums, float* smem_probe) {
  if (threads > 1024) return static_cast<int>(cudaErrorInvalidConfiguration);
  auto kernel = selftest_kernel;
  RFWP_LAUNCH(kernel, dim3(blocks), dim3(threads), threads * sizeof(float), nullptr, counter, fsum,
              maxv, cas_winner, block_sums, smem_probe);
  return static_cast<int>(cudaGetLastError());
}
