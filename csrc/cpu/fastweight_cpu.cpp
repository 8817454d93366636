// Parallel drivers of the CPU recurrences (fastweight_cpu_impl.h): one task per (b, h),
// split over the intra-op threads with at::parallel_for; scratch buffers are allocated once
// per thread range and reused across its tasks. Head sizes 16/32/64 (dk == dv) run the
// register-blocked instantiation, every other size the plain-loop one.
#include "fastweight_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "fastweight_cpu_impl.h"
#include "fwm_impl.h"
#include "householder_product_impl.h"
#include "selective_scan_impl.h"
#include "srwm_impl.h"

namespace rfwp {
namespace cpu {
namespace {

template <typename Fn>
void with_head_size(const Dims& n, Fn fn) {
  if (n.dk == n.dv) {
    switch (n.dk) {
      case 16: fn(std::integral_constant<int, 16>{}); return;
      case 32: fn(std::integral_constant<int, 32>{}); return;
      case 64: fn(std::integral_constant<int, 64>{}); return;
      default: break;
    }
  }
  fn(std::integral_constant<int, 0>{});
}

template <typename Scratch, typename Fn>
void for_each_task(const Dims& n, Fn fn) {
  at::parallel_for(0, static_cast<int64_t>(n.B) * n.H, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t bh = begin; bh < end; ++bh) fn(static_cast<int>(bh), scratch);
  });
}

}  // namespace

template <typename S> void lt_forward(const DeltaFwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<ForwardScratch<S>>(a.n, [&](int bh, ForwardScratch<S>& s) {
      delta_forward_task<S, false, decltype(D)::value>(a, bh, s);
    });
  });
}
template <typename S> void delta_forward(const DeltaFwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<ForwardScratch<S>>(a.n, [&](int bh, ForwardScratch<S>& s) {
      delta_forward_task<S, true, decltype(D)::value>(a, bh, s);
    });
  });
}
template <typename S> void lt_backward(const DeltaBwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<LtScratch<S>>(a.n, [&](int bh, LtScratch<S>& s) {
      lt_backward_task<S, decltype(D)::value>(a, bh, s);
    });
  });
}
template <typename S> void delta_backward(const DeltaBwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<DeltaScratch<S>>(a.n, [&](int bh, DeltaScratch<S>& s) {
      delta_backward_task<S, decltype(D)::value>(a, bh, s);
    });
  });
}
template <typename S> void delta_rnn_forward(const DeltaRnnFwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<ForwardScratch<S>>(a.n, [&](int bh, ForwardScratch<S>& s) {
      delta_rnn_forward_task<S, decltype(D)::value>(a, bh, s);
    });
  });
}
template <typename S> void delta_rnn_backward(const DeltaRnnBwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<DeltaRnnScratch<S>>(a.n, [&](int bh, DeltaRnnScratch<S>& s) {
      delta_rnn_backward_task<S, decltype(D)::value>(a, bh, s);
    });
  });
}
template <typename S> void rdn_forward(const RdnFwdArgs<S>& a) {
  const int H = a.n.H, d = a.n.dv;
  const size_t mat = static_cast<size_t>(d) * d;
  AlignedVector<S> RT(static_cast<size_t>(H) * 3 * mat);   // transposed Rq, Rk, Rv per head
  for (int h = 0; h < H; ++h) {
    transpose(a.Rq + h * mat, d, d, RT.data() + (3 * h + 0) * mat);
    transpose(a.Rk + h * mat, d, d, RT.data() + (3 * h + 1) * mat);
    transpose(a.Rv + h * mat, d, d, RT.data() + (3 * h + 2) * mat);
  }
  with_head_size(a.n, [&](auto D) {
    for_each_task<ForwardScratch<S>>(a.n, [&](int bh, ForwardScratch<S>& s) {
      rdn_forward_task<S, decltype(D)::value>(a, RT.data(), bh, s);
    });
  });
}
template <typename S> void rdn_backward(const RdnBwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<RdnScratch<S>>(a.n, [&](int bh, RdnScratch<S>& s) {
      rdn_backward_task<S, decltype(D)::value>(a, bh, s);
    });
  });
  // slow-weight gradients: sum the per-(b, h) partials over b in a fixed order
  const int B = a.n.B, H = a.n.H, d = a.n.dv;
  const size_t mat = static_cast<size_t>(d) * d;
  at::parallel_for(0, static_cast<int64_t>(H) * 4, 1, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      const int h = static_cast<int>(job / 4), m = static_cast<int>(job % 4);
      if (m == 0) sum_over_batch(a.gRq_part, a.gRq, B, H, mat, h);
      else if (m == 1) sum_over_batch(a.gRk_part, a.gRk, B, H, mat, h);
      else if (m == 2) sum_over_batch(a.gRv_part, a.gRv, B, H, mat, h);
      else sum_over_batch(a.grb_part, a.grb, B, H, static_cast<size_t>(d), h);
    }
  });
}

template <typename S> void product_forward(const ProductFwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<AlignedVector<S>>(a.n, [&](int bh, AlignedVector<S>& W) {
      product_forward_task<S, decltype(D)::value>(a, bh, W);
    });
  });
}
template <typename S> void product_backward(const ProductBwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<ProductScratch<S>>(a.n, [&](int bh, ProductScratch<S>& s) {
      product_backward_task<S, decltype(D)::value>(a, bh, s);
    });
  });
}
template <typename S> void srwm_forward(const SrwmFwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<SrwmScratch<S>>(a.n, [&](int bh, SrwmScratch<S>& s) {
      srwm_forward_task<S, decltype(D)::value>(a, bh, s);
    });
  });
}
template <typename S> void srwm_backward(const SrwmBwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_task<SrwmScratch<S>>(a.n, [&](int bh, SrwmScratch<S>& s) {
      srwm_backward_task<S, decltype(D)::value>(a, bh, s);
    });
  });
  // slow-weight gradients: sum the per-(b, h) partials over b in a fixed order
  const size_t mat = static_cast<size_t>(srwm_rows(a.n.dv)) * a.n.dv;
  if (a.n.B == 0) {
    zero_n(a.gWinit, static_cast<size_t>(a.n.H) * mat);
    return;
  }
  at::parallel_for(0, a.n.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h)
      sum_over_batch(a.gWinit_part, a.gWinit, a.n.B, a.n.H, mat, static_cast<int>(h));
  });
}

// fwm: one task per group of W (b, h) pairs (the vector lanes, cpu/fwm_impl.h)
template <typename S, typename Scratch, typename Fn>
void for_each_group(const Dims& n, Fn fn) {
  const int64_t groups = (static_cast<int64_t>(n.B) * n.H + kLanes<S> - 1) / kLanes<S>;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t g = begin; g < end; ++g) fn(static_cast<int>(g), scratch);
  });
}

template <typename S> int fwm_lanes() { return kLanes<S>; }
template <typename S> void fwm_forward(const FwmFwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_group<S, FwmForwardScratch<S>>(a.n, [&](int g, FwmForwardScratch<S>& s) {
      fwm_forward_group<S, decltype(D)::value>(a, g, s);
    });
  });
}
template <typename S> void fwm_backward(const FwmBwdArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_group<S, FwmBackwardScratch<S>>(a.n, [&](int g, FwmBackwardScratch<S>& s) {
      fwm_backward_group<S, decltype(D)::value>(a, g, s);
    });
  });
}
template <typename S> void fwm_step_init(const FwmStepArgs<S>& a, const S* F0) {
  for_each_group<S, AlignedVector<S>>(a.n, [&](int g, AlignedVector<S>& pad) {
    fwm_step_init_group(a, F0, g, pad);
  });
}
template <typename S> void fwm_step(const FwmStepArgs<S>& a) {
  with_head_size(a.n, [&](auto D) {
    for_each_group<S, AlignedVector<S>>(a.n, [&](int g, AlignedVector<S>& work) {
      fwm_step_group<S, decltype(D)::value>(a, g, work);
    });
  });
}
template <typename S> void fwm_step_dense(const FwmStepArgs<S>& a, S* F) {
  with_head_size(a.n, [&](auto D) {
    for_each_group<S, AlignedVector<S>>(a.n, [&](int g, AlignedVector<S>& work) {
      fwm_step_dense_group<S, decltype(D)::value>(a, g, F, work);
    });
  });
}

namespace {

// The per-entry arguments of selective_scan_impl.h (D = dv channels, N = dk state values).
template <typename S>
SelectiveScanArgs<S> scan_args(const Dims& n, const S* u, const S* delta, const S* A, const S* Bm, const S* C,
                               const uint8_t* reset) {
  SelectiveScanArgs<S> s;
  s.T = n.T;
  s.B = n.B;
  s.D = n.dv;
  s.N = n.dk;
  s.chunk = n.chunk;
  s.u = u;
  s.delta = delta;
  s.A = A;
  s.Bm = Bm;
  s.C = C;
  s.reset = reset;
  return s;
}

}  // namespace

template <typename S> void mamba_forward(const MambaFwdArgs<S>& a) {
  SelectiveScanArgs<S> s = scan_args(a.n, a.u, a.delta, a.A, a.Bm, a.C, a.reset);
  s.h0 = a.h0;
  s.y = a.y;
  s.hT = a.hT;
  s.ckpt = a.n.chunk > 0 ? a.ckpt : nullptr;
  const int64_t DN = static_cast<int64_t>(a.n.dv) * a.n.dk;
  at::parallel_for(0, a.n.B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<S> h(static_cast<size_t>(DN));
    for (int64_t b = b0; b < b1; ++b) selective_scan_forward_entry<S>(s, static_cast<int>(b), h.data());
  });
}

template <typename S> void mamba_backward(const MambaBwdArgs<S>& a) {
  SelectiveScanArgs<S> s = scan_args(a.n, a.u, a.delta, a.A, a.Bm, a.C, a.reset);
  s.ckpt = const_cast<S*>(a.ckpt);
  s.gy = a.gy;
  s.ghT = a.ghT;
  s.gu = a.gu;
  s.gdelta = a.gdelta;
  s.gA_part = a.gA_part;
  s.gB = a.gB;
  s.gC = a.gC;
  s.gh0 = a.gh0;
  const int64_t DN = static_cast<int64_t>(a.n.dv) * a.n.dk;
  const int64_t rows = std::min(a.n.T, a.n.chunk) + 1;
  at::parallel_for(0, a.n.B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<S> hs(static_cast<size_t>(rows * DN)), g(static_cast<size_t>(DN));
    for (int64_t b = b0; b < b1; ++b)
      selective_scan_backward_entry<S>(s, static_cast<int>(b), hs.data(), g.data());
  });
  // the entries' partial sums in a fixed order, whatever the thread count
  at::parallel_for(0, DN, 1024, [&](int64_t i0, int64_t i1) {
    std::fill(a.gA + i0, a.gA + i1, S(0));
    for (int64_t b = 0; b < a.n.B; ++b)
      for (int64_t i = i0; i < i1; ++i) a.gA[i] += a.gA_part[b * DN + i];
  });
}

#define RFWP_INSTANTIATE(S)                                          \
  template void lt_forward<S>(const DeltaFwdArgs<S>&);               \
  template void lt_backward<S>(const DeltaBwdArgs<S>&);              \
  template void delta_forward<S>(const DeltaFwdArgs<S>&);            \
  template void delta_backward<S>(const DeltaBwdArgs<S>&);           \
  template void delta_rnn_forward<S>(const DeltaRnnFwdArgs<S>&);     \
  template void delta_rnn_backward<S>(const DeltaRnnBwdArgs<S>&);    \
  template void rdn_forward<S>(const RdnFwdArgs<S>&);                \
  template void rdn_backward<S>(const RdnBwdArgs<S>&);                \
  template void product_forward<S>(const ProductFwdArgs<S>&);        \
  template void product_backward<S>(const ProductBwdArgs<S>&);       \
  template void srwm_forward<S>(const SrwmFwdArgs<S>&);              \
  template void srwm_backward<S>(const SrwmBwdArgs<S>&);             \
  template void fwm_forward<S>(const FwmFwdArgs<S>&);                \
  template void fwm_backward<S>(const FwmBwdArgs<S>&);               \
  template void fwm_step<S>(const FwmStepArgs<S>&);                   \
  template void fwm_step_init<S>(const FwmStepArgs<S>&, const S*);     \
  template void fwm_step_dense<S>(const FwmStepArgs<S>&, S*);          \
  template int fwm_lanes<S>();                                      \
  template void mamba_forward<S>(const MambaFwdArgs<S>&);            \
  template void mamba_backward<S>(const MambaBwdArgs<S>&);
RFWP_INSTANTIATE(float)
RFWP_INSTANTIATE(double)
#undef RFWP_INSTANTIATE

}  // namespace cpu
}  // namespace rfwp
