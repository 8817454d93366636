// Parallel drivers of the CPU recurrences (fastweight_cpu_impl.h): one task per (b, h),
// split over the intra-op threads with at::parallel_for; scratch buffers are allocated once
// per thread range and reused across its tasks.
#include "fastweight_cpu.h"

#include <ATen/Parallel.h>

#include "fastweight_cpu_impl.h"

namespace rfwp {
namespace cpu {
namespace {

template <typename Scratch, typename Fn>
void for_each_task(const Dims& n, Fn fn) {
  at::parallel_for(0, static_cast<int64_t>(n.B) * n.H, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t bh = begin; bh < end; ++bh) fn(static_cast<int>(bh), scratch);
  });
}

}  // namespace

template <typename S> void lt_forward(const DeltaFwdArgs<S>& a) {
  for_each_task<std::vector<S>>(a.n, [&](int bh, std::vector<S>& s) {
    delta_forward_task<S, false>(a, bh, s);
  });
}
template <typename S> void delta_forward(const DeltaFwdArgs<S>& a) {
  for_each_task<std::vector<S>>(a.n, [&](int bh, std::vector<S>& s) {
    delta_forward_task<S, true>(a, bh, s);
  });
}
template <typename S> void lt_backward(const DeltaBwdArgs<S>& a) {
  for_each_task<DeltaScratch<S>>(a.n, [&](int bh, DeltaScratch<S>& s) {
    delta_backward_task<S, false>(a, bh, s);
  });
}
template <typename S> void delta_backward(const DeltaBwdArgs<S>& a) {
  for_each_task<DeltaScratch<S>>(a.n, [&](int bh, DeltaScratch<S>& s) {
    delta_backward_task<S, true>(a, bh, s);
  });
}
template <typename S> void delta_rnn_forward(const DeltaRnnFwdArgs<S>& a) {
  for_each_task<std::vector<S>>(a.n, [&](int bh, std::vector<S>& s) {
    delta_rnn_forward_task<S>(a, bh, s);
  });
}
template <typename S> void delta_rnn_backward(const DeltaRnnBwdArgs<S>& a) {
  for_each_task<DeltaRnnScratch<S>>(a.n, [&](int bh, DeltaRnnScratch<S>& s) {
    delta_rnn_backward_task<S>(a, bh, s);
  });
}
template <typename S> void rdn_forward(const RdnFwdArgs<S>& a) {
  for_each_task<std::vector<S>>(a.n, [&](int bh, std::vector<S>& s) {
    rdn_forward_task<S>(a, bh, s);
  });
}
template <typename S> void rdn_backward(const RdnBwdArgs<S>& a) {
  for_each_task<RdnScratch<S>>(a.n, [&](int bh, RdnScratch<S>& s) {
    rdn_backward_task<S>(a, bh, s);
  });
  // slow-weight gradients: sum the per-(b, h) partials over b in a fixed order
  const int B = a.n.B, H = a.n.H, d = a.n.dv;
  const std::size_t mat = static_cast<std::size_t>(d) * d;
  at::parallel_for(0, static_cast<int64_t>(H) * mat, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int h = static_cast<int>(i / mat);
      const std::size_t e = static_cast<std::size_t>(i % mat);
      sum_over_batch(a.gRq_part, a.gRq, B, H, mat, h, e);
      sum_over_batch(a.gRk_part, a.gRk, B, H, mat, h, e);
      sum_over_batch(a.gRv_part, a.gRv, B, H, mat, h, e);
    }
  });
  for (int h = 0; h < H; ++h)
    for (int e = 0; e < d; ++e) sum_over_batch(a.grb_part, a.grb, B, H, d, h, e);
}

#define RFWP_INSTANTIATE(S)                                          \
  template void lt_forward<S>(const DeltaFwdArgs<S>&);               \
  template void lt_backward<S>(const DeltaBwdArgs<S>&);              \
  template void delta_forward<S>(const DeltaFwdArgs<S>&);            \
  template void delta_backward<S>(const DeltaBwdArgs<S>&);           \
  template void delta_rnn_forward<S>(const DeltaRnnFwdArgs<S>&);     \
  template void delta_rnn_backward<S>(const DeltaRnnBwdArgs<S>&);    \
  template void rdn_forward<S>(const RdnFwdArgs<S>&);                \
  template void rdn_backward<S>(const RdnBwdArgs<S>&);
RFWP_INSTANTIATE(float)
RFWP_INSTANTIATE(double)
#undef RFWP_INSTANTIATE

}  // namespace cpu
}  // namespace rfwp
