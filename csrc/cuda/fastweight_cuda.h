// Launcher interface of the CUDA recurrences (defined in lt_delta.cu, delta_rnn.cu, rdn.cu).
//
// Needs neither torch nor the CUDA headers: the argument blocks are plain structs of device
// pointers (fastweight_params.h) and the stream is CUDA's opaque `cudaStream_t`.
//
// Every launcher runs one thread block per (batch, head) pair, `threads` threads per block
// (0: default_threads()), and returns 0 on success or the CUDA error code of the launch.
// Backward launchers take a device workspace of *_workspace_elems() scalars (the states
// recomputed inside one checkpoint chunk). All launches are asynchronous on `stream`;
// no atomics are used, so results are bitwise reproducible.
#pragma once

#include <cstddef>

#include "../fastweight_params.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace rfwp {
namespace cuda {

// Block size used when `threads` is 0: a multiple of 32 covering the dv x dk matrix, at most 256.
int default_threads(int dk, int dv);

// Dynamic shared memory (bytes) a kernel needs; the launchers fail with
// cudaErrorInvalidConfiguration if it exceeds the device's opt-in limit.
std::size_t lt_delta_smem_bytes(const Dims& n, std::size_t elem, bool backward);
std::size_t delta_rnn_smem_bytes(const Dims& n, std::size_t elem, bool backward);
std::size_t rdn_smem_bytes(const Dims& n, std::size_t elem, bool backward);

std::size_t lt_delta_workspace_elems(const Dims& n);
std::size_t delta_rnn_workspace_elems(const Dims& n);
std::size_t rdn_workspace_elems(const Dims& n);

template <typename S> int lt_forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int lt_backward(const DeltaBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
template <typename S> int delta_forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int delta_backward(const DeltaBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
template <typename S> int delta_rnn_forward(const DeltaRnnFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int delta_rnn_backward(const DeltaRnnBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
template <typename S> int rdn_forward(const RdnFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int rdn_backward(const RdnBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);

}  // namespace cuda
}  // namespace rfwp
