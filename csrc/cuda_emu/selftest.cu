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

// Warp intrinsics: per thread, 8 ints: xor-tree sum over the warp, broadcast of lane 3,
// ballot of (tid + 1) % 3 == 0, shuffle up by 1, shuffle down by 2, xor-tree sum over
// segments of 8 lanes (width 8), shuffle of lane (lane + 5) % 32, and twice a double
// exchanged with the neighbour (xor 1).
namespace {

__global__ void warp_selftest_kernel(int* out) {
  const int tid = threadIdx.x, lane = tid & 31;
  const int v = tid + 1;
  int s = v;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int b = __shfl_sync(0xffffffffu, v, 3);
  const unsigned bal = __ballot_sync(0xffffffffu, (v % 3) == 0);
  const int up = __shfl_up_sync(0xffffffffu, v, 1);
  const int dn = __shfl_down_sync(0xffffffffu, v, 2);
  int x8 = v;
  for (int o = 4; o > 0; o >>= 1) x8 += __shfl_xor_sync(0xffffffffu, x8, o, 8);
  const int rot = __shfl_sync(0xffffffffu, v, (lane + 5) % 32);
  const double dd = __shfl_xor_sync(0xffffffffu, 0.5 * v, 1);
  __syncwarp();
  int* o = out + 8 * tid;
  o[0] = s;
  o[1] = b;
  o[2] = static_cast<int>(bal);
  o[3] = up;
  o[4] = dn;
  o[5] = x8;
  o[6] = rot;
  o[7] = static_cast<int>(2.0 * dd);
}

}  // namespace

extern "C" int rfwp_emu_warp_selftest(int threads, int* out) {
  auto kernel = warp_selftest_kernel;
  RFWP_LAUNCH(kernel, dim3(1), dim3(threads), 0, nullptr, out);
  return static_cast<int>(cudaGetLastError());
}
