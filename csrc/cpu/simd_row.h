// A row of N scalars held in vector registers (GCC/Clang vector extensions, 32-byte vectors:
// AVX/AVX2 registers on x86, pairs of 16-byte registers elsewhere; the compiler picks the
// instructions for the target). Used by the fixed head sizes of the CPU kernels so that
// accumulators stay in registers across a whole pass over a matrix; other sizes use plain
// loops (fastweight_cpu_impl.h).
#pragma once

#include <cstddef>
#include <cstring>

#define RFWP_INLINE inline __attribute__((always_inline))

namespace rfwp {
namespace cpu {

constexpr int kVectorBytes = 32;

template <typename S>
struct VecType {
  static constexpr int lanes = kVectorBytes / static_cast<int>(sizeof(S));
  typedef S type __attribute__((vector_size(kVectorBytes), aligned(sizeof(S))));
};

template <typename S, int N>
RFWP_INLINE S tree_sum(const S* x) {
  if constexpr (N == 1) {
    return x[0];
  } else {
    S t[N / 2];
    for (int j = 0; j < N / 2; ++j) t[j] = x[j] + x[j + N / 2];
    return tree_sum<S, N / 2>(t);
  }
}

template <typename S, int N>
struct Row {
  using V = typename VecType<S>::type;
  static constexpr int W = VecType<S>::lanes;
  static constexpr int C = N / W;
  static_assert(N > 0 && N % W == 0, "row size must be a multiple of the vector width");
  V v[C];

  static RFWP_INLINE Row zero() {
    Row r;
    for (int c = 0; c < C; ++c) r.v[c] = V{};
    return r;
  }
  static RFWP_INLINE Row load(const S* p) {
    Row r;
    for (int c = 0; c < C; ++c) std::memcpy(&r.v[c], p + c * W, sizeof(V));   // one vector load each
    return r;
  }
  RFWP_INLINE void store(S* p) const {
    for (int c = 0; c < C; ++c) std::memcpy(p + c * W, &v[c], sizeof(V));
  }
  // this += a * x
  RFWP_INLINE Row& fma(S a, const Row& x) {
    for (int c = 0; c < C; ++c) v[c] += a * x.v[c];
    return *this;
  }
  RFWP_INLINE Row& operator+=(const Row& x) {
    for (int c = 0; c < C; ++c) v[c] += x.v[c];
    return *this;
  }
  RFWP_INLINE Row operator+(const Row& x) const {
    Row r = *this;
    r += x;
    return r;
  }
  RFWP_INLINE S dot(const Row& x) const {
    V acc = v[0] * x.v[0];
    for (int c = 1; c < C; ++c) acc += v[c] * x.v[c];
    S t[W];
    std::memcpy(t, &acc, sizeof(acc));
    return tree_sum<S, W>(t);
  }
};

// dst [cols][rows] = transpose of src [rows][cols], in L x L tiles (L = vector lanes) moved
// with vector shuffles; the edges that do not fill a tile go element by element.
template <typename S>
inline void transpose(const S* __restrict__ src, int rows, int cols, S* __restrict__ dst) {
  using V = typename VecType<S>::type;
  constexpr int L = VecType<S>::lanes;
  int r0 = 0, c0 = 0;
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
  static_assert(L == 8 || L == 4, "tile transpose for 8 floats or 4 doubles");
  const int rt = rows - rows % L, ct = cols - cols % L;
  for (int bi = 0; bi < rt; bi += L) {
    for (int bj = 0; bj < ct; bj += L) {
      V r[L], o[L];
      for (int i = 0; i < L; ++i) std::memcpy(&r[i], src + static_cast<std::size_t>(bi + i) * cols + bj, sizeof(V));
      if constexpr (L == 8) {
        V t[8], s[8];
        for (int p = 0; p < 4; ++p) {
          t[2 * p] = __builtin_shufflevector(r[2 * p], r[2 * p + 1], 0, 8, 1, 9, 4, 12, 5, 13);
          t[2 * p + 1] = __builtin_shufflevector(r[2 * p], r[2 * p + 1], 2, 10, 3, 11, 6, 14, 7, 15);
        }
        for (int p = 0; p < 2; ++p) {
          s[4 * p + 0] = __builtin_shufflevector(t[4 * p], t[4 * p + 2], 0, 1, 8, 9, 4, 5, 12, 13);
          s[4 * p + 1] = __builtin_shufflevector(t[4 * p], t[4 * p + 2], 2, 3, 10, 11, 6, 7, 14, 15);
          s[4 * p + 2] = __builtin_shufflevector(t[4 * p + 1], t[4 * p + 3], 0, 1, 8, 9, 4, 5, 12, 13);
          s[4 * p + 3] = __builtin_shufflevector(t[4 * p + 1], t[4 * p + 3], 2, 3, 10, 11, 6, 7, 14, 15);
        }
        for (int p = 0; p < 4; ++p) {
          o[p] = __builtin_shufflevector(s[p], s[p + 4], 0, 1, 2, 3, 8, 9, 10, 11);
          o[p + 4] = __builtin_shufflevector(s[p], s[p + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        }
      } else {
        const V t0 = __builtin_shufflevector(r[0], r[1], 0, 4, 2, 6);
        const V t1 = __builtin_shufflevector(r[0], r[1], 1, 5, 3, 7);
        const V t2 = __builtin_shufflevector(r[2], r[3], 0, 4, 2, 6);
        const V t3 = __builtin_shufflevector(r[2], r[3], 1, 5, 3, 7);
        o[0] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
        o[1] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
        o[2] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
        o[3] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
      }
      for (int j = 0; j < L; ++j) std::memcpy(dst + static_cast<std::size_t>(bj + j) * rows + bi, &o[j], sizeof(V));
    }
  }
  r0 = rt;
  c0 = ct;
#endif
  // the right edge (columns >= c0, all rows) and the bottom edge (rows >= r0, tiled columns)
  for (int i = 0; i < rows; ++i)
    for (int j = c0; j < cols; ++j) dst[static_cast<std::size_t>(j) * rows + i] = src[static_cast<std::size_t>(i) * cols + j];
  for (int i = r0; i < rows; ++i)
    for (int j = 0; j < c0; ++j) dst[static_cast<std::size_t>(j) * rows + i] = src[static_cast<std::size_t>(i) * cols + j];
}

}  // namespace cpu
}  // namespace rfwp
