// Torch binding of the CUDA launchers (see torch_cuda.h). Compiled only when torch has CUDA.
#include "torch_cuda.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include "fastweight_cuda.h"

namespace rfwp {
namespace cuda_torch {
namespace {

void check(int err, const char* op, std::size_t smem) {
  TORCH_CHECK(err == 0, "rfwp_rl CUDA kernel ", op, " failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)), " (block needs ", smem,
              " bytes of shared memory)");
}

at::Tensor workspace(std::size_t elems, const at::Tensor& like) {
  // freed when this returns; the caching allocator orders its reuse after the kernel on
  // the current stream
  return at::empty({static_cast<int64_t>(elems)}, like.options());
}

}  // namespace

#define RFWP_FORWARD(op, Args, smem_fn)                                                     \
  template <typename S>                                                                     \
  void op(const Args<S>& a, const at::Tensor& like, int64_t threads) {                      \
    const c10::cuda::CUDAGuard guard(like.device());                                        \
    check(rfwp::cuda::op(a, static_cast<int>(threads), c10::cuda::getCurrentCUDAStream().stream()),   \
          #op, rfwp::cuda::smem_fn(a.n, sizeof(S), false));                                 \
  }
#define RFWP_BACKWARD(op, Args, smem_fn, ws_fn)                                             \
  template <typename S>                                                                     \
  void op(const Args<S>& a, const at::Tensor& like, int64_t threads) {                      \
    const c10::cuda::CUDAGuard guard(like.device());                                        \
    at::Tensor work = workspace(rfwp::cuda::ws_fn(a.n), like);                              \
    check(rfwp::cuda::op(a, work.data_ptr<S>(), static_cast<int>(threads),                  \
                         c10::cuda::getCurrentCUDAStream().stream()),                                 \
          #op, rfwp::cuda::smem_fn(a.n, sizeof(S), true));                                  \
  }

RFWP_FORWARD(lt_forward, DeltaFwdArgs, lt_delta_smem_bytes)
RFWP_FORWARD(delta_forward, DeltaFwdArgs, lt_delta_smem_bytes)
RFWP_FORWARD(delta_rnn_forward, DeltaRnnFwdArgs, delta_rnn_smem_bytes)
RFWP_FORWARD(rdn_forward, RdnFwdArgs, rdn_smem_bytes)
RFWP_BACKWARD(lt_backward, DeltaBwdArgs, lt_delta_smem_bytes, lt_delta_workspace_elems)
RFWP_BACKWARD(delta_backward, DeltaBwdArgs, lt_delta_smem_bytes, lt_delta_workspace_elems)
RFWP_BACKWARD(delta_rnn_backward, DeltaRnnBwdArgs, delta_rnn_smem_bytes, delta_rnn_workspace_elems)
RFWP_BACKWARD(rdn_backward, RdnBwdArgs, rdn_smem_bytes, rdn_workspace_elems)
#undef RFWP_FORWARD
#undef RFWP_BACKWARD

#define RFWP_INSTANTIATE(S)                                                                 \
  template void lt_forward<S>(const DeltaFwdArgs<S>&, const at::Tensor&, int64_t);          \
  template void lt_backward<S>(const DeltaBwdArgs<S>&, const at::Tensor&, int64_t);         \
  template void delta_forward<S>(const DeltaFwdArgs<S>&, const at::Tensor&, int64_t);       \
  template void delta_backward<S>(const DeltaBwdArgs<S>&, const at::Tensor&, int64_t);      \
  template void delta_rnn_forward<S>(const DeltaRnnFwdArgs<S>&, const at::Tensor&, int64_t); \
  template void delta_rnn_backward<S>(const DeltaRnnBwdArgs<S>&, const at::Tensor&, int64_t); \
  template void rdn_forward<S>(const RdnFwdArgs<S>&, const at::Tensor&, int64_t);           \
  template void rdn_backward<S>(const RdnBwdArgs<S>&, const at::Tensor&, int64_t);
RFWP_INSTANTIATE(float)
RFWP_INSTANTIATE(double)
#undef RFWP_INSTANTIATE

}  // namespace cuda_torch
}  // namespace rfwp
