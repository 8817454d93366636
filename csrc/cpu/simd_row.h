// A row of N scalars held in vector registers (GCC/Clang vector extensions). The vectors are
// 64 bytes wide where the target has AVX-512 (one zmm register: 16 floats or 8 doubles) and
// 32 bytes otherwise (AVX/AVX2 registers on x86, pairs of 16-byte registers elsewhere); the
// compiler picks the instructions for the target. Used by the fixed head sizes of the CPU
// kernels so that accumulators stay in registers across a whole pass over a matrix; other
// sizes use plain loops (fastweight_cpu_impl.h).
//
// Loads and stores go through a may_alias vector type with element alignment: one unaligned
// vector move each (a memcpy of a 64-byte vector is split into two 32-byte moves through the
// stack by GCC when it prefers 256-bit vectors, as -march=native does on AVX-512 machines).
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#define RFWP_INLINE inline __attribute__((always_inline))

#ifndef RFWP_HAVE_SHUFFLEVECTOR   // -DRFWP_HAVE_SHUFFLEVECTOR=0 builds the scalar fallbacks
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define RFWP_HAVE_SHUFFLEVECTOR 1
#else
#define RFWP_HAVE_SHUFFLEVECTOR 0
#endif
#endif

namespace rfwp {
namespace cpu {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#else
constexpr int kVectorBytes = 32;
#endif

// Scratch buffers start on a cache line (std::vector's default allocator gives 16 bytes): a
// vector row of a misaligned buffer straddles two lines, and every load and store of it is
// split in two.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

template <typename S, int Bytes = kVectorBytes>
struct VecType {
  static constexpr int lanes = Bytes / static_cast<int>(sizeof(S));
  typedef S type __attribute__((vector_size(Bytes), aligned(sizeof(S))));
  // the same vector at any element-aligned address: one unaligned vector move
  typedef S unaligned __attribute__((vector_size(Bytes), aligned(sizeof(S)), may_alias));
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

// ------------------------------------------------------------ sums of the lanes of vectors

#if RFWP_HAVE_SHUFFLEVECTOR
// Lane `lane` of the first (HI false) or second (HI true) operand of one level of the
// transpose-add tree below: within every block of 2s lanes, the low/high s lanes of a and b.
template <int L, int s, bool HI>
constexpr int tree_pick(int lane) {
  const int blk = lane / s, off = lane % s;
  const int src = (2 * (blk / 2) + (HI ? 1 : 0)) * s + off;
  return (blk % 2) ? L + src : src;
}
template <typename V, int L, int s, bool HI, int... I>
RFWP_INLINE V tree_shuffle(V a, V b, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(a, b, tree_pick<L, s, HI>(I)...);
}
// Halves the number of vectors: p[i] <- pairwise sums of p[i] and p[i + n/2] at block size s.
template <typename V, int L, int n, int s>
RFWP_INLINE void tree_level(V* p) {
  using Seq = std::make_integer_sequence<int, L>;
  for (int i = 0; i < n / 2; ++i)
    p[i] = tree_shuffle<V, L, s, false>(p[i], p[i + n / 2], Seq{}) +
           tree_shuffle<V, L, s, true>(p[i], p[i + n / 2], Seq{});
  if constexpr (s > 1) tree_level<V, L, n / 2, s / 2>(p);
}
#endif

// Returns the vector whose lane i is the sum of the lanes of p[i], for L = lanes vectors
// (p is overwritten). log2(L) levels of two shuffles and one add per vector pair instead of
// one horizontal reduction per vector.
template <typename S, typename V, int L>
RFWP_INLINE V sum_lanes(V* p) {
#if RFWP_HAVE_SHUFFLEVECTOR
  if constexpr (L == 1) {
    return p[0];
  } else {
    tree_level<V, L, L, L / 2>(p);
    return p[0];
  }
#else
  V r;
  for (int i = 0; i < L; ++i) {
    S t[L];
    std::memcpy(t, &p[i], sizeof(V));
    r[i] = tree_sum<S, L>(t);
  }
  return r;
#endif
}

#if RFWP_HAVE_SHUFFLEVECTOR
template <int L, int s>
constexpr int rotate_pick(int lane) { return (lane + s) % L; }
template <typename V, int L, int s, int... I>
RFWP_INLINE V rotate_lanes(V a, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(a, a, rotate_pick<L, s>(I)...);
}
template <typename V, int L, int s, typename Op>
RFWP_INLINE V rotate_tree(V a, Op op) {
  a = op(a, rotate_lanes<V, L, s>(a, std::make_integer_sequence<int, L>{}));
  if constexpr (s > 1) return rotate_tree<V, L, s / 2>(a, op);
  else return a;
}
#endif

// op (associative, commutative) over the L lanes of a: log2(L) rotations and ops.
template <typename S, typename V, int L, typename Op>
RFWP_INLINE S lane_reduce(V a, Op op) {
#if RFWP_HAVE_SHUFFLEVECTOR
  if constexpr (L == 1) return a[0];
  else return rotate_tree<V, L, L / 2>(a, op)[0];
#else
  V r = a;
  for (int i = 1; i < L; ++i) {
    V b = V{} + a[i];
    r = op(r, b);
  }
  return r[0];
#endif
}

template <typename S, int N>
struct Row {
  using V = typename VecType<S>::type;
  using U = typename VecType<S>::unaligned;
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
    for (int c = 0; c < C; ++c) r.v[c] = *reinterpret_cast<const U*>(p + c * W);
    return r;
  }
  RFWP_INLINE void store(S* p) const {
    for (int c = 0; c < C; ++c) *reinterpret_cast<U*>(p + c * W) = v[c];
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
  RFWP_INLINE Row operator-(const Row& x) const {
    Row r;
    for (int c = 0; c < C; ++c) r.v[c] = v[c] - x.v[c];
    return r;
  }
  RFWP_INLINE Row operator*(const Row& x) const {
    Row r;
    for (int c = 0; c < C; ++c) r.v[c] = v[c] * x.v[c];
    return r;
  }
  RFWP_INLINE Row operator*(S a) const {
    Row r;
    for (int c = 0; c < C; ++c) r.v[c] = a * v[c];
    return r;
  }
  // the elementwise products with x, summed over the C vectors (one vector of partial sums)
  RFWP_INLINE V partial_dot(const Row& x) const {
    V acc = v[0] * x.v[0];
    for (int c = 1; c < C; ++c) acc += v[c] * x.v[c];
    return acc;
  }
  RFWP_INLINE S dot(const Row& x) const {
    return lane_reduce<S, V, W>(partial_dot(x), [](V a, V b) { return a + b; });
  }
};

// r[i] = p[i] . x for the N rows p[0..N-1] of a row-major N x N matrix, with the row sums
// taken W rows at a time (sum_lanes).
template <typename S, int N>
RFWP_INLINE Row<S, N> row_dots(const S* __restrict__ p, const Row<S, N>& x) {
  using R = Row<S, N>;
  using V = typename R::V;
  constexpr int W = R::W;
  R r;
  for (int blk = 0; blk < R::C; ++blk) {
    V part[W];
    for (int i = 0; i < W; ++i) part[i] = R::load(p + (blk * W + i) * N).partial_dot(x);
    r.v[blk] = sum_lanes<S, V, W>(part);
  }
  return r;
}

// dst [cols][rows] = transpose of src [rows][cols], in L x L tiles (L = lanes of a 32-byte
// vector) moved with vector shuffles; the edges that do not fill a tile go element by element.
template <typename S>
inline void transpose(const S* __restrict__ src, int rows, int cols, S* __restrict__ dst) {
  using V = typename VecType<S, 32>::type;
  constexpr int L = VecType<S, 32>::lanes;
  int r0 = 0, c0 = 0;
#if RFWP_HAVE_SHUFFLEVECTOR
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
