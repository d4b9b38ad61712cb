// The CPU kernel of the torch path's non-causal linear attention (torch_linear.py; built by cpu_kernel.py): one call
// per forward and one per backward. Each walks every (batch, head) slice in two phases: the state (S = phi(k)^T v,
// z = sum phi(k)), then the output (or, backward: the query gradients with dS, dz, then the key / value gradients).
// A phase cuts the slices' tokens into units (with few slices, 1-4 token ranges per thread in each slice, partial
// sums added in a fixed order) that `threads` threads claim one at a time: ATen's OpenMP threads, the ones torch's
// own ops run on (one region per phase), or, in a child of fork, a pool of the kernel's own.
// A unit walks its tokens in blocks of rows small enough to stay in the core's L2: the feature map, the normaliser
// and the element-wise work fused into row loops over the block (1 / den folded into the feature rows, so that the
// products write the results directly), the (block x d x d) products in register tiles where the build targets
// AVX-512 or AVX2 with FMA, else handed straight to BLAS (the sgemm_ of the MKL that ATen links, else ATen's mm).
// The rows a block's products read next are prefetched during its feature loops (`prefetch_row`), and outputs of
// 2 MiB or more (out, dq, dk, dv) are written with non-temporal stores (`streamed`).
// Inputs are (B, H, N, D) with unit column stride and any other strides (timm's packed qkv views); float32, or float64
// for gradcheck. phi'(x) is read off f = phi(x): elu+1 -> min(f, 1) (f = exp(x) <= 1 for x <= 0, x + 1 > 1 above),
// relu -> [f > 0], identity (features computed by the caller) -> 1. Built with -fno-trapping-math so that the
// branch-free row loops vectorise; float32 elu+1 rows take a vector form of the same exp where the build targets
// AVX-512 or AVX2.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <climits>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <sys/mman.h>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

extern "C" {  // from the MKL that ATen links, when it has one (weak: null otherwise; both, or neither is used)
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));  // mkl_service.h's mkl_set_num_threads_local
}

namespace {

enum Map : int64_t { kElu = 0, kRelu = 1, kIdentity = 2 };  // the order of cpu_kernel.CPU_KERNEL_MAPS

// exp(x) for x <= 0 without a libm call: x = n ln2 + r (Cody-Waite: ln2 in two parts), exp(r) = 1 + r + r^2 P(r) with
// P of degree 4 fitted to exp's relative error on [-ln2/2, ln2/2] (4e-9; through fp32's roundings the result is within
// 8.1e-8 of float64's exp). 2^n is applied as two normal factors, so that below fp32's normal range (x < -87.3) the
// result is the rounded subnormal, as expf's is, and 0 below -104.
constexpr float kExpPoly[5] = {1.3752237427979708e-3f, 8.369117975234985e-3f, 4.1669536381959915e-2f,
                               1.6666516661643982e-1f, 4.9999988079071045e-1f};  // P's, from the highest power
inline float pow2(float n) {  // 2^n for an integer n in [-126, 127]
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}
inline float exp_nonpositive(float x) {
  x = std::max(x, -104.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);  // in [-150, 0]
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = kExpPoly[0];
  for (int c = 1; c < 5; ++c) p = p * r + kExpPoly[c];
  p = p * r * r + r + 1.0f;
  const float high = std::max(n, -125.0f);  // p 2^high is normal; one rounding, in the last product
  return p * pow2(high) * pow2(n - high);
}
inline double exp_nonpositive(double x) { return std::exp(x); }

template <Map M, typename T>
inline T phi(T x) {
  if constexpr (M == kElu) return exp_nonpositive(std::min(x, T(0))) + std::max(x, T(0));
  else if constexpr (M == kRelu) return std::max(x, T(0));
  else return x;
}

template <Map M, typename T>
inline T dphi(T f) {
  if constexpr (M == kElu) return std::min(f, T(1));
  else if constexpr (M == kRelu) return T(f > T(0));
  else return T(1);
}

// fr = phi(xr) for one row of `width` features.
template <Map M, typename T>
inline void phi_row(const T* __restrict xr, T* __restrict fr, int64_t width) {
#pragma omp simd
  for (int64_t i = 0; i < width; ++i) fr[i] = phi<M>(xr[i]);
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define VITZOO_SIMD 1
#if defined(__AVX512F__)
// The lanes of 16 that hold channels when `left` remain.
inline __mmask16 lanes(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// One vector of float32 lanes, 16 here (AVX-512), 8 below (AVX2): what the exp, the elu+1 rows and the register tiles
// are written in. Masked loads zero the lanes they leave out; min / max return their second operand where one is NaN.
struct Simd {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16, kRows = 6, kVectors = 4;  // tiles: 6 x 4 accumulators, 4 of B, 1 broadcast
  static Mask first(int64_t n) { return lanes(n); }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static void store(float* p, Mask m, V x) { _mm512_mask_storeu_ps(p, m, x); }
  static void stream(float* p, V x) { _mm512_stream_ps(p, x); }  // p 64-byte aligned
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  // The integer n nearest x c, and in `e` what scale() takes for 2^n (here n itself).
  using Exponent = V;
  static V nearest(V x, float c, Exponent& e) {
    e = _mm512_roundscale_ps(mul(x, set1(c)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return e;
  }
  // p 2^n for integral n in [-150, 0]: one rounding, to the subnormal below fp32's normal range
  static V scale(V p, Exponent n) { return _mm512_scalef_ps(p, n); }
};
#else
struct Simd {
  using V = __m256;
  using Mask = __m256i;
  static constexpr int kLanes = 8, kRows = 6, kVectors = 2;  // tiles: 6 x 2 accumulators, 2 of B, 1 broadcast
  static Mask first(int64_t n) {
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(n, 8))), index);
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static void store(float* p, Mask m, V x) { _mm256_maskstore_ps(p, m, x); }
  static void stream(float* p, V x) { _mm256_stream_ps(p, x); }  // p 32-byte aligned
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  // The integer n nearest x c, and in `e` what scale() takes for 2^n: one fused x c + 1.5 2^23 + 64 leaves n + 64 in
  // the sum's low mantissa bits (|x c| < 2^21), and those shifted up to the exponent field are e = (n + 64) << 23.
  using Exponent = __m256i;
  static V nearest(V x, float c, Exponent& e) {
    const V shifter = set1(12582976.0f);  // 1.5 2^23 + 64
    const V t = fma(x, set1(c), shifter);
    e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    return _mm256_sub_ps(t, shifter);
  }
  // p 2^n for p in [0.7, 1.5) and n in [-150, 0]: n + 64 added to p's exponent (normal for all such n), then one
  // product with 2^-64, exact, or the one rounding to the subnormal below fp32's normal range
  static V scale(V p, Exponent e) {
    return mul(_mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e)), set1(0x1p-64f));
  }
};
#endif

// exp_nonpositive above on K vectors (the same reduction and polynomial), 2^n applied by Simd::scale. Each step is
// taken on all K before the next: K independent chains of dependent steps for the core to overlap.
template <int K>
inline void exp_nonpositive(Simd::V (&x)[K]) {
  Simd::Exponent e[K];
  Simd::V n[K], r[K], p[K];
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) {
    x[j] = Simd::max(x[j], Simd::set1(-104.0f));
    n[j] = Simd::nearest(x[j], 1.44269504088896341f, e[j]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) r[j] = Simd::fnmadd(n[j], Simd::set1(0.693359375f), x[j]);
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) r[j] = Simd::fma(n[j], Simd::set1(2.12194440e-4f), r[j]);
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) p[j] = Simd::set1(kExpPoly[0]);
#pragma GCC unroll 4
  for (int c = 1; c < 5; ++c) {
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) p[j] = Simd::fma(p[j], r[j], Simd::set1(kExpPoly[c]));
  }
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) p[j] = Simd::add(Simd::fma(p[j], Simd::mul(r[j], r[j]), r[j]), Simd::set1(1.0f));
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) x[j] = Simd::scale(p[j], e[j]);
}

// elu(x) + 1 = exp(min(x, 0)) + max(x, 0) on K vectors; min / max with x second: a NaN x comes through, as
// std::min(x, 0) gives it.
template <int K>
inline void elu_plus_one(Simd::V (&x)[K]) {
  const Simd::V zero = Simd::zero();
  Simd::V neg[K];
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) neg[j] = Simd::min(zero, x[j]);
  exp_nonpositive(neg);
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) x[j] = Simd::add(neg[j], Simd::max(zero, x[j]));
}
inline Simd::V elu_plus_one(Simd::V x) {
  Simd::V v[1] = {x};
  elu_plus_one(v);
  return v[0];
}

// Four vectors at a time, then one, then a ragged tail through a mask (AVX2's masked stores cost far more than plain
// ones on AMD cores).
template <>
inline void phi_row<kElu, float>(const float* __restrict xr, float* __restrict fr, int64_t width) {
  constexpr int64_t L = Simd::kLanes;
  int64_t i = 0;
  for (; i + 4 * L <= width; i += 4 * L) {
    Simd::V v[4] = {Simd::load(xr + i), Simd::load(xr + i + L), Simd::load(xr + i + 2 * L), Simd::load(xr + i + 3 * L)};
    elu_plus_one(v);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) Simd::store(fr + i + j * L, v[j]);
  }
  for (; i + L <= width; i += L) Simd::store(fr + i, elu_plus_one(Simd::load(xr + i)));
  if (i < width) {
    const Simd::Mask m = Simd::first(width - i);
    Simd::store(fr + i, m, elu_plus_one(Simd::load(xr + i, m)));
  }
}
#endif

#if defined(__AVX512F__)
// phi and phi'(f) on 16 lanes, NaN kept as std::min / std::max keep it (the NaN operand second).
template <Map M>
inline __m512 phi16(__m512 x) {
  const __m512 zero = _mm512_setzero_ps();
  if constexpr (M == kElu) return elu_plus_one(x);
  else if constexpr (M == kRelu) return _mm512_max_ps(zero, x);
  else return x;
}
template <Map M>
inline __m512 dphi16(__m512 f) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  if constexpr (M == kElu) return _mm512_min_ps(one, f);
  else if constexpr (M == kRelu) return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(f, zero, _CMP_GT_OQ), one);
  else return one;
}
#endif

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

#if defined(__AVX512F__)
// 16 lanes at a time, the last ones masked: no scalar tail (a row is 32-64 channels, so the tail code of the loop
// above costs as much as its body)
template <>
inline float dot<float>(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
#endif

inline bool has_mkl() { return sgemm_ != nullptr && MKL_Set_Num_Threads_Local != nullptr; }

// How a product stores C: over it, added to it, or streamed past the caches (non-temporal stores: an output the kernel
// does not read again, too large to stay cached, costs no read of its old lines and evicts none of the inputs).
enum class Store { kWrite, kAdd, kStream };

#if defined(VITZOO_SIMD)
// C (MR x NV vectors, row stride ldc) = (kAdd: C +) sum_k A(i, k) B(k, :) for float32,
// A(i, k) = a[i ars + k acs], B's row k at b + k ldb, `tail` the columns of the last vector that exist (1..kLanes):
// MR x NV accumulators in registers, B's rows loaded once per k, A broadcast from memory. Only a last vector with
// fewer than kLanes columns is loaded and stored through a mask (AVX2's masked stores cost far more than plain ones
// on AMD cores); kStream streams the vectors that are aligned.
template <int MR, int NV>
void tile(int64_t kdim, const float* __restrict a, int64_t ars, int64_t acs, const float* __restrict b, int64_t ldb,
          float* __restrict c, int64_t ldc, int64_t tail, Store store) {
  constexpr int L = Simd::kLanes;
  const Simd::Mask last = Simd::first(tail);
  const bool ragged = tail < L;
  // fully unrolled, so that the accumulators live in registers (GCC spills a partly unrolled array every k)
  Simd::V acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = Simd::zero();
  const float* ak = a;
  const float* bk = b;
  for (int64_t k = 0; k < kdim; ++k, ak += acs, bk += ldb) {
    Simd::V bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = j == NV - 1 && ragged ? Simd::load(bk + L * j, last) : Simd::load(bk + L * j);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const Simd::V ai = Simd::set1(ak[i * ars]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = Simd::fma(ai, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      float* ci = c + i * ldc + L * j;
      if (j == NV - 1 && ragged) {
        Simd::store(ci, last, store == Store::kAdd ? Simd::add(acc[i][j], Simd::load(ci, last)) : acc[i][j]);
      } else if (store == Store::kAdd) {
        Simd::store(ci, Simd::add(acc[i][j], Simd::load(ci)));
      } else if (store == Store::kStream && reinterpret_cast<uintptr_t>(ci) % sizeof(Simd::V) == 0) {
        Simd::stream(ci, acc[i][j]);
      } else {
        Simd::store(ci, acc[i][j]);
      }
    }
}

using Tile = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t, Store);
template <int MR, size_t... NV>
constexpr std::array<Tile, sizeof...(NV)> tiles_of(std::index_sequence<NV...>) {
  return {tile<MR, int(NV) + 1>...};
}
template <size_t... MR>
constexpr std::array<std::array<Tile, Simd::kVectors>, sizeof...(MR)> all_tiles(std::index_sequence<MR...>) {
  return {tiles_of<int(MR) + 1>(std::make_index_sequence<Simd::kVectors>{})...};
}
constexpr auto kTiles = all_tiles(std::make_index_sequence<Simd::kRows>{});

// C (m x n) = (kAdd: C +) op(A) B in tiles of kRows rows x kVectors vectors: no packing, no separate beta pass,
// none of a BLAS call's fixed cost; A's elements read in place whichever way it is stored.
void small_gemm(bool ta, int64_t m, int64_t n, int64_t kdim, const float* A, int64_t lda, const float* B,
                int64_t ldb, float* C, int64_t ldc, Store store) {
  constexpr int64_t panel = Simd::kLanes * Simd::kVectors;
  const int64_t ars = ta ? 1 : lda, acs = ta ? lda : 1;
  for (int64_t j0 = 0; j0 < n; j0 += panel) {
    const int64_t width = std::min<int64_t>(panel, n - j0), nv = (width + Simd::kLanes - 1) / Simd::kLanes;
    const int64_t tail = width - Simd::kLanes * (nv - 1);
    for (int64_t i0 = 0; i0 < m; i0 += Simd::kRows) {
      const int64_t mr = std::min<int64_t>(Simd::kRows, m - i0);
      kTiles[mr - 1][nv - 1](kdim, A + i0 * ars, ars, acs, B + j0, ldb, C + i0 * ldc + j0, ldc, tail, store);
    }
  }
}
#endif

// C (m x n, row stride ldc) = op(A) B + beta C (beta 0 or 1) for row-major A, B; ta: A is stored transposed.
// float32 takes the register tiles above where the build targets AVX-512 or AVX2 (`stream`, with beta 0: C streamed,
// then fenced), else goes straight to sgemm_ where ATen links MKL (and the sizes fit its 32-bit ints; column-major
// BLAS sees every row-major matrix transposed, so it computes C^T = B^T op(A)^T). float64 (gradcheck) and other
// builds go through at::mm.
template <typename T>
void gemm(bool ta, int64_t m, int64_t n, int64_t k, const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C,
          int64_t ldc, bool stream = false) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
#if defined(VITZOO_SIMD)
    const bool streamed = stream && beta == 0.0f;
    const Store store = beta != 0.0f ? Store::kAdd : streamed ? Store::kStream : Store::kWrite;
    small_gemm(ta, m, n, k, A, lda, B, ldb, C, ldc, store);
    if (streamed) _mm_sfence();  // the streamed lines reach memory before anyone reads them
    return;
#else
    if (has_mkl() && k > 0 && std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX) {
      const char opa = ta ? 'T' : 'N', opb = 'N';
      const int M = int(m), N = int(n), K = int(k), LA = int(lda), LB = int(ldb), LC = int(ldc);
      const float one = 1;
      sgemm_(&opb, &opa, &N, &M, &K, &one, B, &LB, A, &LA, &beta, C, &LC);
      return;
    }
#endif
  }
  const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto a = at::from_blob(const_cast<T*>(A), {ta ? k : m, ta ? m : k}, {lda, 1}, opts);
  auto c = at::from_blob(C, {m, n}, {ldc, 1}, opts);
  auto product = at::mm(ta ? a.t() : a, at::from_blob(const_cast<T*>(B), {k, n}, {ldb, 1}, opts));
  if (beta == T(0)) c.copy_(product);
  else c.add_(product);
}

// Rows of a (B, H, N, W) tensor with unit column stride: slice s = b * H + h, token r.
template <typename T>
struct Rows {
  T* data;
  int64_t heads, sb, sh, ld, width;
  explicit Rows(const at::Tensor& t) {
    TORCH_CHECK(t.dim() == 4, "expected a (B, H, N, D) tensor, got ", t.dim(), " dims");
    data = t.data_ptr<T>();
    heads = std::max<int64_t>(t.size(1), 1);
    sb = t.stride(0);
    sh = t.stride(1);
    width = t.size(3);
    ld = t.size(2) <= 1 ? std::max<int64_t>(width, 1) : t.stride(2);
    TORCH_CHECK((width <= 1 || t.stride(3) == 1) && ld >= width, "expected (B, H, N, D) with contiguous, "
                "non-overlapping rows");
  }
  T* operator()(int64_t s, int64_t r) const { return data + (s / heads) * sb + (s % heads) * sh + r * ld; }
};

// Per-thread scratch of a phase: (block x width) buffers, reused from block to block (uninitialised: every row is
// written before it is read).
template <typename T>
struct Scratch {
  std::unique_ptr<T[]> f_, p_, a_, den_;
  explicit Scratch(int64_t block, int64_t width)
      : f_(new T[block * width]), p_(new T[block * width]), a_(new T[block * width]), den_(new T[block]) {}
  T* f() const { return f_.get(); }
  T* p() const { return p_.get(); }
  T* a() const { return a_.get(); }
  T* den() const { return den_.get(); }
};

// One thread's MKL kept to a single thread while it lives (a thread's products must not fan out).
struct SingleThreadedMkl {
  int previous = MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0;
  ~SingleThreadedMkl() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous);
  }
};

// The kernel's worker threads for a child of fork, where ATen's OpenMP threads cannot serve (elsewhere the kernel
// runs on them: threads of its own would share the cores with them while they spin after torch's last op):
// run(n, job) calls job(0) on the caller and job(1..n-1) on workers, and returns when all are done (rethrowing a
// worker's exception). Workers sleep between jobs (spinning costs more than a futex wake
// on a shared 2-core machine). Process-wide, never destroyed (its threads wait for work until the process exits); a
// child of fork starts without one (threads do not survive fork).
class Pool {
 public:
  // Whether this process is a child of fork (whose parent may have run OpenMP regions: libgomp's threads are gone
  // there, and its next region hangs).
  static bool forked() { return forked_flag().load(); }

  static Pool& get() {
    std::lock_guard<std::mutex> lock(creation());
    if (instance() == nullptr) instance() = new Pool;
    return *instance();
  }

  void run(int64_t n, const std::function<void(int64_t)>& job) {
    std::lock_guard<std::mutex> call(calls_);  // one call at a time: the workers serve one job
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (int64_t(workers_) < n - 1) {
        std::thread([this, index = int64_t(++workers_)] { serve(index); }).detach();
      }
      job_ = &job;
      active_ = n;
      error_ = nullptr;
      remaining_.store(n - 1);
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    std::exception_ptr error;
    try {
      job(0);
    } catch (...) {
      error = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return remaining_.load() == 0; });
    if (error == nullptr) error = error_;
    if (error != nullptr) std::rethrow_exception(error);
  }

 private:
  static Pool*& instance() {
    static Pool* pool = nullptr;
    return pool;
  }
  static std::mutex& creation() {
    static std::mutex m;
    return m;
  }
  static std::atomic<bool>& forked_flag() {
    static std::atomic<bool> flag{false};
    return flag;
  }
  static inline const bool registered_ = pthread_atfork(nullptr, nullptr, [] {
    instance() = nullptr;
    forked_flag().store(true);
  }) == 0;

  void serve(int64_t index) {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(1);
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)>* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        job = index < active_ ? job_ : nullptr;
      }
      if (job == nullptr) continue;
      try {
        (*job)(index);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (error_ == nullptr) error_ = std::current_exception();
      }
      if (remaining_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_one();
      }
    }
  }

  std::mutex calls_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* job_ = nullptr;
  std::exception_ptr error_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> remaining_{0};
  size_t workers_ = 0;
  int64_t active_ = 0;
};

constexpr int64_t kOmpSlicesPerThread = 8;  // this many (batch, head) slices per thread: ATen's OpenMP threads
constexpr int64_t kUnitTokens = 1024;       // with few slices, units of >= this many tokens, up to 4 per thread

// The units of a phase: each slice's tokens [0, n) cut into `parts` near-equal ranges (with few slices, 1-4 per
// thread; else whole slices), unit u = (slice u / parts, part u % parts). `threads` threads (ATen's; the pool's in a
// child of fork) claim units one at a time (a thread slowed by a busy core takes fewer); a unit's partial sums go to
// its own slot, so the result does not depend on which thread ran it.
struct Units {
  int64_t slices, parts, n, threads;
  Units(int64_t slices, int64_t n, int64_t threads)
      : slices(slices),
        parts(threads > 1 && slices < kOmpSlicesPerThread * threads
                  ? std::clamp<int64_t>(n / kUnitTokens, threads, 4 * threads)
                  : 1),
        n(n),
        threads(std::max<int64_t>(1, std::min(threads, slices * parts))) {}
  int64_t lo(int64_t part) const { return n * part / parts; }

  // body(s, part, r0, rows, scratch) for each block of at most `block` rows of every unit; start(s, part) first.
  template <typename T, typename Start, typename Body>
  void run(int64_t block, int64_t width, const Start& start, const Body& body) const {
    TORCH_CHECK(block > 0, "block must be a positive number of rows, got ", block);
    if (slices == 0) return;
    const int64_t units = slices * parts;
    std::atomic<int64_t> next{0};
    auto walk = [&](int64_t) {
      Scratch<T> buf(std::min(block, n / parts + 1), width);
      const SingleThreadedMkl single;
      for (int64_t u = next.fetch_add(1); u < units; u = next.fetch_add(1)) {
        const int64_t s = u / parts, part = u % parts, hi = lo(part + 1);
        start(s, part);
        for (int64_t r0 = lo(part); r0 < hi; r0 += block) body(s, part, r0, std::min(block, hi - r0), buf);
      }
    };
    if (threads == 1) {
      walk(0);
    } else if (!Pool::forked()) {
      at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) walk(t);
      });
    } else {
      Pool::get().run(threads, walk);
    }
  }
  template <typename T, typename Body>
  void run(int64_t block, int64_t width, const Body& body) const {
    run<T>(block, width, [](int64_t, int64_t) {}, body);
  }
};

// Per-unit partial sums, (parts, BH, width) slots: each zeroed by its unit (start), added in part order by total().
template <typename T>
struct Partial {
  at::Tensor data;
  T* ptr;
  int64_t slices, width;
  Partial(const Units& units, int64_t width, const at::TensorOptions& options)
      : data(at::empty({units.parts, units.slices, width}, options)),
        ptr(data.data_ptr<T>()),
        slices(units.slices),
        width(width) {}
  T* slot(int64_t s, int64_t part) const { return ptr + (part * slices + s) * width; }
  void zero(int64_t s, int64_t part) const { std::fill_n(slot(s, part), width, T(0)); }
  at::Tensor total() const {  // into part 0, in place (no OpenMP region: the pool's callers may be fork children)
    const int64_t size = slices * width;
    for (int64_t part = 1; part < data.size(0); ++part) {
      const T* __restrict src = ptr + part * size;
#pragma omp simd
      for (int64_t i = 0; i < size; ++i) ptr[i] += src[i];
    }
    return data[0];
  }
};

// Asks for row r of slice s of `rows` (each of its cache lines) before it is read: the feature loops below request the
// rows that their block's products read next, so that a cold block arrives while the feature map is computed instead of
// stalling the register tiles (on a 2-core AMD EPYC VM: 5-8% off a forward of 4,096-8,192 tokens after other work). On
// x86 an explicit prefetcht0: GCC 12 drops a loop of __builtin_prefetch (or _mm_prefetch) from an inlined helper.
template <typename T>
inline void prefetch_row(const Rows<T>* rows, int64_t s, int64_t r) {
  if (rows == nullptr) return;
  const char* row = reinterpret_cast<const char*>((*rows)(s, r));
  const char* end = row + rows->width * int64_t(sizeof(T));
  for (const char* line = row - reinterpret_cast<uintptr_t>(row) % 64; line < end; line += 64) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(*line));
#else
    __builtin_prefetch(line);
#endif
  }
}

// f (rows x width, contiguous) = phi(x) for `rows` rows from x(s, r0); z, when given, += the column sums; the same rows
// of `ahead` are prefetched meanwhile.
template <Map M, typename T>
void features(const Rows<T>& x, int64_t s, int64_t r0, int64_t rows, T* __restrict f, T* __restrict z = nullptr,
              const Rows<T>* ahead = nullptr) {
  const int64_t width = x.width;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (width <= 64) {  // one row in <= 4 registers, the column sums kept in 4 more over the block
      const int64_t nv = (width + 15) / 16;
      __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int64_t r = 0; r < rows; ++r) {
        prefetch_row(ahead, s, r0 + r);
        const float* xr = x(s, r0 + r);
        float* fr = f + r * width;
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          if (j >= nv) break;
          const __mmask16 m = lanes(width - 16 * j);
          const __m512 v = phi16<M>(_mm512_maskz_loadu_ps(m, xr + 16 * j));
          _mm512_mask_storeu_ps(fr + 16 * j, m, v);
          sum[j] = _mm512_add_ps(sum[j], v);
        }
      }
      for (int j = 0; z != nullptr && j < nv; ++j) {
        const __mmask16 m = lanes(width - 16 * j);
        _mm512_mask_storeu_ps(z + 16 * j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, z + 16 * j), sum[j]));
      }
      return;
    }
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict fr = f + r * width;
    prefetch_row(ahead, s, r0 + r);
    phi_row<M>(x(s, r0 + r), fr, width);
    if (z == nullptr) continue;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) z[i] += fr[i];
  }
}

// For `rows` query rows from q(s, r0): f = phi(q) / den (den = phi(q).z + eps), inv = 1 / den, and, when p is
// given, p = phi'(q); the same rows of `ahead` are prefetched meanwhile.
template <Map M, typename T>
void scaled_features(const Rows<T>& q, int64_t s, int64_t r0, int64_t rows, const T* __restrict z, T eps,
                     T* __restrict f, T* __restrict inv, T* __restrict p = nullptr, const Rows<T>* ahead = nullptr) {
  const int64_t width = q.width;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (width <= 64) {  // one row in <= 4 registers, z in 4 more
      const int64_t nv = (width + 15) / 16;
      __m512 zv[4], fv[4];
      for (int j = 0; j < nv; ++j) zv[j] = _mm512_maskz_loadu_ps(lanes(width - 16 * j), z + 16 * j);
      for (int64_t r = 0; r < rows; ++r) {
        prefetch_row(ahead, s, r0 + r);
        const float* xr = q(s, r0 + r);
        __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          if (j >= nv) break;
          fv[j] = phi16<M>(_mm512_maskz_loadu_ps(lanes(width - 16 * j), xr + 16 * j));
          acc = _mm512_fmadd_ps(fv[j], zv[j], acc);
        }
        const float den = _mm512_reduce_add_ps(acc) + eps, i_r = 1.0f / den;
        const bool tiny = std::abs(den) < std::numeric_limits<float>::min();  // as below
        inv[r] = i_r;
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          if (j >= nv) break;
          const __mmask16 m = lanes(width - 16 * j);
          if (p != nullptr) _mm512_mask_storeu_ps(p + r * width + 16 * j, m, dphi16<M>(fv[j]));
          const __m512 scaled =
              tiny ? _mm512_div_ps(fv[j], _mm512_set1_ps(den)) : _mm512_mul_ps(fv[j], _mm512_set1_ps(i_r));
          _mm512_mask_storeu_ps(f + r * width + 16 * j, m, scaled);
        }
      }
      return;
    }
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict fr = f + r * width;
    prefetch_row(ahead, s, r0 + r);
    phi_row<M>(q(s, r0 + r), fr, width);
    const T den = dot(fr, z, width) + eps;
    const T i_r = T(1) / den;
    inv[r] = i_r;
    if (p != nullptr) {
      T* __restrict pr = p + r * width;
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) pr[i] = dphi<M>(fr[i]);
    }
    if (std::abs(den) < std::numeric_limits<T>::min()) {  // a subnormal den (eps = 0): 1 / den may overflow
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) fr[i] /= den;
      continue;
    }
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) fr[i] *= i_r;
  }
}

inline int64_t slices_of(const at::Tensor& x) { return x.size(0) * x.size(1); }

// The kernel indexes raw memory: every shape it relies on is checked first (q (B, H, Nq, D), k (B, H, Nk, D),
// v (B, H, Nk, Dv) of one dtype; a contiguous state S (BH, D, Dv), z (BH, D); gradients shaped like their inputs).
void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.sizes().slice(0, 2) == k.sizes().slice(0, 2) &&
                  k.sizes().slice(0, 3) == v.sizes().slice(0, 3) && q.size(3) == k.size(3),
              "expected q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, Dv), got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "q, k and v must share one dtype");
}
void check_state(const at::Tensor& x, const at::Tensor& S, const at::Tensor& z, int64_t dv) {
  TORCH_CHECK(S.is_contiguous() && z.is_contiguous() && S.dtype() == x.dtype() && z.dtype() == x.dtype() &&
                  S.sizes() == at::IntArrayRef({slices_of(x), x.size(3), dv}) &&
                  z.sizes() == at::IntArrayRef({slices_of(x), x.size(3)}),
              "expected a contiguous state S (BH, D, Dv) and z (BH, D) of the inputs' dtype, got ", S.sizes(),
              " and ", z.sizes());
}
void check_like(const c10::optional<at::Tensor>& grad, const at::Tensor& x, const char* name) {
  TORCH_CHECK(!grad.has_value() || (grad->sizes() == x.sizes() && grad->dtype() == x.dtype()), name,
              " must be shaped and typed like its input");
}

// The rows of a query block after a = dO S^T: c = f.a per row, dz -= sum c f (when dz is given) and, when p is
// given, a = (a - c z) / den * phi' in place (dq).
template <typename T>
void query_rows(int64_t rows, int64_t D, const T* __restrict f, T* __restrict a, int64_t lda, const T* __restrict z,
                const T* __restrict inv, const T* __restrict p, T* __restrict dz) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (D <= 64) {  // one row in <= 4 registers, z and the dz sums in 8 more
      const int64_t nv = (D + 15) / 16;
      __m512 zv[4], dzv[4], av[4], fv[4];
      for (int j = 0; j < nv; ++j) {
        zv[j] = _mm512_maskz_loadu_ps(lanes(D - 16 * j), z + 16 * j);
        dzv[j] = _mm512_setzero_ps();
      }
      for (int64_t r = 0; r < rows; ++r) {
        __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          if (j >= nv) break;
          const __mmask16 m = lanes(D - 16 * j);
          fv[j] = _mm512_maskz_loadu_ps(m, f + r * D + 16 * j);
          av[j] = _mm512_maskz_loadu_ps(m, a + r * lda + 16 * j);
          acc = _mm512_fmadd_ps(fv[j], av[j], acc);
        }
        const __m512 c = _mm512_set1_ps(_mm512_reduce_add_ps(acc)), i_r = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          if (j >= nv) break;
          dzv[j] = _mm512_fnmadd_ps(c, fv[j], dzv[j]);
          if (p == nullptr) continue;
          const __mmask16 m = lanes(D - 16 * j);
          const __m512 g = _mm512_mul_ps(_mm512_fnmadd_ps(c, zv[j], av[j]), i_r);
          const __m512 pv = _mm512_maskz_loadu_ps(m, p + r * D + 16 * j);
          _mm512_mask_storeu_ps(a + r * lda + 16 * j, m, _mm512_mul_ps(g, pv));
        }
      }
      for (int j = 0; dz != nullptr && j < nv; ++j) {
        const __mmask16 m = lanes(D - 16 * j);
        _mm512_mask_storeu_ps(dz + 16 * j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dz + 16 * j), dzv[j]));
      }
      return;
    }
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* __restrict fr = f + r * D;
    T* __restrict ar = a + r * lda;
    const T c = dot(fr, ar, D);
    if (dz != nullptr) {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) dz[i] -= c * fr[i];
    }
    if (p == nullptr) continue;
    const T* __restrict pr = p + r * D;
    const T i_r = inv[r];
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) ar[i] = (ar[i] - c * z[i]) * i_r * pr[i];
  }
}

// A fresh output of 4 MiB or more is backed by transparent huge pages where the OS offers them on request (THP
// "madvise" mode): its first touch here faults 2 MiB at a time instead of 4 KiB (a 50 MB tensor, 65,536 tokens of
// 3 x 64 channels: ~5 instead of ~28 ms on a 2-core VM). Memory already mapped is left as it is.
void advise_huge_pages(const at::Tensor& t) {
#if defined(MADV_HUGEPAGE)
  constexpr uintptr_t huge = uintptr_t(1) << 21;
  const uintptr_t bytes = t.numel() * t.element_size(), p = reinterpret_cast<uintptr_t>(t.data_ptr());
  if (bytes < 2 * huge) return;
  const uintptr_t start = (p + huge - 1) & ~(huge - 1), end = (p + bytes) & ~(huge - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
#endif
}

// An output the kernel writes once is streamed past the caches (Store::kStream) from 2 MiB on, more than a core's L2
// holds: its old lines are not read in first, and it does not evict the inputs the call still reads (on a 2-core AMD
// EPYC VM: 2-5% off a cold forward or backward from 4,096 tokens of 3 x 64 channels; ViT-Tiny's img/s at 512-1024 px
// unchanged).
constexpr int64_t kStreamBytes = int64_t(2) << 20;
inline bool streamed(const at::Tensor& t) { return t.numel() * int64_t(t.element_size()) >= kStreamBytes; }

// dst's `rows` rows (row stride ldd) = src's (rows x width, contiguous), float32 streamed (then fenced) where the build
// targets AVX-512 or AVX2, else copied.
template <typename T>
void stream_rows(const T* __restrict src, int64_t rows, int64_t width, T* __restrict dst, int64_t ldd) {
#if defined(VITZOO_SIMD)
  if constexpr (std::is_same_v<T, float>) {
    constexpr int64_t L = Simd::kLanes;
    for (int64_t r = 0; r < rows; ++r) {
      const float* sr = src + r * width;
      float* dr = dst + r * ldd;
      int64_t i = 0;
      for (; i < width && reinterpret_cast<uintptr_t>(dr + i) % sizeof(Simd::V) != 0; ++i) dr[i] = sr[i];
      for (; i + L <= width; i += L) Simd::stream(dr + i, Simd::load(sr + i));
      for (; i < width; ++i) dr[i] = sr[i];
    }
    _mm_sfence();
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ldd, src + r * width, width * sizeof(T));
}

// x (BH, D, Dv) as a contiguous (BH, Dv, D) (a loop: no OpenMP region in the pool's calls).
template <typename T>
at::Tensor transposed(const at::Tensor& x) {
  const int64_t BH = x.size(0), D = x.size(1), Dv = x.size(2);
  auto out = at::empty({BH, Dv, D}, x.options());
  const T* src = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  for (int64_t s = 0; s < BH; ++s)
    for (int64_t i = 0; i < D; ++i)
      for (int64_t j = 0; j < Dv; ++j) dst[(s * Dv + j) * D + i] = src[(s * D + i) * Dv + j];
  return out;
}

// (out, S, z): S = sum phi(k)^T v (BH, D, Dv), z = sum phi(k) (BH, D) over the keys, then
// out = (phi(q) / (phi(q).z + eps)) S (B, H, Nq, Dv).
template <Map M, typename T>
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double eps,
                                int64_t block, int64_t threads) {
  check_inputs(q, k, v);
  const Rows<T> qs(q), ks(k), vs(v);
  const int64_t BH = slices_of(q), D = ks.width, Dv = vs.width;
  const Units keys(BH, k.size(2), threads);
  const Partial<T> S_parts(keys, D * Dv, k.options()), z_parts(keys, D, k.options());
  const auto zero = [&](int64_t s, int64_t part) {
    S_parts.zero(s, part);
    z_parts.zero(s, part);
  };
  keys.run<T>(block, D, zero, [&](int64_t s, int64_t part, int64_t r0, int64_t rows, Scratch<T>& buf) {
    features<M>(ks, s, r0, rows, buf.f(), z_parts.slot(s, part), &vs);
    gemm<T>(true, D, Dv, rows, buf.f(), D, vs(s, r0), vs.ld, T(1), S_parts.slot(s, part), Dv);
  });
  const at::Tensor S = S_parts.total().view({BH, D, Dv}), z = z_parts.total();
  auto out = at::empty({q.size(0), q.size(1), q.size(2), Dv}, v.options());
  advise_huge_pages(out);
  const Rows<T> os(out);
  const bool stream = streamed(out);
  const T *St = S.data_ptr<T>(), *zt = z.data_ptr<T>();
  Units(BH, q.size(2), threads).run<T>(block, D, [&](int64_t s, int64_t, int64_t r0, int64_t rows, Scratch<T>& buf) {
    scaled_features<M>(qs, s, r0, rows, zt + s * D, T(eps), buf.f(), buf.den());
    gemm<T>(false, rows, Dv, D, buf.f(), D, St + s * D * Dv, Dv, T(0), os(s, r0), os.ld, stream);
  });
  return {out, S, z};
}

// dq, dk, dv (each when given, written in place). Queries first: with f = phi(q) / den (den = phi(q).z + eps),
// a = dO S^T and c = f.a:  dphi(q) = (a - c z) / den,  dS = f^T dO,  dz = -sum c f  (dS, dz only for dk or dv);
// then keys and values: dv = phi(k) dS, dk = (v dS^T + dz) phi'(k).
template <Map M, typename T>
void backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& S, const at::Tensor& z, double eps, const c10::optional<at::Tensor>& dq,
              const c10::optional<at::Tensor>& dk, const c10::optional<at::Tensor>& dv, int64_t block,
              int64_t threads) {
  check_inputs(q, k, v);
  check_state(q, S, z, v.size(3));
  TORCH_CHECK(dout.dim() == 4 && dout.sizes().slice(0, 3) == q.sizes().slice(0, 3) && dout.size(3) == v.size(3) &&
                  dout.dtype() == q.dtype(),
              "dout must be shaped like the output (B, H, Nq, Dv) and typed like the inputs, got ", dout.sizes());
  check_like(dq, q, "dq");
  check_like(dk, k, "dk");
  check_like(dv, v, "dv");
  for (const auto* grad : {&dq, &dk, &dv})
    if (grad->has_value()) advise_huge_pages(**grad);
  const Rows<T> qs(q), ks(k), vs(v), dos(dout), dqs(dq.value_or(q)), dks(dk.value_or(k)), dvs(dv.value_or(v));
  const int64_t BH = slices_of(q), D = qs.width, Dv = vs.width;
  const bool state_grads = dk.has_value() || dv.has_value();
  if (!dq.has_value() && !state_grads) return;
  const Units queries(BH, q.size(2), threads);
  const Partial<T> dS_parts(queries, state_grads ? D * Dv : 0, q.options()), dz_parts(queries, state_grads ? D : 0,
                                                                                        q.options());
  const at::Tensor S_t = transposed<T>(S);  // the products read B's rows: S^T's, dS^T's
  const bool stream_dq = dq.has_value() && streamed(*dq);
  const T *Stp = S_t.data_ptr<T>(), *zp = z.data_ptr<T>();
  const auto zero = [&](int64_t s, int64_t part) {
    dS_parts.zero(s, part);
    dz_parts.zero(s, part);
  };
  queries.run<T>(block, D, zero, [&](int64_t s, int64_t part, int64_t r0, int64_t rows, Scratch<T>& buf) {
    T *f = buf.f(), *p = buf.p(), *inv = buf.den();
    const T* __restrict zs = zp + s * D;
    scaled_features<M>(qs, s, r0, rows, zs, T(eps), f, inv, dq.has_value() ? p : nullptr, &dos);
    const bool direct = dq.has_value() && !stream_dq;  // a = dO S^T, turned into dq in place (then streamed there)
    T* a = direct ? dqs(s, r0) : buf.a();
    const int64_t lda = direct ? dqs.ld : D;
    gemm<T>(false, rows, D, Dv, dos(s, r0), dos.ld, Stp + s * D * Dv, D, T(0), a, lda);
    if (state_grads) gemm<T>(true, D, Dv, rows, f, D, dos(s, r0), dos.ld, T(1), dS_parts.slot(s, part), Dv);
    query_rows(rows, D, f, a, lda, zs, inv, dq.has_value() ? p : nullptr,
               state_grads ? dz_parts.slot(s, part) : nullptr);
    if (stream_dq) stream_rows(a, rows, D, dqs(s, r0), dqs.ld);
  });
  if (!state_grads) return;
  const at::Tensor dS = dS_parts.total().view({BH, D, Dv}), dz = dz_parts.total(), dS_t = transposed<T>(dS);
  const T *dSt = dS.data_ptr<T>(), *dSts = dS_t.data_ptr<T>(), *dzt = dz.data_ptr<T>();
  const bool stream_dv = dv.has_value() && streamed(*dv), stream_dk = dk.has_value() && streamed(*dk);
  Units(BH, k.size(2), threads).run<T>(block, D, [&](int64_t s, int64_t, int64_t r0, int64_t rows, Scratch<T>& buf) {
    T* f = buf.f();
    const T* dSs = dSt + s * D * Dv;
    features<M>(ks, s, r0, rows, f, static_cast<T*>(nullptr), dk.has_value() ? &vs : nullptr);
    if (dv.has_value()) gemm<T>(false, rows, Dv, D, f, D, dSs, Dv, T(0), dvs(s, r0), dvs.ld, stream_dv);
    if (!dk.has_value()) return;
    T* a = stream_dk ? buf.a() : dks(s, r0);  // v dS^T, turned into dk in place (then streamed there)
    const int64_t lda = stream_dk ? D : dks.ld;
    gemm<T>(false, rows, D, Dv, vs(s, r0), vs.ld, dSts + s * D * Dv, D, T(0), a, lda);
    const T* __restrict dzs = dzt + s * D;
    for (int64_t r = 0; r < rows; ++r) {
      const T* __restrict fr = f + r * D;
      T* __restrict o = a + r * lda;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) o[i] = (o[i] + dzs[i]) * dphi<M>(fr[i]);
    }
    if (stream_dk) stream_rows(a, rows, D, dks(s, r0), dks.ld);
  });
}

// fn<M, T>(args...) for the feature map number and x's dtype (float32, or float64 for gradcheck).
#define VITZOO_DISPATCH(fn, x, map, ...)                                                                 \
  [&] {                                                                                                     \
    TORCH_CHECK((x).scalar_type() == at::kFloat || (x).scalar_type() == at::kDouble,                        \
                #fn ": float32 or float64 tensors, got ", (x).scalar_type());                            \
    TORCH_CHECK((map) == kElu || (map) == kRelu || (map) == kIdentity,                                      \
                #fn ": unknown feature map number ", (map));                                             \
    const bool f32 = (x).scalar_type() == at::kFloat;                                                       \
    if ((map) == kElu) return f32 ? fn<kElu, float>(__VA_ARGS__) : fn<kElu, double>(__VA_ARGS__);           \
    if ((map) == kRelu) return f32 ? fn<kRelu, float>(__VA_ARGS__) : fn<kRelu, double>(__VA_ARGS__);        \
    return f32 ? fn<kIdentity, float>(__VA_ARGS__) : fn<kIdentity, double>(__VA_ARGS__);                    \
  }()

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using at::Tensor;
  using OptTensor = c10::optional<at::Tensor>;
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("forward", [](const Tensor& q, const Tensor& k, const Tensor& v, int64_t map, double eps, int64_t block,
                      int64_t threads) { return VITZOO_DISPATCH(forward, q, map, q, k, v, eps, block, threads); },
        nogil);
  m.def("backward", [](const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& S,
                       const Tensor& z, int64_t map, double eps, const OptTensor& dq, const OptTensor& dk,
                       const OptTensor& dv, int64_t block, int64_t threads) {
    VITZOO_DISPATCH(backward, q, map, dout, q, k, v, S, z, eps, dq, dk, dv, block, threads);
  }, nogil);
  m.def("has_blas", [] { return has_mkl(); });  // float32 products straight to MKL
  m.def("stream_bytes", [] { return kStreamBytes; });  // outputs this large are streamed past the caches
}
