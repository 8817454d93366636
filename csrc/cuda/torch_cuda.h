// Thin torch side of the CUDA kernels (torch_cuda.cpp, compiled only when torch has CUDA):
// device guard, current stream, workspace allocation, error check, then the launcher.
#pragma once

#include <ATen/ATen.h>

#include "../fastweight_params.h"

namespace rfwp {
namespace cuda_torch {

template <typename S> void lt_forward(const DeltaFwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void lt_backward(const DeltaBwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void delta_forward(const DeltaFwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void delta_backward(const DeltaBwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void delta_rnn_forward(const DeltaRnnFwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void delta_rnn_backward(const DeltaRnnBwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void rdn_forward(const RdnFwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void rdn_backward(const RdnBwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void product_forward(const ProductFwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void product_backward(const ProductBwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void srwm_forward(const SrwmFwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void srwm_backward(const SrwmBwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void mamba_forward(const MambaFwdArgs<S>& a, const at::Tensor& like, int64_t threads);
template <typename S> void mamba_backward(const MambaBwdArgs<S>& a, const at::Tensor& like, int64_t threads);

}  // namespace cuda_torch
}  // namespace rfwp
