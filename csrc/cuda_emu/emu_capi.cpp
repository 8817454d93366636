// C interface of the emulated CUDA kernels (built with cuda_emulation.h force-included, see
// rfwp_rl/kernels/_build.py) for ctypes: each op takes the pointers of its argument block in
// field order (fastweight_params.h), the dims {T, B, H, dk, dv, chunk} (the product ops add
// nh as a seventh; mamba: {T, B, 1, N, D, chunk}) and the block size.
// Returns the launcher's CUDA error code (0: success).
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include "../cuda/common.cuh"

namespace {

template <typename Args>
constexpr std::size_t num_pointers() {
  static_assert(std::is_standard_layout_v<Args>, "argument blocks must be standard layout");
  return offsetof(Args, n) / sizeof(void*);
}

template <typename Args>
Args make(void* const* ptrs, const int* dims) {
  Args a{};
  std::memcpy(static_cast<void*>(&a), ptrs, num_pointers<Args>() * sizeof(void*));
  a.n = rfwp::Dims{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]};
  return a;
}

rfwp::Dims dims_of(const int* d) { return rfwp::Dims{d[0], d[1], d[2], d[3], d[4], d[5]}; }

}  // namespace

#define RFWP_EMU_FWD(op, Args, S, suffix)                                           \
  extern "C" int rfwp_emu_##op##_##suffix(void* const* p, const int* dims, int threads) { \
    return rfwp::cuda::op(make<rfwp::Args<S>>(p, dims), threads, nullptr);          \
  }
#define RFWP_EMU_BWD(op, Args, S, suffix)                                                \
  extern "C" int rfwp_emu_##op##_##suffix(void* const* p, const int* dims, void* work,  \
                                          int threads) {                                 \
    return rfwp::cuda::op(make<rfwp::Args<S>>(p, dims), static_cast<S*>(work), threads, nullptr); \
  }
#define RFWP_EMU_ALL(S, suffix)                                \
  RFWP_EMU_FWD(lt_forward, DeltaFwdArgs, S, suffix)            \
  RFWP_EMU_FWD(delta_forward, DeltaFwdArgs, S, suffix)         \
  RFWP_EMU_FWD(delta_rnn_forward, DeltaRnnFwdArgs, S, suffix)  \
  RFWP_EMU_FWD(rdn_forward, RdnFwdArgs, S, suffix)             \
  RFWP_EMU_BWD(lt_backward, DeltaBwdArgs, S, suffix)           \
  RFWP_EMU_BWD(delta_backward, DeltaBwdArgs, S, suffix)        \
  RFWP_EMU_BWD(delta_rnn_backward, DeltaRnnBwdArgs, S, suffix) \
  RFWP_EMU_BWD(rdn_backward, RdnBwdArgs, S, suffix)        \
  RFWP_EMU_FWD(mamba_forward, MambaFwdArgs, S, suffix)     \
  RFWP_EMU_BWD(mamba_backward, MambaBwdArgs, S, suffix)
RFWP_EMU_ALL(float, f32)
RFWP_EMU_ALL(double, f64)

// gated_delta / delta_product: the argument blocks end with nh (dims[6])
template <typename Args>
Args make_product(void* const* ptrs, const int* dims) {
  Args a = make<Args>(ptrs, dims);
  a.nh = dims[6];
  return a;
}
#define RFWP_EMU_PRODUCT_SRWM(S, suffix)                                                           \
  extern "C" int rfwp_emu_product_forward_##suffix(void* const* p, const int* dims, int threads) {  \
    return rfwp::cuda::product_forward(make_product<rfwp::ProductFwdArgs<S>>(p, dims), threads, nullptr); \
  }                                                                                                \
  extern "C" int rfwp_emu_product_backward_##suffix(void* const* p, const int* dims, void* work,   \
                                                    int threads) {                                 \
    return rfwp::cuda::product_backward(make_product<rfwp::ProductBwdArgs<S>>(p, dims),            \
                                        static_cast<S*>(work), threads, nullptr);                  \
  }                                                                                                \
  RFWP_EMU_FWD(srwm_forward, SrwmFwdArgs, S, suffix)                                               \
  RFWP_EMU_BWD(srwm_backward, SrwmBwdArgs, S, suffix)
RFWP_EMU_PRODUCT_SRWM(float, f32)
RFWP_EMU_PRODUCT_SRWM(double, f64)

// Number of pointer fields of an argument block, to check the caller's field lists.
extern "C" int rfwp_emu_num_pointers(const char* block) {
  const char* names[] = {"DeltaFwdArgs", "DeltaBwdArgs", "DeltaRnnFwdArgs", "DeltaRnnBwdArgs",
                         "RdnFwdArgs", "RdnBwdArgs", "ProductFwdArgs", "ProductBwdArgs",
                         "SrwmFwdArgs", "SrwmBwdArgs", "MambaFwdArgs", "MambaBwdArgs"};
  const std::size_t counts[] = {num_pointers<rfwp::DeltaFwdArgs<float>>(),
                                num_pointers<rfwp::DeltaBwdArgs<float>>(),
                                num_pointers<rfwp::DeltaRnnFwdArgs<float>>(),
                                num_pointers<rfwp::DeltaRnnBwdArgs<float>>(),
                                num_pointers<rfwp::RdnFwdArgs<float>>(),
                                num_pointers<rfwp::RdnBwdArgs<float>>(),
                                num_pointers<rfwp::ProductFwdArgs<float>>(),
                                num_pointers<rfwp::ProductBwdArgs<float>>(),
                                num_pointers<rfwp::SrwmFwdArgs<float>>(),
                                num_pointers<rfwp::SrwmBwdArgs<float>>(),
                                num_pointers<rfwp::MambaFwdArgs<float>>(),
                                num_pointers<rfwp::MambaBwdArgs<float>>()};
  for (int i = 0; i < 12; ++i)
    if (std::strcmp(block, names[i]) == 0) return static_cast<int>(counts[i]);
  return -1;
}

extern "C" std::size_t rfwp_emu_workspace_elems(const char* op, const int* dims) {
  const rfwp::Dims n = dims_of(dims);
  if (std::strcmp(op, "lt") == 0 || std::strcmp(op, "delta") == 0) return rfwp::cuda::lt_delta_workspace_elems(n);
  if (std::strcmp(op, "delta_rnn") == 0) return rfwp::cuda::delta_rnn_workspace_elems(n);
  if (std::strcmp(op, "rdn") == 0) return rfwp::cuda::rdn_workspace_elems(n);
  if (std::strcmp(op, "product") == 0) return rfwp::cuda::product_workspace_elems(n, dims[6]);
  if (std::strcmp(op, "srwm") == 0) return rfwp::cuda::srwm_workspace_elems(n);
  if (std::strcmp(op, "mamba") == 0) return rfwp::cuda::mamba_workspace_elems(n);
  return 0;
}

extern "C" int rfwp_emu_default_threads(int dk, int dv) { return rfwp::cuda::default_threads(dk, dv); }
extern "C" int rfwp_emu_launch_threads(int dk, int dv, int threads) {
  return rfwp::cuda::launch_threads(dk, dv, threads);
}
extern "C" int rfwp_emu_srwm_threads(int d, int threads) {
  return rfwp::cuda::srwm_threads(rfwp::Dims{1, 1, 1, d, d, 1}, threads);
}

// Dynamic shared memory the launcher of `op` requests on a device with `optin` bytes of
// opt-in shared memory per block (0: unlimited); -1 for an unknown op.
extern "C" long long rfwp_emu_smem_request(const char* op, int backward, const int* dims, int elem,
                                           long long optin) {
  const std::string name(op);
  if (name != "lt" && name != "delta" && name != "delta_rnn" && name != "rdn" &&
      name != "gated_delta" && name != "delta_product" && name != "srwm" && name != "mamba")
    return -1;
  return static_cast<long long>(rfwp::cuda::smem_request(op, dims_of(dims), static_cast<std::size_t>(elem),
                                                         backward != 0, static_cast<std::size_t>(optin)));
}

// The emulated device's opt-in shared memory per block as the launchers read it; set it
// (0: the true limit, 227 KiB) to steer their layout choice or to make the attribute call fail.
extern "C" long long rfwp_emu_device_smem_optin() { return static_cast<long long>(rfwp::cuda::device_smem_optin()); }
extern "C" void rfwp_emu_set_device_smem_optin(long long bytes) {
  cuda_emu::reported_smem_optin = bytes > 0 ? static_cast<std::size_t>(bytes) : cuda_emu::kMaxSharedBytesOptin;
}
// The order in which a block's threads run between barriers: 0 thread order, else a seeded shuffle per round
// (cuda_emulation.h, schedule_seed); ignored by ThreadSanitizer builds, whose threads are real.
extern "C" void rfwp_emu_set_schedule(unsigned seed) {
#ifndef RFWP_EMU_THREADS
  cuda_emu::schedule_seed = seed;
#else
  (void)seed;
#endif
}
// The calling thread's pending CUDA error (not cleared).
extern "C" int rfwp_emu_peek_last_error() { return static_cast<int>(cudaPeekAtLastError()); }

// Launches since the last clear: count, and (grid blocks, block threads, dynamic smem bytes)
// of launch i.
extern "C" int rfwp_emu_launch_count() { return static_cast<int>(cuda_emu::launch_log().size()); }
extern "C" int rfwp_emu_launch_record(int i, long long* out3) {
  const auto& log = cuda_emu::launch_log();
  if (i < 0 || static_cast<std::size_t>(i) >= log.size()) return -1;
  out3[0] = log[i].grid;
  out3[1] = log[i].block;
  out3[2] = static_cast<long long>(log[i].smem);
  return 0;
}
extern "C" void rfwp_emu_launch_clear() { cuda_emu::launch_log().clear(); }
