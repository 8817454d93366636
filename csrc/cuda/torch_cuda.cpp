// Torch binding of the CUDA launchers (see torch_cuda.h). Compiled only when torch has CUDA.
#include "torch_cuda.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "fastweight_cuda.h"

namespace rfwp {
namespace cuda_torch {
namespace {

// A launch that cannot be configured on this GPU (shared memory above its opt-in limit, too
// many registers, an attribute the driver refuses) raises NotImplementedError, so that the
// Python dispatch can fall back to the reference; any other CUDA error raises RuntimeError.
void check(int err, const char* op, std::size_t smem, int threads) {
  if (err == 0) return;
  const cudaError_t e = static_cast<cudaError_t>(err);
  const bool config = e == cudaErrorInvalidConfiguration || e == cudaErrorInvalidValue ||
                      e == cudaErrorLaunchOutOfResources || e == cudaErrorNoKernelImageForDevice ||
                      e == cudaErrorInvalidDeviceFunction;
  // The message is formatted with snprintf, not streamed: streaming the numbers into c10::str
  // crashed this error path on an H200 machine (torch 2.11+cu130; SIGSEGV inside
  // std::ostream::_M_insert<long>), turning a clean refusal into a dead process.
  char msg[384];
  std::snprintf(msg, sizeof msg, "rfwp_rl CUDA kernel %s %s: %s (block of %d threads, %zu bytes of "
                "dynamic shared memory)", op, config ? "cannot run on this GPU" : "failed",
                cudaGetErrorString(e), threads, smem);
  TORCH_CHECK_NOT_IMPLEMENTED(!config, static_cast<const char*>(msg));
  TORCH_CHECK(false, static_cast<const char*>(msg));
}

at::Tensor workspace(std::size_t elems, const at::Tensor& like) {
  // freed when this returns; the caching allocator orders its reuse after the kernel on
  // the current stream
  return at::empty({static_cast<int64_t>(elems)}, like.options());
}

}  // namespace

// The device guard comes first: the launcher reads the current device's limits.
#define RFWP_FORWARD(op, Args, name)                                                        \
  template <typename S>                                                                     \
  void op(const Args<S>& a, const at::Tensor& like, int64_t threads) {                      \
    const c10::cuda::CUDAGuard guard(like.device());                                        \
    const int err = rfwp::cuda::op(a, static_cast<int>(threads),                            \
                                   c10::cuda::getCurrentCUDAStream().stream());             \
    if (err != 0)                                                                           \
      check(err, #op, rfwp::cuda::smem_request(name, a.n, sizeof(S), false, rfwp::cuda::device_smem_optin()), \
            rfwp::cuda::launch_threads(a.n.dk, a.n.dv, static_cast<int>(threads)));       \
  }
#define RFWP_BACKWARD(op, Args, name, ws_fn)                                                \
  template <typename S>                                                                     \
  void op(const Args<S>& a, const at::Tensor& like, int64_t threads) {                      \
    const c10::cuda::CUDAGuard guard(like.device());                                        \
    at::Tensor work = workspace(rfwp::cuda::ws_fn(a.n), like);                              \
    const int err = rfwp::cuda::op(a, work.data_ptr<S>(), static_cast<int>(threads),        \
                                   c10::cuda::getCurrentCUDAStream().stream());             \
    if (err != 0)                                                                           \
      check(err, #op, rfwp::cuda::smem_request(name, a.n, sizeof(S), true, rfwp::cuda::device_smem_optin()), \
            rfwp::cuda::launch_threads(a.n.dk, a.n.dv, static_cast<int>(threads)));       \
  }

RFWP_FORWARD(lt_forward, DeltaFwdArgs, "lt")
RFWP_FORWARD(delta_forward, DeltaFwdArgs, "delta")
RFWP_FORWARD(delta_rnn_forward, DeltaRnnFwdArgs, "delta_rnn")
RFWP_FORWARD(rdn_forward, RdnFwdArgs, "rdn")
RFWP_BACKWARD(lt_backward, DeltaBwdArgs, "lt", lt_delta_workspace_elems)
RFWP_BACKWARD(delta_backward, DeltaBwdArgs, "delta", lt_delta_workspace_elems)
RFWP_BACKWARD(delta_rnn_backward, DeltaRnnBwdArgs, "delta_rnn", delta_rnn_workspace_elems)
RFWP_BACKWARD(rdn_backward, RdnBwdArgs, "rdn", rdn_workspace_elems)
RFWP_FORWARD(mamba_forward, MambaFwdArgs, "mamba")
RFWP_BACKWARD(mamba_backward, MambaBwdArgs, "mamba", mamba_workspace_elems)
#undef RFWP_FORWARD
#undef RFWP_BACKWARD

// gated_delta / delta_product (one kernel) and srwm: their own workspace sizes and block sizes
template <typename S>
void product_forward(const ProductFwdArgs<S>& a, const at::Tensor& like, int64_t threads) {
  const c10::cuda::CUDAGuard guard(like.device());
  const int err = rfwp::cuda::product_forward(a, static_cast<int>(threads),
                                              c10::cuda::getCurrentCUDAStream().stream());
  if (err != 0)
    check(err, "product_forward", rfwp::cuda::product_smem_bytes(a.n, sizeof(S), false, false),
          rfwp::cuda::launch_threads(a.n.dk, a.n.dv, static_cast<int>(threads)));
}
template <typename S>
void product_backward(const ProductBwdArgs<S>& a, const at::Tensor& like, int64_t threads) {
  const c10::cuda::CUDAGuard guard(like.device());
  at::Tensor work = workspace(rfwp::cuda::product_workspace_elems(a.n, a.nh), like);
  const int err = rfwp::cuda::product_backward(a, work.data_ptr<S>(), static_cast<int>(threads),
                                               c10::cuda::getCurrentCUDAStream().stream());
  if (err != 0)
    check(err, "product_backward", rfwp::cuda::product_smem_bytes(a.n, sizeof(S), true, false),
          rfwp::cuda::launch_threads(a.n.dk, a.n.dv, static_cast<int>(threads)));
}
template <typename S>
void srwm_forward(const SrwmFwdArgs<S>& a, const at::Tensor& like, int64_t threads) {
  const c10::cuda::CUDAGuard guard(like.device());
  const int err = rfwp::cuda::srwm_forward(a, static_cast<int>(threads),
                                           c10::cuda::getCurrentCUDAStream().stream());
  if (err != 0)
    check(err, "srwm_forward", rfwp::cuda::smem_request("srwm", a.n, sizeof(S), false, rfwp::cuda::device_smem_optin()),
          rfwp::cuda::srwm_threads(a.n, static_cast<int>(threads)));
}
template <typename S>
void srwm_backward(const SrwmBwdArgs<S>& a, const at::Tensor& like, int64_t threads) {
  const c10::cuda::CUDAGuard guard(like.device());
  at::Tensor work = workspace(rfwp::cuda::srwm_workspace_elems(a.n), like);
  const int err = rfwp::cuda::srwm_backward(a, work.data_ptr<S>(), static_cast<int>(threads),
                                            c10::cuda::getCurrentCUDAStream().stream());
  if (err != 0)
    check(err, "srwm_backward", rfwp::cuda::smem_request("srwm", a.n, sizeof(S), true, rfwp::cuda::device_smem_optin()),
          rfwp::cuda::srwm_threads(a.n, static_cast<int>(threads)));
}

#define RFWP_INSTANTIATE(S)                                                                 \
  template void lt_forward<S>(const DeltaFwdArgs<S>&, const at::Tensor&, int64_t);          \
  template void lt_backward<S>(const DeltaBwdArgs<S>&, const at::Tensor&, int64_t);         \
  template void delta_forward<S>(const DeltaFwdArgs<S>&, const at::Tensor&, int64_t);       \
  template void delta_backward<S>(const DeltaBwdArgs<S>&, const at::Tensor&, int64_t);      \
  template void delta_rnn_forward<S>(const DeltaRnnFwdArgs<S>&, const at::Tensor&, int64_t); \
  template void delta_rnn_backward<S>(const DeltaRnnBwdArgs<S>&, const at::Tensor&, int64_t); \
  template void rdn_forward<S>(const RdnFwdArgs<S>&, const at::Tensor&, int64_t);           \
  template void rdn_backward<S>(const RdnBwdArgs<S>&, const at::Tensor&, int64_t);          \
  template void product_forward<S>(const ProductFwdArgs<S>&, const at::Tensor&, int64_t);   \
  template void product_backward<S>(const ProductBwdArgs<S>&, const at::Tensor&, int64_t);  \
  template void srwm_forward<S>(const SrwmFwdArgs<S>&, const at::Tensor&, int64_t);         \
  template void srwm_backward<S>(const SrwmBwdArgs<S>&, const at::Tensor&, int64_t);         \
  template void mamba_forward<S>(const MambaFwdArgs<S>&, const at::Tensor&, int64_t);       \
  template void mamba_backward<S>(const MambaBwdArgs<S>&, const at::Tensor&, int64_t);
RFWP_INSTANTIATE(float)
RFWP_INSTANTIATE(double)
#undef RFWP_INSTANTIATE

}  // namespace cuda_torch
}  // namespace rfwp
