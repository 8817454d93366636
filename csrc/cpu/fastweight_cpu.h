// CPU entry points of the fused recurrences (defined in fastweight_cpu.cpp; float and double).
// Each runs its (batch, head) tasks in parallel with at::parallel_for.
#pragma once

#include "../fastweight_params.h"

namespace rfwp {
namespace cpu {

template <typename S> void lt_forward(const DeltaFwdArgs<S>& a);
template <typename S> void lt_backward(const DeltaBwdArgs<S>& a);
template <typename S> void delta_forward(const DeltaFwdArgs<S>& a);
template <typename S> void delta_backward(const DeltaBwdArgs<S>& a);
template <typename S> void delta_rnn_forward(const DeltaRnnFwdArgs<S>& a);
template <typename S> void delta_rnn_backward(const DeltaRnnBwdArgs<S>& a);
template <typename S> void rdn_forward(const RdnFwdArgs<S>& a);
template <typename S> void rdn_backward(const RdnBwdArgs<S>& a);
// gated_delta (a.alpha set, a.nh == 1) and delta_product (a.alpha == nullptr)
template <typename S> void product_forward(const ProductFwdArgs<S>& a);
template <typename S> void product_backward(const ProductBwdArgs<S>& a);
template <typename S> void srwm_forward(const SrwmFwdArgs<S>& a);
template <typename S> void srwm_backward(const SrwmBwdArgs<S>& a);
template <typename S> void fwm_forward(const FwmFwdArgs<S>& a);
template <typename S> void fwm_backward(const FwmBwdArgs<S>& a);
// mamba: one task per batch entry (selective_scan_impl.h); the backward also sums the entries'
// partial gradients of A in order of the entry
template <typename S> void mamba_forward(const MambaFwdArgs<S>& a);
template <typename S> void mamba_backward(const MambaBwdArgs<S>& a);
// the incremental stepper: its state from F0 [B, H, m, m, m] rows (null: zero); one step, in
// place on the state; every task's F into rows F [B, H, m, m, m]
template <typename S> void fwm_step_init(const FwmStepArgs<S>& a, const S* F0);
template <typename S> void fwm_step(const FwmStepArgs<S>& a);
template <typename S> void fwm_step_dense(const FwmStepArgs<S>& a, S* F);
// tasks per group of the fwm kernel: the vector lanes of S
template <typename S> int fwm_lanes();

}  // namespace cpu
}  // namespace rfwp
