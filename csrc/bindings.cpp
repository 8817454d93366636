// Torch binding of the fused recurrences: shape/dtype checks, output allocation, and the call
// into the CPU implementation (cpu/) or, when built with RFWP_WITH_CUDA, the CUDA launchers
// (cuda/torch_cuda.cpp). Python wraps these in autograd Functions, one per op (rfwp_rl/ops/<op>/fused.py).
//
// Every function returns NEW tensors; inputs (including the initial states) are never written.
// `chunk` is the checkpoint interval of the backward pass; `threads` the CUDA block size
// (0: default; ignored on CPU).
//
// Inputs may be non-contiguous (a contiguous copy is taken) and float16/bfloat16: those are
// converted to float32 once here, the kernels compute in float32, and the outputs the caller
// sees (y, final states, gradients) are converted back; the tensors kept for the backward
// (checkpoints, saved activations) stay float32, and the backward accepts them with half
// inputs. T = 0 is allowed: empty outputs, final states equal to the initial ones, zero
// gradients of the initial outputs (and gradients of the initial states equal to those of
// the final states).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <string>
#include <vector>

#include "cpu/fastweight_cpu.h"
#include "cpu/lstm_impl.h"
#include "cpu/vec_math.h"
#include "fastweight_params.h"
#ifdef RFWP_WITH_CUDA
#include "cuda/torch_cuda.h"
#endif

namespace {

using at::Tensor;
using c10::optional;
using rfwp::Dims;

// ------------------------------------------------------------------------------ checks

void check_tensor(const Tensor& x, const char* name, const Tensor& like,
                  std::vector<int64_t> shape) {
  TORCH_CHECK(x.defined(), name, " is missing");
  TORCH_CHECK(x.scalar_type() == like.scalar_type(), name, " has dtype ", x.scalar_type(),
              ", expected ", like.scalar_type());
  TORCH_CHECK(x.device() == like.device(), name, " is on ", x.device(), ", expected ",
              like.device());
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");   // the entry points make it so
  TORCH_CHECK(x.sizes() == at::IntArrayRef(shape), name, " has shape ", x.sizes(), ", expected ",
              at::IntArrayRef(shape));
}

void check_optional(const optional<Tensor>& x, const char* name, const Tensor& like,
                    std::vector<int64_t> shape) {
  if (x.has_value() && x->defined()) check_tensor(*x, name, like, std::move(shape));
}

// chunk: checkpoint interval (>= 1); a forward also accepts 0 (no checkpoints, inference).
Dims make_dims(const Tensor& q, int64_t dv, int64_t chunk, bool forward = false) {
  TORCH_CHECK(q.dim() == 4, "expected [T, B, H, d] inputs, got shape ", q.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "fused kernels support float32 and float64, got ", q.scalar_type());
  // a backward of an empty sequence has no chunk to walk
  TORCH_CHECK(chunk >= ((forward || q.size(0) == 0) ? 0 : 1), "checkpoint interval must be >= ",
              (forward ? 0 : 1), ", got ", chunk);
  TORCH_CHECK(q.size(3) >= 1 && dv >= 1, "head sizes must be >= 1, got dk = ", q.size(3),
              ", dv = ", dv);
  TORCH_CHECK(q.size(0) <= INT32_MAX && q.size(1) * q.size(2) <= INT32_MAX &&
                  q.size(3) * dv <= INT32_MAX, "sizes beyond the kernels' 32-bit range: ", q.sizes());
  Dims n;
  n.T = static_cast<int>(q.size(0));
  n.B = static_cast<int>(q.size(1));
  n.H = static_cast<int>(q.size(2));
  n.dk = static_cast<int>(q.size(3));
  n.dv = static_cast<int>(dv);
  n.chunk = static_cast<int>(chunk);
  return n;
}

const uint8_t* reset_ptr(const optional<Tensor>& reset, const Dims& n, const Tensor& like) {
  if (!reset.has_value() || !reset->defined()) return nullptr;
  const Tensor& r = *reset;
  TORCH_CHECK(r.scalar_type() == at::kBool || r.scalar_type() == at::kByte,
              "reset must be bool or uint8, got ", r.scalar_type());
  TORCH_CHECK(r.device() == like.device(), "reset is on ", r.device(), ", expected ",
              like.device());
  TORCH_CHECK(r.is_contiguous() && r.sizes() == at::IntArrayRef({n.T, n.B}),
              "reset must be a contiguous [T, B] = [", n.T, ", ", n.B, "] tensor, got ",
              r.sizes());
  return reinterpret_cast<const uint8_t*>(r.data_ptr());
}

template <typename S>
const S* ptr(const Tensor& x) {
  return x.data_ptr<S>();
}
template <typename S>
const S* ptr_or_null(const optional<Tensor>& x) {
  return (x.has_value() && x->defined()) ? x->data_ptr<S>() : nullptr;
}
template <typename S>
S* out(Tensor& x) {
  return x.data_ptr<S>();
}

Tensor empty_like_shape(const Tensor& like, std::vector<int64_t> shape) {
  return at::empty(shape, like.options());
}

int64_t nck(const Dims& n) { return rfwp::num_chunks(n.T, n.chunk); }

#ifdef RFWP_WITH_CUDA
#define RFWP_RUN(op, args, like, threads)                \
  do {                                                   \
    if ((like).is_cuda()) {                              \
      rfwp::cuda_torch::op(args, like, threads);         \
    } else {                                             \
      rfwp::cpu::op(args);                               \
    }                                                    \
  } while (0)
#else
#define RFWP_RUN(op, args, like, threads)                                            \
  do {                                                                               \
    TORCH_CHECK(!(like).is_cuda(), "this build of the fused kernels has no CUDA"); \
    rfwp::cpu::op(args);                                                             \
  } while (0)
#endif

// ---------------------------------------------------------------------------- lt / delta

std::vector<Tensor> delta_forward_impl(bool is_delta, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const optional<Tensor>& beta,
                                       const Tensor& W0, const optional<Tensor>& reset,
                                       int64_t chunk, int64_t threads) {
  TORCH_CHECK(v.dim() == 4, "v must be [T, B, H, dv], got ", v.sizes());
  const Dims n = make_dims(q, v.size(3), chunk, true);
  check_tensor(q, "q", q, {n.T, n.B, n.H, n.dk});
  check_tensor(k, "k", q, {n.T, n.B, n.H, n.dk});
  check_tensor(v, "v", q, {n.T, n.B, n.H, n.dv});
  if (is_delta) {
    TORCH_CHECK(beta.has_value() && beta->defined(), "beta is missing");
    check_tensor(*beta, "beta", q, {n.T, n.B, n.H});
  }
  check_tensor(W0, "W0", q, {n.B, n.H, n.dv, n.dk});
  const uint8_t* rst = reset_ptr(reset, n, q);
  Tensor y = empty_like_shape(q, {n.T, n.B, n.H, n.dv});
  Tensor W = empty_like_shape(q, {n.B, n.H, n.dv, n.dk});
  // CUDA: the initial state and delta's (u, v - v̄) vectors (two-sweep backward, no checkpoints)
  Tensor ckpt = q.is_cuda() ? empty_like_shape(q, {rfwp::cuda_lt_delta_saved(n, is_delta)})
                            : empty_like_shape(q, {nck(n), n.B, n.H, n.dv, n.dk});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_forward", [&] {
    rfwp::DeltaFwdArgs<scalar_t> a{ptr<scalar_t>(q), ptr<scalar_t>(k), ptr<scalar_t>(v),
                                   is_delta ? ptr_or_null<scalar_t>(beta) : nullptr,
                                   ptr<scalar_t>(W0), rst, out<scalar_t>(y), out<scalar_t>(W),
                                   out<scalar_t>(ckpt), n};
    if (is_delta) RFWP_RUN(delta_forward, a, q, threads);
    else RFWP_RUN(lt_forward, a, q, threads);
  });
  return {y, W, ckpt};
}

std::vector<Tensor> delta_backward_impl(bool is_delta, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const optional<Tensor>& beta,
                                        const optional<Tensor>& reset, const Tensor& ckpt,
                                        const Tensor& gy, const optional<Tensor>& gW,
                                        int64_t chunk, int64_t threads) {
  TORCH_CHECK(v.dim() == 4, "v must be [T, B, H, dv], got ", v.sizes());
  const Dims n = make_dims(q, v.size(3), chunk);
  check_tensor(q, "q", q, {n.T, n.B, n.H, n.dk});
  check_tensor(k, "k", q, {n.T, n.B, n.H, n.dk});
  check_tensor(v, "v", q, {n.T, n.B, n.H, n.dv});
  if (is_delta) {
    TORCH_CHECK(beta.has_value() && beta->defined(), "beta is missing");
    check_tensor(*beta, "beta", q, {n.T, n.B, n.H});
  }
  if (q.is_cuda()) {
    Dims kept = n;
    kept.chunk = 1;   // what a forward with gradients kept
    check_tensor(ckpt, "ckpt", q, {rfwp::cuda_lt_delta_saved(kept, is_delta)});
  } else {
    check_tensor(ckpt, "ckpt", q, {nck(n), n.B, n.H, n.dv, n.dk});
  }
  check_tensor(gy, "grad y", q, {n.T, n.B, n.H, n.dv});
  check_optional(gW, "grad W", q, {n.B, n.H, n.dv, n.dk});
  const uint8_t* rst = reset_ptr(reset, n, q);
  Tensor gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  Tensor gbeta = is_delta ? at::empty_like(*beta) : at::empty({0}, q.options());
  Tensor gW0 = empty_like_shape(q, {n.B, n.H, n.dv, n.dk});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_backward", [&] {
    rfwp::DeltaBwdArgs<scalar_t> a{ptr<scalar_t>(q), ptr<scalar_t>(k), ptr<scalar_t>(v),
                                   is_delta ? ptr_or_null<scalar_t>(beta) : nullptr, rst,
                                   ptr<scalar_t>(ckpt), ptr<scalar_t>(gy),
                                   ptr_or_null<scalar_t>(gW), out<scalar_t>(gq),
                                   out<scalar_t>(gk), out<scalar_t>(gv),
                                   is_delta ? out<scalar_t>(gbeta) : nullptr,
                                   out<scalar_t>(gW0), n};
    if (is_delta) RFWP_RUN(delta_backward, a, q, threads);
    else RFWP_RUN(lt_backward, a, q, threads);
  });
  if (is_delta) return {gq, gk, gv, gbeta, gW0};
  return {gq, gk, gv, gW0};
}

std::vector<Tensor> lt_forward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& W0, const optional<Tensor>& reset, int64_t chunk,
                               int64_t threads) {
  return delta_forward_impl(false, q, k, v, c10::nullopt, W0, reset, chunk, threads);
}
std::vector<Tensor> delta_forward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& beta, const Tensor& W0,
                                  const optional<Tensor>& reset, int64_t chunk, int64_t threads) {
  return delta_forward_impl(true, q, k, v, beta, W0, reset, chunk, threads);
}
std::vector<Tensor> lt_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                const optional<Tensor>& reset, const Tensor& ckpt,
                                const Tensor& gy, const optional<Tensor>& gW, int64_t chunk,
                                int64_t threads) {
  return delta_backward_impl(false, q, k, v, c10::nullopt, reset, ckpt, gy, gW, chunk, threads);
}
std::vector<Tensor> delta_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& beta, const optional<Tensor>& reset,
                                   const Tensor& ckpt, const Tensor& gy,
                                   const optional<Tensor>& gW, int64_t chunk, int64_t threads) {
  return delta_backward_impl(true, q, k, v, beta, reset, ckpt, gy, gW, chunk, threads);
}

// ------------------------------------------------------------------------------- delta_rnn

void check_delta_rnn_inputs(const Dims& n, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& beta, const Tensor& kr, const Tensor& vr,
                            const Tensor& beta_r) {
  check_tensor(q, "q", q, {n.T, n.B, n.H, n.dk});
  check_tensor(k, "k", q, {n.T, n.B, n.H, n.dk});
  check_tensor(v, "v", q, {n.T, n.B, n.H, n.dv});
  check_tensor(beta, "beta", q, {n.T, n.B, n.H});
  check_tensor(kr, "kr", q, {n.T, n.B, n.H, n.dv});
  check_tensor(vr, "vr", q, {n.T, n.B, n.H, n.dv});
  check_tensor(beta_r, "beta_r", q, {n.T, n.B, n.H});
}

std::vector<Tensor> delta_rnn_forward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& beta, const Tensor& kr, const Tensor& vr,
                                      const Tensor& beta_r, const Tensor& W0, const Tensor& R0,
                                      const Tensor& y0, const optional<Tensor>& reset,
                                      int64_t chunk, int64_t threads) {
  TORCH_CHECK(v.dim() == 4, "v must be [T, B, H, d], got ", v.sizes());
  const Dims n = make_dims(q, v.size(3), chunk, true);
  check_delta_rnn_inputs(n, q, k, v, beta, kr, vr, beta_r);
  check_tensor(W0, "W0", q, {n.B, n.H, n.dv, n.dk});
  check_tensor(R0, "R0", q, {n.B, n.H, n.dv, n.dv});
  check_tensor(y0, "y0", q, {n.B, n.H, n.dv});
  const uint8_t* rst = reset_ptr(reset, n, q);
  Tensor y = empty_like_shape(q, {n.T, n.B, n.H, n.dv});
  Tensor W = at::empty_like(W0), R = at::empty_like(R0);
  Tensor ckW = empty_like_shape(q, {nck(n), n.B, n.H, n.dv, n.dk});
  Tensor ckR = empty_like_shape(q, {nck(n), n.B, n.H, n.dv, n.dv});
  Tensor sq = empty_like_shape(q, {n.T, n.B, n.H, n.dv});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_rnn_forward", [&] {
    using S = scalar_t;
    rfwp::DeltaRnnFwdArgs<S> a{ptr<S>(q), ptr<S>(k), ptr<S>(v), ptr<S>(beta), ptr<S>(kr),
                               ptr<S>(vr), ptr<S>(beta_r), ptr<S>(W0), ptr<S>(R0), ptr<S>(y0),
                               rst, out<S>(y), out<S>(W), out<S>(R), out<S>(ckW), out<S>(ckR),
                               out<S>(sq), n};
    RFWP_RUN(delta_rnn_forward, a, q, threads);
  });
  return {y, W, R, ckW, ckR, sq};
}

std::vector<Tensor> delta_rnn_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& beta, const Tensor& kr, const Tensor& vr,
                                       const Tensor& beta_r, const Tensor& sq,
                                       const optional<Tensor>& reset, const Tensor& ckW,
                                       const Tensor& ckR, const Tensor& gy,
                                       const optional<Tensor>& gW, const optional<Tensor>& gR,
                                       int64_t chunk, int64_t threads) {
  TORCH_CHECK(v.dim() == 4, "v must be [T, B, H, d], got ", v.sizes());
  const Dims n = make_dims(q, v.size(3), chunk);
  check_delta_rnn_inputs(n, q, k, v, beta, kr, vr, beta_r);
  check_tensor(sq, "s", q, {n.T, n.B, n.H, n.dv});
  check_tensor(ckW, "ckptW", q, {nck(n), n.B, n.H, n.dv, n.dk});
  check_tensor(ckR, "ckptR", q, {nck(n), n.B, n.H, n.dv, n.dv});
  check_tensor(gy, "grad y", q, {n.T, n.B, n.H, n.dv});
  check_optional(gW, "grad W", q, {n.B, n.H, n.dv, n.dk});
  check_optional(gR, "grad R", q, {n.B, n.H, n.dv, n.dv});
  const uint8_t* rst = reset_ptr(reset, n, q);
  Tensor gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  Tensor gbeta = at::empty_like(beta), gkr = at::empty_like(kr), gvr = at::empty_like(vr);
  Tensor gbeta_r = at::empty_like(beta_r);
  Tensor gW0 = empty_like_shape(q, {n.B, n.H, n.dv, n.dk});
  Tensor gR0 = empty_like_shape(q, {n.B, n.H, n.dv, n.dv});
  Tensor gy0 = empty_like_shape(q, {n.B, n.H, n.dv});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_rnn_backward", [&] {
    using S = scalar_t;
    rfwp::DeltaRnnBwdArgs<S> a{ptr<S>(q), ptr<S>(k), ptr<S>(v), ptr<S>(beta), ptr<S>(kr),
                               ptr<S>(vr), ptr<S>(beta_r), ptr<S>(sq), rst,
                               ptr<S>(ckW), ptr<S>(ckR), ptr<S>(gy), ptr_or_null<S>(gW),
                               ptr_or_null<S>(gR), out<S>(gq), out<S>(gk), out<S>(gv),
                               out<S>(gbeta), out<S>(gkr), out<S>(gvr), out<S>(gbeta_r),
                               out<S>(gW0), out<S>(gR0), out<S>(gy0), n};
    RFWP_RUN(delta_rnn_backward, a, q, threads);
  });
  return {gq, gk, gv, gbeta, gkr, gvr, gbeta_r, gW0, gR0, gy0};
}

// ------------------------------------------------------------------------------------- rdn

std::vector<Tensor> rdn_forward_impl(const Tensor& xq, const Tensor& xk, const Tensor& xv,
                                const Tensor& xb, const Tensor& Rq, const Tensor& Rk,
                                const Tensor& Rv, const Tensor& rb, const Tensor& W0,
                                const Tensor& y0, const optional<Tensor>& reset, int64_t chunk,
                                int64_t threads) {
  const Dims n = make_dims(xq, xq.size(3), chunk, true);
  const int64_t d = n.dk;
  check_tensor(xq, "xq", xq, {n.T, n.B, n.H, d});
  check_tensor(xk, "xk", xq, {n.T, n.B, n.H, d});
  check_tensor(xv, "xv", xq, {n.T, n.B, n.H, d});
  check_tensor(xb, "xb", xq, {n.T, n.B, n.H});
  check_tensor(Rq, "Rq", xq, {n.H, d, d});
  check_tensor(Rk, "Rk", xq, {n.H, d, d});
  check_tensor(Rv, "Rv", xq, {n.H, d, d});
  check_tensor(rb, "rb", xq, {n.H, d});
  check_tensor(W0, "W0", xq, {n.B, n.H, d, d});
  check_tensor(y0, "y0", xq, {n.B, n.H, d});
  const uint8_t* rst = reset_ptr(reset, n, xq);
  Tensor y = at::empty_like(xq), W = at::empty_like(W0);
  Tensor ckpt = empty_like_shape(xq, {nck(n), n.B, n.H, d, d});
  Tensor q = at::empty_like(xq), k = at::empty_like(xq), v = at::empty_like(xq);
  Tensor beta = at::empty_like(xb), h = at::empty_like(xq);
  AT_DISPATCH_FLOATING_TYPES(xq.scalar_type(), "rdn_forward", [&] {
    using S = scalar_t;
    rfwp::RdnFwdArgs<S> a{ptr<S>(xq), ptr<S>(xk), ptr<S>(xv), ptr<S>(xb), ptr<S>(Rq),
                          ptr<S>(Rk), ptr<S>(Rv), ptr<S>(rb), ptr<S>(W0), ptr<S>(y0), rst,
                          out<S>(y), out<S>(W), out<S>(ckpt), out<S>(q), out<S>(k), out<S>(v),
                          out<S>(beta), out<S>(h), n};
    RFWP_RUN(rdn_forward, a, xq, threads);
  });
  return {y, W, ckpt, q, k, v, beta, h};
}

std::vector<Tensor> rdn_backward_impl(const Tensor& Rq, const Tensor& Rk, const Tensor& Rv,
                                 const Tensor& rb, const Tensor& h, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& beta, const optional<Tensor>& reset,
                                 const Tensor& ckpt, const Tensor& gy,
                                 const optional<Tensor>& gW, int64_t chunk, int64_t threads) {
  const Dims n = make_dims(q, q.size(3), chunk);
  const int64_t d = n.dk;
  check_tensor(Rq, "Rq", q, {n.H, d, d});
  check_tensor(Rk, "Rk", q, {n.H, d, d});
  check_tensor(Rv, "Rv", q, {n.H, d, d});
  check_tensor(rb, "rb", q, {n.H, d});
  check_tensor(h, "h", q, {n.T, n.B, n.H, d});
  check_tensor(q, "q", q, {n.T, n.B, n.H, d});
  check_tensor(k, "k", q, {n.T, n.B, n.H, d});
  check_tensor(v, "v", q, {n.T, n.B, n.H, d});
  check_tensor(beta, "beta", q, {n.T, n.B, n.H});
  check_tensor(ckpt, "ckpt", q, {nck(n), n.B, n.H, d, d});
  check_tensor(gy, "grad y", q, {n.T, n.B, n.H, d});
  check_optional(gW, "grad W", q, {n.B, n.H, d, d});
  const uint8_t* rst = reset_ptr(reset, n, q);
  Tensor gxq = at::empty_like(q), gxk = at::empty_like(q), gxv = at::empty_like(q);
  Tensor gxb = at::empty_like(beta);
  // per-(b, h) partial slow-weight gradients: CPU only (the CUDA backward sums over (t, b)
  // with a separate kernel)
  const bool cpu = !q.is_cuda();
  Tensor part = empty_like_shape(q, {cpu ? 3 : 0, n.B, n.H, d, d});
  Tensor part_b = empty_like_shape(q, {cpu ? n.B : 0, n.H, d});
  Tensor gRq = at::empty_like(Rq), gRk = at::empty_like(Rk), gRv = at::empty_like(Rv);
  Tensor grb = at::empty_like(rb);
  Tensor gW0 = empty_like_shape(q, {n.B, n.H, d, d}), gy0 = empty_like_shape(q, {n.B, n.H, d});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rdn_backward", [&] {
    using S = scalar_t;
    S* p = cpu ? out<S>(part) : nullptr;
    const std::size_t pm = cpu ? static_cast<std::size_t>(n.B) * n.H * d * d : 0;
    rfwp::RdnBwdArgs<S> a{ptr<S>(Rq), ptr<S>(Rk), ptr<S>(Rv), ptr<S>(rb), ptr<S>(h),
                          ptr<S>(q), ptr<S>(k), ptr<S>(v), ptr<S>(beta), rst,
                          ptr<S>(ckpt), ptr<S>(gy), ptr_or_null<S>(gW), out<S>(gxq),
                          out<S>(gxk), out<S>(gxv), out<S>(gxb), p, cpu ? p + pm : nullptr,
                          cpu ? p + 2 * pm : nullptr, cpu ? out<S>(part_b) : nullptr, out<S>(gRq), out<S>(gRk), out<S>(gRv), out<S>(grb),
                          out<S>(gW0), out<S>(gy0), n};
    RFWP_RUN(rdn_backward, a, q, threads);
  });
  return {gxq, gxk, gxv, gxb, gRq, gRk, gRv, grb, gW0, gy0};
}


// ------------------------------------------------------------- gated_delta / delta_product

// One kernel serves both: gated_delta is nh = 1 with a decay alpha (its k, v, beta have no nh
// dimension, the same memory as nh = 1), delta_product has no decay and nh = k.size(3).
struct ProductShapes {
  Dims n;
  int nh;
};

ProductShapes check_product_inputs(bool gated, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const optional<Tensor>& alpha, const Tensor& beta,
                                   int64_t chunk, bool forward) {
  const int64_t vdim = gated ? 4 : 5;
  TORCH_CHECK(k.dim() == vdim && v.dim() == vdim, gated ? "k and v must be [T, B, H, d]"
              : "k and v must be [T, B, H, n_h, d]", ", got ", k.sizes(), " and ", v.sizes());
  const Dims n = make_dims(q, v.size(vdim - 1), chunk, forward);
  const int64_t nh = gated ? 1 : k.size(3);
  TORCH_CHECK(nh >= 1, "n_h must be >= 1, got ", nh);
  check_tensor(q, "q", q, {n.T, n.B, n.H, n.dk});
  if (gated) {
    check_tensor(k, "k", q, {n.T, n.B, n.H, n.dk});
    check_tensor(v, "v", q, {n.T, n.B, n.H, n.dv});
    TORCH_CHECK(alpha.has_value() && alpha->defined(), "alpha is missing");
    check_tensor(*alpha, "alpha", q, {n.T, n.B, n.H});
    check_tensor(beta, "beta", q, {n.T, n.B, n.H});
  } else {
    check_tensor(k, "k", q, {n.T, n.B, n.H, nh, n.dk});
    check_tensor(v, "v", q, {n.T, n.B, n.H, nh, n.dv});
    check_tensor(beta, "beta", q, {n.T, n.B, n.H, nh});
  }
  return {n, static_cast<int>(nh)};
}

std::vector<Tensor> product_forward_impl(bool gated, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const optional<Tensor>& alpha,
                                         const Tensor& beta, const Tensor& W0,
                                         const optional<Tensor>& reset, int64_t chunk,
                                         int64_t threads) {
  const ProductShapes sh = check_product_inputs(gated, q, k, v, alpha, beta, chunk, true);
  const Dims n = sh.n;
  const int nh = sh.nh;
  check_tensor(W0, "W0", q, {n.B, n.H, n.dv, n.dk});
  const uint8_t* rst = reset_ptr(reset, n, q);
  Tensor y = empty_like_shape(q, {n.T, n.B, n.H, n.dv});
  Tensor W = empty_like_shape(q, {n.B, n.H, n.dv, n.dk});
  Tensor ckpt = empty_like_shape(q, {nck(n), n.B, n.H, n.dv, n.dk});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "product_forward", [&] {
    using S = scalar_t;
    rfwp::ProductFwdArgs<S> a{ptr<S>(q), ptr<S>(k), ptr<S>(v), ptr_or_null<S>(alpha), ptr<S>(beta),
                              ptr<S>(W0), rst, out<S>(y), out<S>(W), out<S>(ckpt), n, nh};
    RFWP_RUN(product_forward, a, q, threads);
  });
  return {y, W, ckpt};
}

std::vector<Tensor> product_backward_impl(bool gated, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const optional<Tensor>& alpha,
                                          const Tensor& beta, const optional<Tensor>& reset,
                                          const Tensor& ckpt, const Tensor& gy,
                                          const optional<Tensor>& gW, int64_t chunk,
                                          int64_t threads) {
  const ProductShapes sh = check_product_inputs(gated, q, k, v, alpha, beta, chunk, false);
  const Dims n = sh.n;
  const int nh = sh.nh;
  check_tensor(ckpt, "ckpt", q, {nck(n), n.B, n.H, n.dv, n.dk});
  check_tensor(gy, "grad y", q, {n.T, n.B, n.H, n.dv});
  check_optional(gW, "grad W", q, {n.B, n.H, n.dv, n.dk});
  const uint8_t* rst = reset_ptr(reset, n, q);
  Tensor gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  Tensor galpha = gated ? at::empty_like(*alpha) : at::empty({0}, q.options());
  Tensor gbeta = at::empty_like(beta);
  Tensor gW0 = empty_like_shape(q, {n.B, n.H, n.dv, n.dk});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "product_backward", [&] {
    using S = scalar_t;
    rfwp::ProductBwdArgs<S> a{ptr<S>(q), ptr<S>(k), ptr<S>(v), ptr_or_null<S>(alpha), ptr<S>(beta),
                              rst, ptr<S>(ckpt), ptr<S>(gy), ptr_or_null<S>(gW), out<S>(gq),
                              out<S>(gk), out<S>(gv), gated ? out<S>(galpha) : nullptr,
                              out<S>(gbeta), out<S>(gW0), n, nh};
    RFWP_RUN(product_backward, a, q, threads);
  });
  if (gated) return {gq, gk, gv, galpha, gbeta, gW0};
  return {gq, gk, gv, gbeta, gW0};
}

// ------------------------------------------------------------------------------------ srwm

Dims check_srwm_inputs(const Tensor& x, const Tensor& Winit, int64_t chunk, bool forward) {
  const Dims n = make_dims(x, x.size(3), chunk, forward);
  check_tensor(x, "x", x, {n.T, n.B, n.H, n.dk});
  check_tensor(Winit, "W_init", x, {n.H, 3LL * n.dv + 4, n.dk});
  return n;
}

std::vector<Tensor> srwm_forward_impl(const Tensor& x, const Tensor& Winit, const Tensor& dW0,
                                      const optional<Tensor>& reset, int64_t chunk,
                                      int64_t threads) {
  const Dims n = check_srwm_inputs(x, Winit, chunk, true);
  const int64_t R = 3LL * n.dv + 4;
  check_tensor(dW0, "dW0", x, {n.B, n.H, R, n.dk});
  const uint8_t* rst = reset_ptr(reset, n, x);
  Tensor y = empty_like_shape(x, {n.T, n.B, n.H, n.dv});
  Tensor dW = empty_like_shape(x, {n.B, n.H, R, n.dk});
  Tensor ckpt = empty_like_shape(x, {nck(n), n.B, n.H, R, n.dk});
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "srwm_forward", [&] {
    using S = scalar_t;
    rfwp::SrwmFwdArgs<S> a{ptr<S>(x), ptr<S>(Winit), ptr<S>(dW0), rst, out<S>(y), out<S>(dW),
                           out<S>(ckpt), n};
    RFWP_RUN(srwm_forward, a, x, threads);
  });
  return {y, dW, ckpt};
}

std::vector<Tensor> srwm_backward_impl(const Tensor& x, const Tensor& Winit,
                                       const optional<Tensor>& reset, const Tensor& ckpt,
                                       const Tensor& gy, const optional<Tensor>& gdW,
                                       int64_t chunk, int64_t threads) {
  const Dims n = check_srwm_inputs(x, Winit, chunk, false);
  const int64_t R = 3LL * n.dv + 4;
  check_tensor(ckpt, "ckpt", x, {nck(n), n.B, n.H, R, n.dk});
  check_tensor(gy, "grad y", x, {n.T, n.B, n.H, n.dv});
  check_optional(gdW, "grad dW", x, {n.B, n.H, R, n.dk});
  const uint8_t* rst = reset_ptr(reset, n, x);
  Tensor gx = at::empty_like(x), gWinit = at::empty_like(Winit);
  Tensor part = empty_like_shape(x, {n.B, n.H, R, n.dk});   // per-(b, h) gradients of W_init
  Tensor gdW0 = empty_like_shape(x, {n.B, n.H, R, n.dk});
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "srwm_backward", [&] {
    using S = scalar_t;
    rfwp::SrwmBwdArgs<S> a{ptr<S>(x), ptr<S>(Winit), rst, ptr<S>(ckpt), ptr<S>(gy),
                           ptr_or_null<S>(gdW), out<S>(gx), out<S>(part), out<S>(gWinit),
                           out<S>(gdW0), n};
    RFWP_RUN(srwm_backward, a, x, threads);
  });
  return {gx, gWinit, gdW0};
}

// ------------------------------------------------------------------------------------- fwm

// The CPU kernel only (cpu/fwm_impl.h); the op's `supported` sends CUDA inputs to the reference.
struct FwmShapes {
  Dims n;     // dk == dv == m
  int nr, fold;
};

// m and N_r from w [.., 3m + 1] and r [.., (1 + N_r) m].
std::pair<int64_t, int64_t> fwm_sizes(const Tensor& w, const Tensor& r) {
  TORCH_CHECK(w.dim() >= 1 && r.dim() == w.dim(), "w and r must have the same number of dimensions, got ",
              w.sizes(), " and ", r.sizes());
  const int64_t m = (w.size(-1) - 1) / 3;
  TORCH_CHECK(m >= 1 && w.size(-1) == 3 * m + 1, "w must be [..., 3m + 1], got ", w.sizes());
  TORCH_CHECK(r.size(-1) % m == 0 && r.size(-1) / m >= 2, "r must be [..., (1 + N_r) m] with m = ",
              m, " and N_r >= 1, got ", r.sizes());
  return {m, r.size(-1) / m - 1};
}

FwmShapes check_fwm_inputs(const Tensor& w, const Tensor& r, int64_t chunk, bool forward) {
  TORCH_CHECK(!w.is_cuda(), "fwm has no CUDA kernel (the op runs CUDA inputs on the reference)");
  TORCH_CHECK(w.dim() == 4, "w must be [T, B, H, 3m + 1], got ", w.sizes());
  const auto [m, nr] = fwm_sizes(w, r);
  Dims n = make_dims(w, m, chunk, forward);
  n.dk = static_cast<int>(m);
  check_tensor(w, "w", w, {n.T, n.B, n.H, 3 * m + 1});
  check_tensor(r, "r", w, {n.T, n.B, n.H, (1 + nr) * m});
  // chunk: the longest tail kept low-rank (0, inference: the kernel's own limit)
  const int cap = rfwp::fwm_tail_capacity(n.dk);
  const int fold = chunk > 0 ? static_cast<int>(std::min<int64_t>(chunk, cap)) : cap;
  return {n, static_cast<int>(nr), fold};
}

std::vector<int64_t> fwm_cube(const Dims& n) { return {n.B, n.H, n.dk, n.dk, n.dk}; }

// The kernel's groups of tasks: W (the vector lanes of the dtype) and G = ceil(B H / W).
std::pair<int64_t, int64_t> fwm_groups(at::ScalarType dtype, int64_t BH) {
  const int64_t W = dtype == at::kDouble ? rfwp::cpu::fwm_lanes<double>() : rfwp::cpu::fwm_lanes<float>();
  return {W, (BH + W - 1) / W};
}

std::vector<Tensor> fwm_forward_impl(const Tensor& w, const Tensor& r, const Tensor& F0,
                                     const optional<Tensor>& reset, int64_t chunk) {
  const FwmShapes sh = check_fwm_inputs(w, r, chunk, true);
  const Dims n = sh.n;
  check_tensor(F0, "F0", w, fwm_cube(n));
  const uint8_t* rst = reset_ptr(reset, n, w);
  const bool keep = chunk > 0;
  const auto [W, G] = fwm_groups(w.scalar_type(), static_cast<int64_t>(n.B) * n.H);
  const int64_t cube = static_cast<int64_t>(n.dk) * n.dk * n.dk;
  Tensor y = empty_like_shape(w, {n.T, n.B, n.H, n.dk});
  Tensor F = empty_like_shape(w, fwm_cube(n));
  Tensor saved = empty_like_shape(w, {keep ? G : 0, n.T, rfwp::fwm_saved_size(n.dk, sh.nr), W});
  const int64_t folds = keep ? rfwp::fwm_max_folds(n.T, sh.fold) : 0;
  Tensor bases = empty_like_shape(w, {G, folds, cube, W});
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "fwm_forward", [&] {
    using S = scalar_t;
    rfwp::FwmFwdArgs<S> a{ptr<S>(w), ptr<S>(r), ptr<S>(F0), rst, out<S>(y), out<S>(F),
                          keep ? out<S>(saved) : nullptr, keep ? out<S>(bases) : nullptr, n, sh.nr,
                          sh.fold};
    rfwp::cpu::fwm_forward(a);
  });
  return {y, F, saved, bases};
}

std::vector<Tensor> fwm_backward_impl(const Tensor& w, const Tensor& r, const Tensor& F0,
                                      const optional<Tensor>& reset, const Tensor& saved,
                                      const Tensor& bases, const Tensor& gy,
                                      const optional<Tensor>& gF, bool need_gF0, int64_t chunk) {
  const FwmShapes sh = check_fwm_inputs(w, r, chunk, false);
  const Dims n = sh.n;
  // an empty F0: the zero tensor (a replay of the stepper from zero), no gradient of it
  const bool F0_zero = F0.numel() == 0;
  TORCH_CHECK(!(F0_zero && need_gF0), "the gradient of an empty (zero) F0 cannot be asked for");
  if (!F0_zero) check_tensor(F0, "F0", w, fwm_cube(n));
  const auto [W, G] = fwm_groups(w.scalar_type(), static_cast<int64_t>(n.B) * n.H);
  const int64_t cube = static_cast<int64_t>(n.dk) * n.dk * n.dk;
  check_tensor(saved, "saved", w, {G, n.T, rfwp::fwm_saved_size(n.dk, sh.nr), W});
  check_tensor(bases, "bases", w, {G, rfwp::fwm_max_folds(n.T, sh.fold), cube, W});
  check_tensor(gy, "grad y", w, {n.T, n.B, n.H, n.dk});
  check_optional(gF, "grad F", w, fwm_cube(n));
  const uint8_t* rst = reset_ptr(reset, n, w);
  Tensor gw = at::empty_like(w), gr = at::empty_like(r);
  Tensor gF0 = need_gF0 ? at::empty_like(F0) : at::empty({0}, w.options());
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "fwm_backward", [&] {
    using S = scalar_t;
    rfwp::FwmBwdArgs<S> a{ptr<S>(w), ptr<S>(r), F0_zero ? nullptr : ptr<S>(F0), rst, ptr<S>(saved), ptr<S>(bases),
                          ptr<S>(gy), ptr_or_null<S>(gF), out<S>(gw), out<S>(gr),
                          need_gF0 ? out<S>(gF0) : nullptr, n, sh.nr, sh.fold};
    rfwp::cpu::fwm_backward(a);
  });
  return {gw, gr, gF0};
}

// The incremental stepper (cpu/fwm_impl.h; FwmStepArgs): its state is {k1, k2, z, q, scal, meta,
// base} in the kernel's groups of W tasks.
struct FwmStepShape {
  int64_t B, H, m, W, G, cap;
};

FwmStepShape fwm_step_shape(const std::vector<Tensor>& state, int64_t B, int64_t H) {
  TORCH_CHECK(state.size() == 7, "the stepper state has 7 tensors (fwm_step_state), got ", state.size());
  const Tensor& z = state[2];
  TORCH_CHECK(z.dim() == 4, "the stepper state is not one of fwm_step_state");
  const auto [W, G] = fwm_groups(z.scalar_type(), B * H);
  const int64_t cap = z.size(1), m = z.size(2);
  const int64_t cube = m * m * m;
  check_tensor(state[0], "k1", z, {G, cap, m, W});
  check_tensor(state[1], "k2", z, {G, cap, m, W});
  check_tensor(z, "z", z, {G, cap, m, W});
  check_tensor(state[3], "q", z, {G, cap, W});
  check_tensor(state[4], "scal", z, {G, 2, W});
  TORCH_CHECK(state[5].scalar_type() == at::kInt && state[5].is_contiguous() &&
              state[5].sizes() == at::IntArrayRef({G, 2}), "meta must be int32 [G, 2]");
  check_tensor(state[6], "base", z, {G, cube, W});
  return {B, H, m, W, G, cap};
}

template <typename S>
rfwp::FwmStepArgs<S> fwm_step_args(std::vector<Tensor>& state, const FwmStepShape& sh) {
  Dims n{1, static_cast<int>(sh.B), static_cast<int>(sh.H), static_cast<int>(sh.m),
         static_cast<int>(sh.m), 0};
  return rfwp::FwmStepArgs<S>{nullptr, nullptr, nullptr, out<S>(state[0]), out<S>(state[1]),
                              out<S>(state[2]), out<S>(state[3]), out<S>(state[4]), out<S>(state[6]),
                              state[5].data_ptr<int32_t>(), nullptr, nullptr, n, 0, static_cast<int>(sh.cap),
                              rfwp::fwm_tail_capacity(static_cast<int>(sh.m))};
}

// The stepper's state for B x H memories of size m in the dtype and device of `like`, from
// F0 [B, H, m, m, m] (None: zero), with room for `capacity` tail terms (at most the fold length).
std::vector<Tensor> fwm_step_state(int64_t B, int64_t H, int64_t m, const Tensor& like,
                                   const optional<Tensor>& F0, int64_t capacity) {
  TORCH_CHECK(!like.is_cuda(), "fwm has no CUDA kernel");
  TORCH_CHECK(like.scalar_type() == at::kFloat || like.scalar_type() == at::kDouble,
              "fused kernels support float32 and float64, got ", like.scalar_type());
  TORCH_CHECK(B >= 1 && H >= 1 && m >= 1 && capacity >= 1, "sizes must be >= 1, got B = ", B,
              ", H = ", H, ", m = ", m, ", capacity = ", capacity);
  const auto opt = like.options();
  const auto [W, G] = fwm_groups(like.scalar_type(), B * H);
  const int64_t cap = std::min<int64_t>(capacity, rfwp::fwm_tail_capacity(static_cast<int>(m)));
  std::vector<Tensor> state = {at::empty({G, cap, m, W}, opt), at::empty({G, cap, m, W}, opt),
                               at::empty({G, cap, m, W}, opt), at::empty({G, cap, W}, opt),
                               at::empty({G, 2, W}, opt), at::empty({G, 2}, opt.dtype(at::kInt)),
                               at::empty({G, m * m * m, W}, opt)};
  Tensor F0c;
  if (F0.has_value() && F0->defined()) {
    check_tensor(F0->contiguous(), "F0", like, {B, H, m, m, m});
    F0c = F0->contiguous();
  }
  const FwmStepShape sh = fwm_step_shape(state, B, H);
  AT_DISPATCH_FLOATING_TYPES(like.scalar_type(), "fwm_step_state", [&] {
    rfwp::cpu::fwm_step_init(fwm_step_args<scalar_t>(state, sh), F0c.defined() ? ptr<scalar_t>(F0c) : nullptr);
  });
  return state;
}

// The stepper state with room for `capacity` tail terms (at most the fold length), its terms
// copied; the same state when it has that room already.
std::vector<Tensor> fwm_step_grow(std::vector<Tensor> state, int64_t capacity) {
  TORCH_CHECK(state.size() == 7, "the stepper state has 7 tensors (fwm_step_state), got ", state.size());
  const int64_t m = state[2].size(2), old = state[2].size(1);
  const int64_t cap = std::min<int64_t>(capacity, rfwp::fwm_tail_capacity(static_cast<int>(m)));
  if (cap <= old) return state;
  for (int i = 0; i < 4; ++i) {
    std::vector<int64_t> shape(state[i].sizes().begin(), state[i].sizes().end());
    shape[1] = cap;
    Tensor y = at::empty(shape, state[i].options());
    y.narrow(1, 0, old).copy_(state[i]);
    state[i] = y;
  }
  return state;
}

// One step (w [B, H, 3m + 1], r [B, H, (1 + N_r) m], reset [B] or None) of the stepper whose
// state (fwm_step_state) it updates in place; returns {y [B, H, m], saved}: with `record`, what
// fwm_forward keeps of this step for fwm_backward ([G, A, W]; the steps stacked on dim 1 are
// fwm_forward's `saved` as long as no tail was folded), else an empty tensor.
std::vector<Tensor> fwm_step(const Tensor& w, const Tensor& r, const optional<Tensor>& reset,
                             std::vector<Tensor> state, bool record) {
  TORCH_CHECK(!w.is_cuda(), "fwm has no CUDA kernel");
  TORCH_CHECK(w.dim() == 3, "w must be [B, H, 3m + 1], got ", w.sizes());
  const auto [m, nr] = fwm_sizes(w, r);
  const int64_t B = w.size(0), H = w.size(1);
  TORCH_CHECK(w.scalar_type() == state[2].scalar_type(), "w has dtype ", w.scalar_type(),
              ", the stepper state ", state[2].scalar_type());
  const FwmStepShape sh = fwm_step_shape(state, B, H);
  TORCH_CHECK(sh.m == m, "the stepper state has memory size ", sh.m, ", w has m = ", m);
  check_tensor(w, "w", w, {B, H, 3 * m + 1});
  check_tensor(r, "r", w, {B, H, (1 + nr) * m});
  {   // every tail has room for this step's term, or is folded first (fwm_step_grow)
    const int32_t* meta = state[5].data_ptr<int32_t>();
    const int fold = rfwp::fwm_tail_capacity(static_cast<int>(m));
    for (int64_t g = 0; g < sh.G; ++g)
      TORCH_CHECK(meta[2 * g] < sh.cap || meta[2 * g] == fold, "the stepper state is full (",
                  sh.cap, " terms): grow it with fwm_step_grow");
  }
  const uint8_t* rst = nullptr;
  if (reset.has_value() && reset->defined()) {
    TORCH_CHECK(reset->scalar_type() == at::kBool && reset->is_contiguous() &&
                reset->sizes() == at::IntArrayRef({B}), "reset must be a contiguous bool [B] tensor");
    rst = reinterpret_cast<const uint8_t*>(reset->data_ptr());
  }
  Tensor y = empty_like_shape(w, {B, H, m});
  Tensor saved = empty_like_shape(w, {record ? sh.G : 0, rfwp::fwm_saved_size(static_cast<int>(m), static_cast<int>(nr)), sh.W});
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "fwm_step", [&] {
    using S = scalar_t;
    rfwp::FwmStepArgs<S> a = fwm_step_args<S>(state, sh);
    a.w = ptr<S>(w);
    a.r = ptr<S>(r);
    a.reset = rst;
    a.y = out<S>(y);
    a.saved = record ? out<S>(saved) : nullptr;
    a.nr = static_cast<int>(nr);
    rfwp::cpu::fwm_step(a);
  });
  return {y, saved};
}

// The fast tensors of a stepper of B x H memories now, F [B, H, m, m, m] (materialised).
Tensor fwm_step_dense(std::vector<Tensor> state, int64_t B, int64_t H) {
  const FwmStepShape sh = fwm_step_shape(state, B, H);
  Tensor F = at::empty({B, H, sh.m, sh.m, sh.m}, state[2].options());
  AT_DISPATCH_FLOATING_TYPES(F.scalar_type(), "fwm_step_dense", [&] {
    rfwp::cpu::fwm_step_dense(fwm_step_args<scalar_t>(state, sh), out<scalar_t>(F));
  });
  return F;
}

// ------------------------------------------------------------------------------------ lstm

// One LSTM layer on the CPU: the matrix products here (ATen GEMMs), the pointwise part of each
// step in cpu/lstm_impl.h (the equations are there). No CUDA kernel: the cores run torch's
// nn.LSTM (cuDNN) on a GPU. chunk 0: inference (nothing kept for a backward); any other value
// keeps the activations of every step (O(5 H) numbers per step and row: no checkpoints).
struct LstmShapes {
  int64_t T, B, I, H;
};

LstmShapes check_lstm_inputs(const Tensor& x, const Tensor& h0, const Tensor& c0,
                             const Tensor& w_ih, const Tensor& w_hh) {
  TORCH_CHECK(!x.is_cuda(), "lstm has no CUDA kernel (run torch's nn.LSTM on a GPU)");
  TORCH_CHECK(x.dim() == 3, "x must be [T, B, I], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "fused kernels support float32 and float64, got ", x.scalar_type());
  TORCH_CHECK(w_hh.dim() == 2 && w_hh.size(1) >= 1 && w_hh.size(0) == 4 * w_hh.size(1),
              "w_hh must be [4H, H] with H >= 1, got ", w_hh.sizes());
  const LstmShapes s{x.size(0), x.size(1), x.size(2), w_hh.size(1)};
  TORCH_CHECK(s.I >= 1, "x must have an input size >= 1, got ", x.sizes());
  TORCH_CHECK(s.T <= INT32_MAX && s.B <= INT32_MAX && 4 * s.H <= INT32_MAX,
              "sizes beyond the kernels' 32-bit range: ", x.sizes(), ", H = ", s.H);
  check_tensor(w_ih, "w_ih", x, {4 * s.H, s.I});
  check_tensor(w_hh, "w_hh", x, {4 * s.H, s.H});
  check_tensor(h0, "h0", x, {s.B, s.H});
  check_tensor(c0, "c0", x, {s.B, s.H});
  return s;
}

const uint8_t* lstm_reset(const optional<Tensor>& reset, const LstmShapes& s, const Tensor& like) {
  Dims n;
  n.T = static_cast<int>(s.T);
  n.B = static_cast<int>(s.B);
  return reset_ptr(reset, n, like);
}

// the pointwise part of a step over the batch rows, split over the intra-op threads
template <typename Fn>
void lstm_rows(const LstmShapes& s, Fn fn) {
  const int64_t grain = std::max<int64_t>(1, 2048 / s.H);
  at::parallel_for(0, s.B, grain, [&](int64_t b0, int64_t b1) {
    fn(static_cast<int>(b0), static_cast<int>(b1));
  });
}

// {y [T, B, H], h_T, c_T [B, H], activations [T, B, 4H], c [T, B, H]} (the last two empty when
// chunk is 0).
std::vector<Tensor> lstm_forward_impl(const Tensor& x, const Tensor& h0, const Tensor& c0,
                                      const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                                      const Tensor& b_hh, const optional<Tensor>& reset,
                                      int64_t chunk) {
  TORCH_CHECK(chunk >= 0, "checkpoint interval must be >= 0, got ", chunk);
  const LstmShapes s = check_lstm_inputs(x, h0, c0, w_ih, w_hh);
  check_tensor(b_ih, "b_ih", x, {4 * s.H});
  check_tensor(b_hh, "b_hh", x, {4 * s.H});
  const uint8_t* rst = lstm_reset(reset, s, x);
  const int64_t T = s.T, B = s.B, H = s.H;
  // the input projection of every step in one GEMM; each step adds its recurrent product
  Tensor gates = at::addmm(b_ih + b_hh, x.reshape({T * B, s.I}), w_ih.t()).view({T, B, 4 * H});
  Tensor y = empty_like_shape(x, {T, B, H}), c = empty_like_shape(x, {T, B, H});
  const Tensor w_hh_t = w_hh.t();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lstm_forward", [&] {
    using S = scalar_t;
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t* rt = rst != nullptr ? rst + t * B : nullptr;
      Tensor h_prev = t == 0 ? h0 : y[t - 1];
      if (rt != nullptr && std::any_of(rt, rt + B, [](uint8_t r) { return r != 0; }))
        h_prev = h_prev.masked_fill((*reset)[t].to(at::kBool).unsqueeze(1), 0);
      Tensor g = gates[t];
      g.addmm_(h_prev, w_hh_t);
      const S* c_prev = t == 0 ? ptr<S>(c0) : ptr<S>(c) + (t - 1) * B * H;
      S* ga = out<S>(g);
      S* ct = out<S>(c) + t * B * H;
      S* ht = out<S>(y) + t * B * H;
      lstm_rows(s, [&](int b0, int b1) {
        rfwp::cpu::lstm_step_forward<S>(ga, c_prev, rt, ct, ht, b0, b1, static_cast<int>(H));
      });
    }
  });
  Tensor hT = T > 0 ? y[T - 1].clone() : h0.clone();
  Tensor cT = T > 0 ? c[T - 1].clone() : c0.clone();
  if (chunk == 0) return {y, hT, cT, empty_like_shape(x, {0}), empty_like_shape(x, {0})};
  return {y, hT, cT, gates, c};
}

// {gx, gh0, gc0, gw_ih, gw_hh, gb} (gb: the gradient of b_ih and of b_hh; gx empty unless
// need_gx). y, acts, c: what the forward returned; gy, ghT, gcT: gradients of its outputs
// (undefined: zero).
std::vector<Tensor> lstm_backward_impl(const Tensor& x, const Tensor& h0, const Tensor& c0,
                                       const Tensor& w_ih, const Tensor& w_hh,
                                       const optional<Tensor>& reset, const Tensor& y,
                                       const Tensor& acts, const Tensor& c,
                                       const optional<Tensor>& gy, const optional<Tensor>& ghT,
                                       const optional<Tensor>& gcT, bool need_gx) {
  const LstmShapes s = check_lstm_inputs(x, h0, c0, w_ih, w_hh);
  const int64_t T = s.T, B = s.B, H = s.H;
  check_tensor(y, "y", x, {T, B, H});
  check_tensor(acts, "activations", x, {T, B, 4 * H});
  check_tensor(c, "c", x, {T, B, H});
  check_optional(gy, "grad y", x, {T, B, H});
  check_optional(ghT, "grad h_T", x, {B, H});
  check_optional(gcT, "grad c_T", x, {B, H});
  const uint8_t* rst = lstm_reset(reset, s, x);
  const bool has_gy = gy.has_value() && gy->defined();
  Tensor da = empty_like_shape(x, {T, B, 4 * H});
  // dh: ∂L/∂h_t through the later steps (W_hhᵀ da_{t+1}), dc: ∂L/∂c_t, walked from t = T - 1
  Tensor dh = (ghT.has_value() && ghT->defined()) ? ghT->clone() : at::zeros({B, H}, x.options());
  Tensor dc = (gcT.has_value() && gcT->defined()) ? gcT->clone() : at::zeros({B, H}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lstm_backward", [&] {
    using S = scalar_t;
    for (int64_t t = T - 1; t >= 0; --t) {
      const uint8_t* rt = rst != nullptr ? rst + t * B : nullptr;
      const uint8_t* rn = (rst != nullptr && t + 1 < T) ? rst + (t + 1) * B : nullptr;
      const S* c_prev = t == 0 ? ptr<S>(c0) : ptr<S>(c) + (t - 1) * B * H;
      const S* a = ptr<S>(acts) + t * B * 4 * H;
      const S* ct = ptr<S>(c) + t * B * H;
      const S* gyt = has_gy ? ptr<S>(*gy) + t * B * H : nullptr;
      S* dhp = out<S>(dh);
      S* dcp = out<S>(dc);
      S* dat = out<S>(da) + t * B * 4 * H;
      lstm_rows(s, [&](int b0, int b1) {
        rfwp::cpu::lstm_step_backward<S>(a, ct, c_prev, rt, rn, gyt, dhp, dcp, dat, b0, b1,
                                         static_cast<int>(H));
      });
      at::mm_out(dh, da[t], w_hh);   // ∂L/∂h_{t-1} through step t
    }
  });
  // no gradient into the zeroed state of an entry that resets before step 0
  if (rst != nullptr && T > 0) dh.masked_fill_((*reset)[0].to(at::kBool).unsqueeze(1), 0);
  // the weight gradients of all steps: one GEMM each over the (t, b) rows
  const Tensor da2 = da.view({T * B, 4 * H});
  Tensor gx = need_gx ? at::mm(da2, w_ih).view({T, B, s.I}) : empty_like_shape(x, {0});
  Tensor gw_ih = at::mm(da2.t(), x.reshape({T * B, s.I}));
  // Σ_t da_t ⊗ h_{t-1}: h_{t-1} is y[t - 1] (h0 at t = 0), zero in rows that reset before t
  Tensor gw_hh;
  if (T == 0) {
    gw_hh = at::zeros_like(w_hh);
  } else if (rst == nullptr) {
    gw_hh = at::mm(da[0].t(), h0);
    if (T > 1) gw_hh.addmm_(da2.narrow(0, B, (T - 1) * B).t(), y.narrow(0, 0, T - 1).reshape({(T - 1) * B, H}));
  } else {
    Tensor h_prev = empty_like_shape(x, {T, B, H});
    h_prev[0].copy_(h0);
    h_prev.narrow(0, 1, T - 1).copy_(y.narrow(0, 0, T - 1));
    h_prev.masked_fill_(reset->to(at::kBool).unsqueeze(2), 0);
    gw_hh = at::mm(da2.t(), h_prev.view({T * B, H}));
  }
  Tensor gb = da2.sum(0);
  return {gx, dh, dc, gw_ih, gw_hh, gb};
}

// --------------------------------------------------------------------- mamba (selective scan)

// The selective SSM of Mamba (cpu/selective_scan_impl.h has the equations): one batch entry per
// task on the CPU, one block per batch entry on CUDA (cuda/selective_scan.cu). chunk 0: inference
// (no checkpoints); else the state before every chunk of `chunk` steps is kept for the backward.
// Dims: H = 1, dk = N (state values per channel), dv = D (channels).
Dims check_scan_inputs(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& Bm,
                       const Tensor& C, int64_t chunk) {
  TORCH_CHECK(u.dim() == 3, "u must be [T, B, D], got ", u.sizes());
  TORCH_CHECK(u.scalar_type() == at::kFloat || u.scalar_type() == at::kDouble,
              "fused kernels support float32 and float64, got ", u.scalar_type());
  TORCH_CHECK(A.dim() == 2 && A.size(0) == u.size(2) && A.size(1) >= 1,
              "A must be [D, N] with D = ", u.size(2), " and N >= 1, got ", A.sizes());
  const int64_t T = u.size(0), B = u.size(1), D = u.size(2), N = A.size(1);
  TORCH_CHECK(D >= 1, "u must have D >= 1 channels, got ", u.sizes());
  TORCH_CHECK(T <= INT32_MAX && B <= INT32_MAX && D * N <= INT32_MAX,
              "sizes beyond the kernels' 32-bit range: ", u.sizes(), ", N = ", N);
  check_tensor(delta, "delta", u, {T, B, D});
  check_tensor(A, "A", u, {D, N});
  check_tensor(Bm, "B", u, {T, B, N});
  check_tensor(C, "C", u, {T, B, N});
  Dims n;
  n.T = static_cast<int>(T);
  n.B = static_cast<int>(B);
  n.H = 1;
  n.dk = static_cast<int>(N);
  n.dv = static_cast<int>(D);
  n.chunk = static_cast<int>(chunk);
  return n;
}

// {y [T, B, D], h_T [B, D, N], checkpoints [ceil(T / chunk), B, D, N] (empty when chunk is 0)}
std::vector<Tensor> mamba_forward_impl(const Tensor& u, const Tensor& delta, const Tensor& A,
                                       const Tensor& Bm, const Tensor& C, const Tensor& h0,
                                       const optional<Tensor>& reset, int64_t chunk, int64_t threads) {
  TORCH_CHECK(chunk >= 0, "checkpoint interval must be >= 0, got ", chunk);
  const Dims n = check_scan_inputs(u, delta, A, Bm, C, chunk);
  check_tensor(h0, "h0", u, {n.B, n.dv, n.dk});
  const uint8_t* rst = reset_ptr(reset, n, u);
  Tensor y = empty_like_shape(u, {n.T, n.B, n.dv}), hT = empty_like_shape(u, {n.B, n.dv, n.dk});
  Tensor ckpt = empty_like_shape(u, {nck(n), n.B, n.dv, n.dk});
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "mamba_forward", [&] {
    using S = scalar_t;
    rfwp::MambaFwdArgs<S> a{ptr<S>(u), ptr<S>(delta), ptr<S>(A), ptr<S>(Bm), ptr<S>(C), ptr<S>(h0), rst,
                            out<S>(y), out<S>(hT), chunk > 0 ? out<S>(ckpt) : nullptr, n};
    RFWP_RUN(mamba_forward, a, u, threads);
  });
  return {y, hT, ckpt};
}

// {gu, gdelta, gA, gB, gC, gh0}: ckpt from the forward with the same chunk; gy, ghT: gradients
// of y and h_T (undefined: zero). gA sums the entries' partial sums in order of the entry.
std::vector<Tensor> mamba_backward_impl(const Tensor& u, const Tensor& delta, const Tensor& A,
                                        const Tensor& Bm, const Tensor& C,
                                        const optional<Tensor>& reset, const Tensor& ckpt,
                                        const optional<Tensor>& gy, const optional<Tensor>& ghT,
                                        int64_t chunk, int64_t threads) {
  TORCH_CHECK(chunk >= 1, "checkpoint interval must be >= 1, got ", chunk);
  const Dims n = check_scan_inputs(u, delta, A, Bm, C, chunk);
  check_tensor(ckpt, "checkpoints", u, {nck(n), n.B, n.dv, n.dk});
  check_optional(gy, "grad y", u, {n.T, n.B, n.dv});
  check_optional(ghT, "grad h_T", u, {n.B, n.dv, n.dk});
  const uint8_t* rst = reset_ptr(reset, n, u);
  Tensor gu = empty_like_shape(u, {n.T, n.B, n.dv}), gdelta = empty_like_shape(u, {n.T, n.B, n.dv});
  Tensor gB = empty_like_shape(u, {n.T, n.B, n.dk}), gC = empty_like_shape(u, {n.T, n.B, n.dk});
  Tensor gh0 = empty_like_shape(u, {n.B, n.dv, n.dk}), gA_part = empty_like_shape(u, {n.B, n.dv, n.dk});
  Tensor gA = empty_like_shape(u, {n.dv, n.dk});
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "mamba_backward", [&] {
    using S = scalar_t;
    rfwp::MambaBwdArgs<S> a{ptr<S>(u), ptr<S>(delta), ptr<S>(A), ptr<S>(Bm), ptr<S>(C), rst, ptr<S>(ckpt),
                            ptr_or_null<S>(gy), ptr_or_null<S>(ghT), out<S>(gu), out<S>(gdelta),
                            out<S>(gA_part), out<S>(gA), out<S>(gB), out<S>(gC), out<S>(gh0), n};
    RFWP_RUN(mamba_backward, a, u, threads);
  });
  return {gu, gdelta, gA, gB, gC, gh0};
}

// ------------------------------------------------------------------ entry points (dtype, layout)

bool is_half(const Tensor& x) {
  return x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
}

// The kernels' view of an input: contiguous, and float32 for half types.
Tensor prep(const Tensor& x, bool to_float) {
  if (!x.defined()) return x;
  Tensor y = (to_float && x.is_floating_point()) ? x.to(at::kFloat) : x;
  return y.contiguous();
}
optional<Tensor> prep(const optional<Tensor>& x, bool to_float) {
  if (!x.has_value() || !x->defined()) return x;
  return prep(*x, to_float);
}

// Forward inputs of one op share one floating dtype (checked before a half conversion hides it).
void same_dtype(const Tensor& like, std::initializer_list<std::pair<const char*, const Tensor*>> xs) {
  for (const auto& [name, x] : xs)
    TORCH_CHECK(x->scalar_type() == like.scalar_type(), name, " has dtype ", x->scalar_type(),
                ", expected ", like.scalar_type());
}

// Outputs `which` back to the caller's dtype.
std::vector<Tensor> to_dtype(std::vector<Tensor> outs, std::initializer_list<int> which, at::ScalarType dt) {
  for (int i : which) outs[i] = outs[i].to(dt);
  return outs;
}

std::vector<Tensor> to_dtype_all(std::vector<Tensor> outs, at::ScalarType dt) {
  for (auto& x : outs) x = x.to(dt);
  return outs;
}

std::vector<Tensor> lt_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W0,
                               const optional<Tensor>& reset, int64_t chunk, int64_t threads) {
  same_dtype(q, {{"k", &k}, {"v", &v}, {"W0", &W0}});
  const bool h = is_half(q);
  auto outs = lt_forward_impl(prep(q, h), prep(k, h), prep(v, h), prep(W0, h), prep(reset, false), chunk, threads);
  return h ? to_dtype(outs, {0, 1}, q.scalar_type()) : outs;
}
std::vector<Tensor> delta_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta,
                                  const Tensor& W0, const optional<Tensor>& reset, int64_t chunk,
                                  int64_t threads) {
  same_dtype(q, {{"k", &k}, {"v", &v}, {"beta", &beta}, {"W0", &W0}});
  const bool h = is_half(q);
  auto outs = delta_forward_impl(prep(q, h), prep(k, h), prep(v, h), prep(beta, h), prep(W0, h),
                                 prep(reset, false), chunk, threads);
  return h ? to_dtype(outs, {0, 1}, q.scalar_type()) : outs;
}
std::vector<Tensor> lt_backward(const Tensor& q, const Tensor& k, const Tensor& v, const optional<Tensor>& reset,
                                const Tensor& ckpt, const Tensor& gy, const optional<Tensor>& gW,
                                int64_t chunk, int64_t threads) {
  const bool h = is_half(q);
  auto outs = lt_backward_impl(prep(q, h), prep(k, h), prep(v, h), prep(reset, false), prep(ckpt, h),
                               prep(gy, h), prep(gW, h), chunk, threads);
  return h ? to_dtype_all(outs, q.scalar_type()) : outs;
}
std::vector<Tensor> delta_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta,
                                   const optional<Tensor>& reset, const Tensor& ckpt, const Tensor& gy,
                                   const optional<Tensor>& gW, int64_t chunk, int64_t threads) {
  const bool h = is_half(q);
  auto outs = delta_backward_impl(prep(q, h), prep(k, h), prep(v, h), prep(beta, h), prep(reset, false),
                                  prep(ckpt, h), prep(gy, h), prep(gW, h), chunk, threads);
  return h ? to_dtype_all(outs, q.scalar_type()) : outs;
}
std::vector<Tensor> delta_rnn_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta,
                                      const Tensor& kr, const Tensor& vr, const Tensor& beta_r,
                                      const Tensor& W0, const Tensor& R0, const Tensor& y0,
                                      const optional<Tensor>& reset, int64_t chunk, int64_t threads) {
  same_dtype(q, {{"k", &k}, {"v", &v}, {"beta", &beta}, {"kr", &kr}, {"vr", &vr}, {"beta_r", &beta_r},
                 {"W0", &W0}, {"R0", &R0}, {"y0", &y0}});
  const bool h = is_half(q);
  auto outs = delta_rnn_forward_impl(prep(q, h), prep(k, h), prep(v, h), prep(beta, h), prep(kr, h),
                                     prep(vr, h), prep(beta_r, h), prep(W0, h), prep(R0, h), prep(y0, h),
                                     prep(reset, false), chunk, threads);
  return h ? to_dtype(outs, {0, 1, 2}, q.scalar_type()) : outs;
}
std::vector<Tensor> delta_rnn_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta,
                                       const Tensor& kr, const Tensor& vr, const Tensor& beta_r,
                                       const Tensor& sq, const optional<Tensor>& reset, const Tensor& ckW,
                                       const Tensor& ckR, const Tensor& gy, const optional<Tensor>& gW,
                                       const optional<Tensor>& gR, int64_t chunk, int64_t threads) {
  const bool h = is_half(q);
  auto outs = delta_rnn_backward_impl(prep(q, h), prep(k, h), prep(v, h), prep(beta, h), prep(kr, h),
                                      prep(vr, h), prep(beta_r, h), prep(sq, h), prep(reset, false),
                                      prep(ckW, h), prep(ckR, h), prep(gy, h), prep(gW, h), prep(gR, h),
                                      chunk, threads);
  return h ? to_dtype_all(outs, q.scalar_type()) : outs;
}
std::vector<Tensor> rdn_forward(const Tensor& xq, const Tensor& xk, const Tensor& xv, const Tensor& xb,
                                const Tensor& Rq, const Tensor& Rk, const Tensor& Rv, const Tensor& rb,
                                const Tensor& W0, const Tensor& y0, const optional<Tensor>& reset,
                                int64_t chunk, int64_t threads) {
  same_dtype(xq, {{"xk", &xk}, {"xv", &xv}, {"xb", &xb}, {"Rq", &Rq}, {"Rk", &Rk}, {"Rv", &Rv},
                  {"rb", &rb}, {"W0", &W0}, {"y0", &y0}});
  const bool h = is_half(xq);
  auto outs = rdn_forward_impl(prep(xq, h), prep(xk, h), prep(xv, h), prep(xb, h), prep(Rq, h), prep(Rk, h),
                               prep(Rv, h), prep(rb, h), prep(W0, h), prep(y0, h), prep(reset, false),
                               chunk, threads);
  return h ? to_dtype(outs, {0, 1}, xq.scalar_type()) : outs;
}
std::vector<Tensor> rdn_backward(const Tensor& Rq, const Tensor& Rk, const Tensor& Rv, const Tensor& rb,
                                 const Tensor& hh, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& beta, const optional<Tensor>& reset, const Tensor& ckpt,
                                 const Tensor& gy, const optional<Tensor>& gW, int64_t chunk,
                                 int64_t threads) {
  // Rq is the caller's slow weight (its dtype is the op's); q, k, v, beta, h, ckpt are kept
  // float32 by a half-precision forward
  const bool h = is_half(Rq);
  auto outs = rdn_backward_impl(prep(Rq, h), prep(Rk, h), prep(Rv, h), prep(rb, h), prep(hh, h), prep(q, h),
                                prep(k, h), prep(v, h), prep(beta, h), prep(reset, false), prep(ckpt, h),
                                prep(gy, h), prep(gW, h), chunk, threads);
  return h ? to_dtype_all(outs, Rq.scalar_type()) : outs;
}

std::vector<Tensor> gated_delta_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& alpha, const Tensor& beta, const Tensor& W0,
                                        const optional<Tensor>& reset, int64_t chunk, int64_t threads) {
  same_dtype(q, {{"k", &k}, {"v", &v}, {"alpha", &alpha}, {"beta", &beta}, {"W0", &W0}});
  const bool h = is_half(q);
  auto outs = product_forward_impl(true, prep(q, h), prep(k, h), prep(v, h), prep(optional<Tensor>(alpha), h),
                                   prep(beta, h), prep(W0, h), prep(reset, false), chunk, threads);
  return h ? to_dtype(outs, {0, 1}, q.scalar_type()) : outs;
}
std::vector<Tensor> gated_delta_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& alpha, const Tensor& beta,
                                         const optional<Tensor>& reset, const Tensor& ckpt,
                                         const Tensor& gy, const optional<Tensor>& gW, int64_t chunk,
                                         int64_t threads) {
  const bool h = is_half(q);
  auto outs = product_backward_impl(true, prep(q, h), prep(k, h), prep(v, h),
                                    prep(optional<Tensor>(alpha), h), prep(beta, h), prep(reset, false),
                                    prep(ckpt, h), prep(gy, h), prep(gW, h), chunk, threads);
  return h ? to_dtype_all(outs, q.scalar_type()) : outs;
}
std::vector<Tensor> delta_product_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& beta, const Tensor& W0,
                                          const optional<Tensor>& reset, int64_t chunk, int64_t threads) {
  same_dtype(q, {{"k", &k}, {"v", &v}, {"beta", &beta}, {"W0", &W0}});
  const bool h = is_half(q);
  auto outs = product_forward_impl(false, prep(q, h), prep(k, h), prep(v, h), c10::nullopt,
                                   prep(beta, h), prep(W0, h), prep(reset, false), chunk, threads);
  return h ? to_dtype(outs, {0, 1}, q.scalar_type()) : outs;
}
std::vector<Tensor> delta_product_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& beta, const optional<Tensor>& reset,
                                           const Tensor& ckpt, const Tensor& gy,
                                           const optional<Tensor>& gW, int64_t chunk, int64_t threads) {
  const bool h = is_half(q);
  auto outs = product_backward_impl(false, prep(q, h), prep(k, h), prep(v, h), c10::nullopt,
                                    prep(beta, h), prep(reset, false), prep(ckpt, h), prep(gy, h),
                                    prep(gW, h), chunk, threads);
  return h ? to_dtype_all(outs, q.scalar_type()) : outs;
}
std::vector<Tensor> srwm_forward(const Tensor& x, const Tensor& Winit, const Tensor& dW0,
                                 const optional<Tensor>& reset, int64_t chunk, int64_t threads) {
  same_dtype(x, {{"W_init", &Winit}, {"dW0", &dW0}});
  const bool h = is_half(x);
  auto outs = srwm_forward_impl(prep(x, h), prep(Winit, h), prep(dW0, h), prep(reset, false), chunk,
                                threads);
  return h ? to_dtype(outs, {0, 1}, x.scalar_type()) : outs;
}
std::vector<Tensor> srwm_backward(const Tensor& x, const Tensor& Winit, const optional<Tensor>& reset,
                                  const Tensor& ckpt, const Tensor& gy, const optional<Tensor>& gdW,
                                  int64_t chunk, int64_t threads) {
  const bool h = is_half(x);
  auto outs = srwm_backward_impl(prep(x, h), prep(Winit, h), prep(reset, false), prep(ckpt, h),
                                 prep(gy, h), prep(gdW, h), chunk, threads);
  return h ? to_dtype_all(outs, x.scalar_type()) : outs;
}

std::vector<Tensor> fwm_forward(const Tensor& w, const Tensor& r, const Tensor& F0,
                                const optional<Tensor>& reset, int64_t chunk, int64_t threads) {
  same_dtype(w, {{"r", &r}, {"F0", &F0}});
  const bool h = is_half(w);
  auto outs = fwm_forward_impl(prep(w, h), prep(r, h), prep(F0, h), prep(reset, false), chunk);
  return h ? to_dtype(outs, {0, 1}, w.scalar_type()) : outs;
}
std::vector<Tensor> fwm_backward(const Tensor& w, const Tensor& r, const Tensor& F0,
                                 const optional<Tensor>& reset, const Tensor& saved, const Tensor& bases,
                                 const Tensor& gy, const optional<Tensor>& gF, bool need_gF0,
                                 int64_t chunk, int64_t threads) {
  const bool h = is_half(w);
  auto outs = fwm_backward_impl(prep(w, h), prep(r, h), prep(F0, h), prep(reset, false),
                                prep(saved, h), prep(bases, h), prep(gy, h), prep(gF, h), need_gF0,
                                chunk);
  return h ? to_dtype_all(outs, w.scalar_type()) : outs;
}

// The forward also returns y in the compute dtype (the same tensor when that is the inputs'
// dtype), for the backward's recurrent-weight gradient.
std::vector<Tensor> lstm_forward(const Tensor& x, const Tensor& h0, const Tensor& c0,
                                 const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                                 const Tensor& b_hh, const optional<Tensor>& reset, int64_t chunk,
                                 int64_t threads) {
  same_dtype(x, {{"h0", &h0}, {"c0", &c0}, {"w_ih", &w_ih}, {"w_hh", &w_hh}, {"b_ih", &b_ih},
                 {"b_hh", &b_hh}});
  const bool h = is_half(x);
  auto outs = lstm_forward_impl(prep(x, h), prep(h0, h), prep(c0, h), prep(w_ih, h), prep(w_hh, h),
                                prep(b_ih, h), prep(b_hh, h), prep(reset, false), chunk);
  outs.push_back(outs[0]);
  return h ? to_dtype(outs, {0, 1, 2}, x.scalar_type()) : outs;
}
std::vector<Tensor> lstm_backward(const Tensor& x, const Tensor& h0, const Tensor& c0,
                                  const Tensor& w_ih, const Tensor& w_hh,
                                  const optional<Tensor>& reset, const Tensor& y,
                                  const Tensor& acts, const Tensor& c, const optional<Tensor>& gy,
                                  const optional<Tensor>& ghT, const optional<Tensor>& gcT,
                                  bool need_gx, int64_t threads) {
  const bool h = is_half(x);
  auto outs = lstm_backward_impl(prep(x, h), prep(h0, h), prep(c0, h), prep(w_ih, h),
                                 prep(w_hh, h), prep(reset, false), prep(y, h), prep(acts, h),
                                 prep(c, h), prep(gy, h), prep(ghT, h), prep(gcT, h), need_gx);
  return h ? to_dtype_all(outs, x.scalar_type()) : outs;
}

std::vector<Tensor> mamba_forward(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& Bm,
                                  const Tensor& C, const Tensor& h0, const optional<Tensor>& reset,
                                  int64_t chunk, int64_t threads) {
  same_dtype(u, {{"delta", &delta}, {"A", &A}, {"B", &Bm}, {"C", &C}, {"h0", &h0}});
  const bool h = is_half(u);
  auto outs = mamba_forward_impl(prep(u, h), prep(delta, h), prep(A, h), prep(Bm, h), prep(C, h),
                                 prep(h0, h), prep(reset, false), chunk, threads);
  return h ? to_dtype(outs, {0, 1}, u.scalar_type()) : outs;
}
std::vector<Tensor> mamba_backward(const Tensor& u, const Tensor& delta, const Tensor& A,
                                   const Tensor& Bm, const Tensor& C, const optional<Tensor>& reset,
                                   const Tensor& ckpt, const optional<Tensor>& gy,
                                   const optional<Tensor>& ghT, int64_t chunk, int64_t threads) {
  const bool h = is_half(u);
  auto outs = mamba_backward_impl(prep(u, h), prep(delta, h), prep(A, h), prep(Bm, h), prep(C, h),
                                  prep(reset, false), prep(ckpt, h), prep(gy, h), prep(ghT, h), chunk,
                                  threads);
  return h ? to_dtype_all(outs, u.scalar_type()) : outs;
}

// exp / tanh of the CPU kernels (cpu/vec_math.h) elementwise, for accuracy tests.
Tensor vec_math(const Tensor& x, const std::string& fn) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
              "expected a float32/float64 CPU tensor");
  TORCH_CHECK(fn == "exp" || fn == "tanh", "fn must be 'exp' or 'tanh'");
  Tensor xc = x.contiguous(), y = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "vec_math", [&] {
    const int64_t n = xc.numel();
    for (int64_t i = 0; i < n; i += (1 << 20)) {
      const int len = static_cast<int>(std::min<int64_t>(n - i, 1 << 20));
      if (fn == "exp") rfwp::cpu::vexp_n(xc.data_ptr<scalar_t>() + i, y.data_ptr<scalar_t>() + i, len);
      else rfwp::cpu::vtanh_n(xc.data_ptr<scalar_t>() + i, y.data_ptr<scalar_t>() + i, len);
    }
  });
  return y;
}

bool has_cuda() {
#ifdef RFWP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.doc() = "rfwp_rl fused fast-weight recurrences (lt, delta, delta_rnn, rdn, gated_delta, "
          "delta_product, srwm, fwm), the CPU LSTM layer (lstm) and the selective scan of Mamba "
          "(mamba), forward and backward";
  m.def("has_cuda", &has_cuda, "whether this build includes the CUDA kernels");
  m.def("_vec_math", &vec_math, "the CPU kernels' exp or tanh, elementwise (for tests)");
  m.def("lt_forward", &lt_forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("W0"),
        py::arg("reset"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("lt_backward", &lt_backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("reset"),
        py::arg("ckpt"), py::arg("gy"), py::arg("gW"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("delta_forward", &delta_forward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("beta"), py::arg("W0"), py::arg("reset"), py::arg("chunk"),
        py::arg("threads") = 0);
  m.def("delta_backward", &delta_backward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("beta"), py::arg("reset"), py::arg("ckpt"), py::arg("gy"), py::arg("gW"),
        py::arg("chunk"), py::arg("threads") = 0);
  m.def("delta_rnn_forward", &delta_rnn_forward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("beta"), py::arg("kr"), py::arg("vr"), py::arg("beta_r"), py::arg("W0"),
        py::arg("R0"), py::arg("y0"), py::arg("reset"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("delta_rnn_backward", &delta_rnn_backward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("beta"), py::arg("kr"), py::arg("vr"), py::arg("beta_r"), py::arg("s"),
        py::arg("reset"), py::arg("ckptW"), py::arg("ckptR"), py::arg("gy"),
        py::arg("gW"), py::arg("gR"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("rdn_forward", &rdn_forward, py::arg("xq"), py::arg("xk"), py::arg("xv"), py::arg("xb"),
        py::arg("Rq"), py::arg("Rk"), py::arg("Rv"), py::arg("rb"), py::arg("W0"), py::arg("y0"),
        py::arg("reset"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("rdn_backward", &rdn_backward, py::arg("Rq"), py::arg("Rk"), py::arg("Rv"),
        py::arg("rb"), py::arg("h"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("beta"), py::arg("reset"), py::arg("ckpt"), py::arg("gy"), py::arg("gW"),
        py::arg("chunk"), py::arg("threads") = 0);
  m.def("gated_delta_forward", &gated_delta_forward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("alpha"), py::arg("beta"), py::arg("W0"), py::arg("reset"), py::arg("chunk"),
        py::arg("threads") = 0);
  m.def("gated_delta_backward", &gated_delta_backward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("alpha"), py::arg("beta"), py::arg("reset"), py::arg("ckpt"), py::arg("gy"),
        py::arg("gW"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("delta_product_forward", &delta_product_forward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("beta"), py::arg("W0"), py::arg("reset"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("delta_product_backward", &delta_product_backward, py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("beta"), py::arg("reset"), py::arg("ckpt"), py::arg("gy"),
        py::arg("gW"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("srwm_forward", &srwm_forward, py::arg("x"), py::arg("W_init"), py::arg("dW0"),
        py::arg("reset"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("srwm_backward", &srwm_backward, py::arg("x"), py::arg("W_init"), py::arg("reset"),
        py::arg("ckpt"), py::arg("gy"), py::arg("gdW"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("fwm_forward", &fwm_forward, py::arg("w"), py::arg("r"), py::arg("F0"), py::arg("reset"),
        py::arg("chunk"), py::arg("threads") = 0);
  m.def("fwm_backward", &fwm_backward, py::arg("w"), py::arg("r"), py::arg("F0"), py::arg("reset"),
        py::arg("saved"), py::arg("bases"), py::arg("gy"), py::arg("gF"), py::arg("need_gF0"),
        py::arg("chunk"), py::arg("threads") = 0);
  m.def("lstm_forward", &lstm_forward, py::arg("x"), py::arg("h0"), py::arg("c0"),
        py::arg("w_ih"), py::arg("w_hh"), py::arg("b_ih"), py::arg("b_hh"), py::arg("reset"),
        py::arg("chunk"), py::arg("threads") = 0);
  m.def("lstm_backward", &lstm_backward, py::arg("x"), py::arg("h0"), py::arg("c0"),
        py::arg("w_ih"), py::arg("w_hh"), py::arg("reset"), py::arg("y"), py::arg("acts"),
        py::arg("c"), py::arg("gy"), py::arg("ghT"), py::arg("gcT"), py::arg("need_gx"),
        py::arg("threads") = 0);
  m.def("mamba_forward", &mamba_forward, py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"),
        py::arg("C"), py::arg("h0"), py::arg("reset"), py::arg("chunk"), py::arg("threads") = 0);
  m.def("mamba_backward", &mamba_backward, py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"),
        py::arg("C"), py::arg("reset"), py::arg("ckpt"), py::arg("gy"), py::arg("ghT"), py::arg("chunk"),
        py::arg("threads") = 0);
  m.def("fwm_step_state", &fwm_step_state, py::arg("B"), py::arg("H"), py::arg("m"),
        py::arg("like"), py::arg("F0"), py::arg("capacity"),
        "the fwm stepper's state, from F0 [B, H, m, m, m] or zero");
  m.def("fwm_step_grow", &fwm_step_grow, py::arg("state"), py::arg("capacity"),
        "the fwm stepper's state with room for `capacity` tail terms");
  m.def("fwm_step", &fwm_step, py::arg("w"), py::arg("r"), py::arg("reset"), py::arg("state"),
        py::arg("record") = false,
        "one fwm step (inference), updating the stepper state in place: [y, saved]");
  m.def("fwm_fold_length", [](int64_t m) { return rfwp::fwm_tail_capacity(static_cast<int>(m)); },
        py::arg("m"), "the longest low-rank tail of an fwm memory of size m before it is folded");
  m.def("fwm_step_dense", &fwm_step_dense, py::arg("state"), py::arg("B"), py::arg("H"),
        "the fast tensors of an fwm stepper now, [B, H, m, m, m]");
}
