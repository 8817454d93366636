// Launcher interface of the CUDA recurrences (defined in lt_delta.cu, delta_rnn.cu, rdn.cu,
// householder_product.cu, srwm.cu, selective_scan.cu).
//
// Needs neither torch nor the CUDA headers: the argument blocks are plain structs of device
// pointers (fastweight_params.h) and the stream is CUDA's opaque `cudaStream_t`.
//
// Every launcher runs one thread block per (batch, head) pair (mamba: per batch entry, its D x N
// state being the dv x dk matrix), launch_threads(dk, dv, threads) threads per block, and returns 0 on success or a CUDA error code (cudaErrorInvalidConfiguration
// when the block's shared memory exceeds the device's opt-in limit; a failed attribute call is
// cleared, not left pending).
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

// Block size used when `threads` is 0: about 4 cells of the dv x dk matrix per thread, whole
// warps, at most kMaxThreads (512, the kernels' __launch_bounds__).
int default_threads(int dk, int dv);
// Block size a launcher uses for a request of `threads` (0: default_threads): rounded up to
// whole warps and clamped to [32, 512] (and to what the compiled kernel allows).
int launch_threads(int dk, int dv, int threads);

// Dynamic shared memory (bytes) of a kernel. `stage`: the backward's running state during the
// recomputation (and rdn's recurrent slow weights) in shared memory; the launchers stage when
// that fits the device's opt-in limit (smem_request) and read them from global memory otherwise.
std::size_t lt_delta_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage);
std::size_t delta_rnn_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage);
std::size_t rdn_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage);
// gated_delta / delta_product have one layout (`stage` is ignored): the forward keeps the state,
// the backward the gradient of the state in shared memory, everything else is in global memory;
// their shared memory does not depend on nh. srwm stages that matrix when it fits (else it stays
// in global memory: srwm has no size limit).
std::size_t product_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage);
std::size_t srwm_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage);
// mamba stages its state (forward), or the gradient of the state and the entry's partial gradient
// of A (backward), when they fit; else they stay in global memory (no size limit, no shared memory).
std::size_t mamba_smem_bytes(const Dims& n, std::size_t elem, bool backward, bool stage);
// What the launcher of `op` ("lt", "delta", "delta_rnn", "rdn", "gated_delta",
// "delta_product", "srwm", "mamba") requests on a device whose
// opt-in limit is `optin` bytes (static shared memory not included).
std::size_t smem_request(const char* op, const Dims& n, std::size_t elem, bool backward, std::size_t optin);
// The current device's opt-in shared memory per block (bytes), or 0 if it cannot be read.
std::size_t device_smem_optin();

std::size_t lt_delta_workspace_elems(const Dims& n);
std::size_t delta_rnn_workspace_elems(const Dims& n);
std::size_t rdn_workspace_elems(const Dims& n);
std::size_t product_workspace_elems(const Dims& n, int nh);
std::size_t srwm_workspace_elems(const Dims& n);
std::size_t mamba_workspace_elems(const Dims& n);
// Block size of the srwm kernels: launch_threads for its (3d + 4) x d matrix.
int srwm_threads(const Dims& n, int threads);

template <typename S> int lt_forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int lt_backward(const DeltaBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
template <typename S> int delta_forward(const DeltaFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int delta_backward(const DeltaBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
template <typename S> int delta_rnn_forward(const DeltaRnnFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int delta_rnn_backward(const DeltaRnnBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
template <typename S> int rdn_forward(const RdnFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int rdn_backward(const RdnBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
// gated_delta (a.alpha set, a.nh == 1) and delta_product (a.alpha == nullptr)
template <typename S> int product_forward(const ProductFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int product_backward(const ProductBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
// srwm_backward also sums the per-(b, h) W_init gradients over b (a second launch)
template <typename S> int srwm_forward(const SrwmFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int srwm_backward(const SrwmBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);
// mamba (a.n.H == 1, dk = N, dv = D); mamba_backward also sums the per-entry gradients of A
// over b (a second launch)
template <typename S> int mamba_forward(const MambaFwdArgs<S>& a, int threads, cudaStream_t stream);
template <typename S> int mamba_backward(const MambaBwdArgs<S>& a, S* workspace, int threads, cudaStream_t stream);

}  // namespace cuda
}  // namespace rfwp
