// exp, tanh, softmax and sigmoid written with arithmetic and bit operations only (no libm
// call in the loop body), so that `#pragma omp simd` loops over them vectorise: the fused CPU
// forward of rdn and delta_rnn evaluates about a hundred of them per step and head.
//
// exp: Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2), Taylor polynomial of e^r (degree 7
// for float, 13 for double: truncation below 1e-8 / 1e-17 relative), scaling by 2^n in two
// halves so that every finite result (including subnormal ones) is formed without overflow;
// overflow gives +inf, x below the smallest subnormal's log gives 0, NaN propagates.
// tanh: odd Taylor series for |x| < 0.2 (ratio of consecutive terms < 0.017), else
// 1 - 2 / (exp(2|x|) + 1) (at most a few ulp lost to cancellation at |x| = 0.2).
// Accuracy against torch is tested (tests/test_kernels.py): a few ulp.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "simd_row.h"

namespace rfwp {
namespace cpu {

template <typename S>
struct FloatBits;

template <>
struct FloatBits<float> {
  using I = int32_t;
  using U = uint32_t;
  static constexpr int mant = 23, bias = 127;
  static constexpr float magic = 12582912.0f;            // 1.5 * 2^23
  static constexpr I magic_bits = 0x4B400000;
  static constexpr float log2e = 1.44269504088896341f;
  static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  static constexpr float hi = 88.7228394f;                 // log(FLT_MAX)
  static constexpr float lo = -103.972084f;                // log(2^-150)
  static constexpr int degree = 7;
  static constexpr float tanh_cut = 0.2f;
  static constexpr int tanh_terms = 6;                     // x .. x^11
};

template <>
struct FloatBits<double> {
  using I = int64_t;
  using U = uint64_t;
  static constexpr int mant = 52, bias = 1023;
  static constexpr double magic = 6755399441055744.0;     // 1.5 * 2^52
  static constexpr I magic_bits = 0x4338000000000000LL;
  static constexpr double log2e = 1.44269504088896340736;
  static constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  static constexpr double hi = 709.782712893383973;        // log(DBL_MAX)
  static constexpr double lo = -745.133219101941108;       // log(2^-1075)
  static constexpr int degree = 13;
  static constexpr double tanh_cut = 0.2;
  static constexpr int tanh_terms = 10;                    // x .. x^19
};

// Taylor coefficients of tanh: x^(2k+1) for k = 0..9.
constexpr double kTanhTaylor[10] = {
    1.0, -1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0, 62.0 / 2835.0, -1382.0 / 155925.0,
    21844.0 / 6081075.0, -929569.0 / 638512875.0, 6404582.0 / 10854718875.0,
    -443861162.0 / 1856156927625.0};

constexpr double kInverse[14] = {0.0, 1.0, 1.0 / 2, 1.0 / 3, 1.0 / 4, 1.0 / 5, 1.0 / 6, 1.0 / 7,
                                 1.0 / 8, 1.0 / 9, 1.0 / 10, 1.0 / 11, 1.0 / 12, 1.0 / 13};

template <typename S>
RFWP_INLINE S pow2_from_bits(typename FloatBits<S>::I n) {
  using F = FloatBits<S>;
  const typename F::U bits = static_cast<typename F::U>(n + F::bias) << F::mant;
  S s;
  std::memcpy(&s, &bits, sizeof s);
  return s;
}

template <typename S>
RFWP_INLINE S vexp(S x) {
  using F = FloatBits<S>;
  using I = typename F::I;
  const S xc = x < F::lo ? F::lo : (x > F::hi ? F::hi : x);
  const S t = xc * F::log2e + F::magic;                   // n in the low mantissa bits
  I ti;
  std::memcpy(&ti, &t, sizeof ti);
  const I n = ti - F::magic_bits;
  const S nf = t - F::magic;
  const S r = (xc - nf * F::ln2_hi) - nf * F::ln2_lo;
  S p = S(1);
  for (int k = F::degree; k >= 1; --k) p = S(1) + p * (r * S(kInverse[k]));   // Σ r^k / k!
  const I n1 = n >> 1;
  S y = p * pow2_from_bits<S>(n1) * pow2_from_bits<S>(n - n1);
  y = x > F::hi ? std::numeric_limits<S>::infinity() : y;
  y = x < F::lo ? S(0) : y;
  return y;
}

template <typename S>
RFWP_INLINE S vtanh(S x) {
  using F = FloatBits<S>;
  const S a = x < S(0) ? -x : x;
  const S z = a * a;
  S p = S(kTanhTaylor[F::tanh_terms - 1]);
  for (int k = F::tanh_terms - 2; k >= 0; --k) p = p * z + S(kTanhTaylor[k]);
  const S small = a * p;
  const S large = S(1) - S(2) / (vexp(S(2) * a) + S(1));
  const S r = a < F::tanh_cut ? small : large;
  return x < S(0) ? -r : r;
}

template <typename S>
RFWP_INLINE S vsigmoid(S x) {
  return S(1) / (S(1) + vexp(-x));
}

// out[j] = f(x[j]) for j < n, vectorised. N > 0: n == N, known at compile time.
template <typename S>
inline void vexp_n(const S* __restrict__ x, S* __restrict__ out, int n) {
#pragma omp simd
  for (int j = 0; j < n; ++j) out[j] = vexp(x[j]);
}
template <typename S, int N = 0>
inline void vtanh_n(const S* __restrict__ x, S* __restrict__ out, int n) {
  const int m = N > 0 ? N : n;
#pragma omp simd
  for (int j = 0; j < m; ++j) out[j] = vtanh(x[j]);
}

// out = softmax(x) over n entries (max-subtracted), vectorised. N > 0: n == N.
template <typename S, int N = 0>
inline void vsoftmax(const S* __restrict__ x, S* __restrict__ out, int n) {
  const int len = N > 0 ? N : n;
  S m = x[0];
  // from j = 0: vector loads at x (a load from x + 1 would straddle the vectors just stored)
#pragma omp simd reduction(max : m)
  for (int j = 0; j < len; ++j) m = x[j] > m ? x[j] : m;
  S z = 0;
#pragma omp simd reduction(+ : z)
  for (int j = 0; j < len; ++j) {
    out[j] = vexp(x[j] - m);
    z += out[j];
  }
  const S inv = S(1) / z;
#pragma omp simd
  for (int j = 0; j < len; ++j) out[j] *= inv;
}

}  // namespace cpu
}  // namespace rfwp
