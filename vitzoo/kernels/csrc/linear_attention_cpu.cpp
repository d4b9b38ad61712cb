// The CPU linear-attention sweeps of the torch path (torch_linear.py; built by cpu_kernel.py). Each sweep walks
// one token range of every (batch, head) slice in blocks of rows small enough to stay in the core's L2: the
// feature map, the normaliser and the element-wise work fused into row loops over the block (1 / den folded into
// the feature rows, so that the products write the results directly), the (block x d x d) products handed straight
// to BLAS (the sgemm_ of the MKL that ATen links, else ATen's mm). Inputs are (B, H, N, D) with unit column stride
// and any other strides (timm's packed qkv views); float32, or float64 for gradcheck. phi'(x) is read off
// f = phi(x): elu+1 -> min(f, 1) (f = exp(x) <= 1 for x <= 0, x + 1 > 1 above), relu -> [f > 0], identity
// (features computed by the caller) -> 1. Built with -fno-trapping-math so that the branch-free row loops
// vectorise; float32 elu+1 rows take an AVX-512 form of the same exp where the build targets AVX-512.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <climits>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

extern "C" {  // from the MKL that ATen links, when it has one (weak: null otherwise; both, or neither is used)
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));  // mkl_service.h's mkl_set_num_threads_local
}

namespace {

enum Map : int64_t { kElu = 0, kRelu = 1, kIdentity = 2 };  // the order of cpu_kernel.CPU_KERNEL_MAPS

// exp(x) for x <= 0 without a libm call: Cody-Waite reduction and Cephes' expf polynomial
// (relative error < 1e-7). 2^n is applied as two normal factors, so that below fp32's normal range
// (x < -87.3) the result is the rounded subnormal, as expf's is, and 0 below -104.
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
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
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

#if defined(__AVX512F__)
// exp_nonpositive above on 16 lanes, 2^n applied by scalef (one rounding, to the subnormal below -87.3).
inline __m512 exp_nonpositive16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

template <>
inline void phi_row<kElu, float>(const float* __restrict xr, float* __restrict fr, int64_t width) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 m = width - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (width - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, xr + i);
    // min / max with x second: a NaN x comes through, as std::min(x, 0) gives it
    const __m512 f = _mm512_add_ps(exp_nonpositive16(_mm512_min_ps(zero, x)), _mm512_max_ps(zero, x));
    _mm512_mask_storeu_ps(fr + i, m, f);
  }
}
#endif

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline bool has_mkl() { return sgemm_ != nullptr && MKL_Set_Num_Threads_Local != nullptr; }

// C (m x n, row stride ldc) = op(A) op(B) + beta C for row-major A, B; ta / tb: A / B are stored transposed.
// float32 goes straight to sgemm_ where ATen links MKL (and the sizes fit its 32-bit ints): column-major BLAS
// sees every row-major matrix transposed, so it computes C^T = op(B)^T op(A)^T. float64 (gradcheck) and
// other builds go through at::mm.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (has_mkl() && k > 0 && std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX) {
      const char opa = ta ? 'T' : 'N', opb = tb ? 'T' : 'N';
      const int M = int(m), N = int(n), K = int(k), LA = int(lda), LB = int(ldb), LC = int(ldc);
      const float one = 1;
      sgemm_(&opb, &opa, &N, &M, &K, &one, B, &LB, A, &LA, &beta, C, &LC);
      return;
    }
  }
  const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto view = [&](const T* p, int64_t rows, int64_t cols, int64_t ld, bool t) {
    auto x = at::from_blob(const_cast<T*>(p), {t ? cols : rows, t ? rows : cols}, {ld, 1}, opts);
    return t ? x.t() : x;
  };
  auto c = at::from_blob(C, {m, n}, {ldc, 1}, opts);
  auto product = at::mm(view(A, m, k, lda, ta), view(B, k, n, ldb, tb));
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

// Per-thread scratch of a sweep: (block x width) buffers, reused from block to block.
template <typename T>
struct Scratch {
  std::vector<T> f, p, a, den;
  explicit Scratch(int64_t block, int64_t width) : f(block * width), p(block * width), a(block * width), den(block) {}
};

// One thread's MKL kept to a single thread while it lives (a worker's products must not fan out).
struct SingleThreadedMkl {
  int previous = MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0;
  ~SingleThreadedMkl() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous);
  }
};

// body(s, r0, rows, scratch) for each block of at most `block` rows of tokens [lo, hi) in every slice, slices
// split over ATen's threads (one thread in a worker), each with its own scratch and its MKL kept to itself.
template <typename T, typename Body>
void for_blocks(int64_t slices, int64_t lo, int64_t hi, int64_t block, int64_t width, const Body& body) {
  TORCH_CHECK(block > 0, "block must be a positive number of rows, got ", block);
  if (hi <= lo) return;
  at::parallel_for(0, slices, 1, [&](int64_t s0, int64_t s1) {
    Scratch<T> buf(std::min(block, hi - lo), width);
    const SingleThreadedMkl single;
    for (int64_t s = s0; s < s1; ++s)
      for (int64_t r0 = lo; r0 < hi; r0 += block) body(s, r0, std::min(block, hi - r0), buf);
  });
}

// f (rows x width, contiguous) = phi(x) for `rows` rows from x(s, r0); z, when given, += the column sums.
template <Map M, typename T>
void features(const Rows<T>& x, int64_t s, int64_t r0, int64_t rows, T* __restrict f, T* __restrict z = nullptr) {
  const int64_t width = x.width;
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict fr = f + r * width;
    phi_row<M>(x(s, r0 + r), fr, width);
    if (z == nullptr) continue;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) z[i] += fr[i];
  }
}

// For `rows` query rows from q(s, r0): f = phi(q) / den (den = phi(q).z + eps), inv = 1 / den, and, when p is
// given, p = phi'(q).
template <Map M, typename T>
void scaled_features(const Rows<T>& q, int64_t s, int64_t r0, int64_t rows, const T* __restrict z, T eps,
                     T* __restrict f, T* __restrict inv, T* __restrict p = nullptr) {
  const int64_t width = q.width;
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict fr = f + r * width;
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

// The sweeps index raw memory: every shape they rely on is checked first (tokens [lo, hi) of x, y's
// (B, H, N) equal to x's, and a contiguous state S (BH, D, Dv), z (BH, D) for x's slices and width).
void check_rows(const at::Tensor& x, const at::Tensor& y, int64_t lo, int64_t hi) {
  TORCH_CHECK(x.dim() == 4 && y.dim() == 4 && x.sizes().slice(0, 3) == y.sizes().slice(0, 3),
              "expected (B, H, N, *) tensors of one (B, H, N), got ", x.sizes(), " and ", y.sizes());
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= x.size(2), "token range [", lo, ", ", hi, ") outside ", x.size(2));
}
void check_state(const at::Tensor& x, const at::Tensor& S, const at::Tensor& z, int64_t dv) {
  TORCH_CHECK(S.is_contiguous() && z.is_contiguous() && S.dtype() == x.dtype() && z.dtype() == x.dtype() &&
                  S.sizes() == at::IntArrayRef({slices_of(x), x.size(3), dv}) &&
                  z.sizes() == at::IntArrayRef({slices_of(x), x.size(3)}),
              "expected a contiguous state S (BH, D, Dv) and z (BH, D) of the inputs' dtype, got ", S.sizes(),
              " and ", z.sizes());
}

// S = sum phi(k)^T v (BH, D, Dv) and z = sum phi(k) (BH, D) over tokens [lo, hi).
template <Map M, typename T>
std::vector<at::Tensor> state_sweep(const at::Tensor& k, const at::Tensor& v, int64_t lo, int64_t hi, int64_t block) {
  check_rows(k, v, lo, hi);
  TORCH_CHECK(v.dtype() == k.dtype(), "k and v must share one dtype");
  const Rows<T> ks(k), vs(v);
  const int64_t D = ks.width, Dv = vs.width;
  auto S = at::zeros({slices_of(k), D, Dv}, k.options());
  auto z = at::zeros({slices_of(k), D}, k.options());
  T *Sp = S.data_ptr<T>(), *zp = z.data_ptr<T>();
  for_blocks<T>(slices_of(k), lo, hi, block, D, [&](int64_t s, int64_t r0, int64_t rows, Scratch<T>& buf) {
    features<M>(ks, s, r0, rows, buf.f.data(), zp + s * D);
    gemm<T>(true, false, D, Dv, rows, buf.f.data(), D, vs(s, r0), vs.ld, T(1), Sp + s * D * Dv, Dv);
  });
  return {S, z};
}

// out = (phi(q) / (phi(q).z + eps)) S for tokens [lo, hi), written into out.
template <Map M, typename T>
void output_sweep(const at::Tensor& q, const at::Tensor& S, const at::Tensor& z, double eps, at::Tensor out,
                  int64_t lo, int64_t hi, int64_t block) {
  check_rows(q, out, lo, hi);
  check_state(q, S, z, out.size(3));
  TORCH_CHECK(out.dtype() == q.dtype(), "out must have the inputs' dtype");
  const Rows<T> qs(q), os(out);
  const int64_t D = qs.width, Dv = os.width;
  const T *Sp = S.data_ptr<T>(), *zp = z.data_ptr<T>();
  for_blocks<T>(slices_of(q), lo, hi, block, D, [&](int64_t s, int64_t r0, int64_t rows, Scratch<T>& buf) {
    T* f = buf.f.data();
    scaled_features<M>(qs, s, r0, rows, zp + s * D, T(eps), f, buf.den.data());
    gemm<T>(false, false, rows, Dv, D, f, D, Sp + s * D * Dv, Dv, T(0), os(s, r0), os.ld);
  });
}

// Tokens [lo, hi) of the queries: dq (when given) and their share of dS, dz. With f = phi(q) / den (den =
// phi(q).z + eps), a = dO S^T and c = f.a:  dphi(q) = (a - c z) / den,  dS = f^T dO,  dz = -sum c f.
template <Map M, typename T>
std::vector<at::Tensor> query_grad_sweep(const at::Tensor& q, const at::Tensor& dout, const at::Tensor& S,
                                         const at::Tensor& z, double eps, const c10::optional<at::Tensor>& dq,
                                         int64_t lo, int64_t hi, int64_t block) {
  check_rows(q, dout, lo, hi);
  check_state(q, S, z, dout.size(3));
  TORCH_CHECK(dout.dtype() == q.dtype(), "dout must have the inputs' dtype");
  if (dq.has_value()) {
    check_rows(q, *dq, lo, hi);
    TORCH_CHECK(dq->size(3) == q.size(3) && dq->dtype() == q.dtype(), "dq must be shaped and typed like q");
  }
  const Rows<T> qs(q), dos(dout);
  const int64_t D = qs.width, Dv = dos.width;
  auto dS = at::zeros({slices_of(q), D, Dv}, q.options());
  auto dz = at::zeros({slices_of(q), D}, q.options());
  const T *Sp = S.data_ptr<T>(), *zp = z.data_ptr<T>();
  T *dSp = dS.data_ptr<T>(), *dzp = dz.data_ptr<T>();
  const bool write_dq = dq.has_value();
  const Rows<T> dqs(write_dq ? *dq : q);
  for_blocks<T>(slices_of(q), lo, hi, block, D, [&](int64_t s, int64_t r0, int64_t rows, Scratch<T>& buf) {
    T *f = buf.f.data(), *p = buf.p.data(), *inv = buf.den.data();
    const T* __restrict zs = zp + s * D;
    scaled_features<M>(qs, s, r0, rows, zs, T(eps), f, inv, write_dq ? p : nullptr);
    T* a = write_dq ? dqs(s, r0) : buf.a.data();  // a = dO S^T, turned into dq in place
    const int64_t lda = write_dq ? dqs.ld : D;
    gemm<T>(false, true, rows, D, Dv, dos(s, r0), dos.ld, Sp + s * D * Dv, Dv, T(0), a, lda);
    gemm<T>(true, false, D, Dv, rows, f, D, dos(s, r0), dos.ld, T(1), dSp + s * D * Dv, Dv);
    T* __restrict dzs = dzp + s * D;
    for (int64_t r = 0; r < rows; ++r) {
      const T* __restrict fr = f + r * D;
      T* __restrict ar = a + r * lda;
      const T c = dot(fr, ar, D);
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) dzs[i] -= c * fr[i];
      if (!write_dq) continue;
      const T* __restrict pr = p + r * D;
      const T i_r = inv[r];
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) ar[i] = (ar[i] - c * zs[i]) * i_r * pr[i];
    }
  });
  return {dS, dz};
}

// Tokens [lo, hi) of the keys and values: dv = phi(k) dS and dk = (v dS^T + dz) phi'(k) (each when given).
template <Map M, typename T>
void key_value_grad_sweep(const at::Tensor& k, const at::Tensor& v, const at::Tensor& dS, const at::Tensor& dz,
                          const c10::optional<at::Tensor>& dk, const c10::optional<at::Tensor>& dv, int64_t lo,
                          int64_t hi, int64_t block) {
  check_rows(k, v, lo, hi);
  check_state(k, dS, dz, v.size(3));
  TORCH_CHECK(v.dtype() == k.dtype(), "k and v must share one dtype");
  for (const auto& [grad, like] : {std::pair{&dk, &k}, std::pair{&dv, &v}}) {
    if (!grad->has_value()) continue;
    check_rows(*like, **grad, lo, hi);
    TORCH_CHECK((*grad)->size(3) == like->size(3) && (*grad)->dtype() == like->dtype(),
                "dk / dv must be shaped and typed like k / v");
  }
  const Rows<T> ks(k), vs(v), dks(dk.has_value() ? *dk : k), dvs(dv.has_value() ? *dv : v);
  const int64_t D = ks.width, Dv = vs.width;
  const T *dSp = dS.data_ptr<T>(), *dzp = dz.data_ptr<T>();
  for_blocks<T>(slices_of(k), lo, hi, block, D, [&](int64_t s, int64_t r0, int64_t rows, Scratch<T>& buf) {
    T* f = buf.f.data();
    const T* dSs = dSp + s * D * Dv;
    features<M>(ks, s, r0, rows, f);
    if (dv.has_value()) gemm<T>(false, false, rows, Dv, D, f, D, dSs, Dv, T(0), dvs(s, r0), dvs.ld);
    if (!dk.has_value()) return;
    gemm<T>(false, true, rows, D, Dv, vs(s, r0), vs.ld, dSs, Dv, T(0), dks(s, r0), dks.ld);
    const T* __restrict dzs = dzp + s * D;
    for (int64_t r = 0; r < rows; ++r) {
      const T* __restrict fr = f + r * D;
      T* __restrict o = dks(s, r0 + r);
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) o[i] = (o[i] + dzs[i]) * dphi<M>(fr[i]);
    }
  });
}

// sweep<M, T>(args...) for the feature map number and x's dtype (float32, or float64 for gradcheck).
#define VITZOO_DISPATCH(sweep, x, map, ...)                                                                 \
  [&] {                                                                                                     \
    TORCH_CHECK((x).scalar_type() == at::kFloat || (x).scalar_type() == at::kDouble,                        \
                #sweep ": float32 or float64 tensors, got ", (x).scalar_type());                            \
    TORCH_CHECK((map) == kElu || (map) == kRelu || (map) == kIdentity,                                      \
                #sweep ": unknown feature map number ", (map));                                             \
    const bool f32 = (x).scalar_type() == at::kFloat;                                                       \
    if ((map) == kElu) return f32 ? sweep<kElu, float>(__VA_ARGS__) : sweep<kElu, double>(__VA_ARGS__);     \
    if ((map) == kRelu) return f32 ? sweep<kRelu, float>(__VA_ARGS__) : sweep<kRelu, double>(__VA_ARGS__);  \
    return f32 ? sweep<kIdentity, float>(__VA_ARGS__) : sweep<kIdentity, double>(__VA_ARGS__);              \
  }()

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using at::Tensor;
  using OptTensor = c10::optional<at::Tensor>;
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("state_sweep", [](const Tensor& k, const Tensor& v, int64_t map, int64_t lo, int64_t hi, int64_t block) {
    return VITZOO_DISPATCH(state_sweep, k, map, k, v, lo, hi, block);
  }, nogil);
  m.def("output_sweep", [](const Tensor& q, const Tensor& S, const Tensor& z, double eps, int64_t map,
                           const Tensor& out, int64_t lo, int64_t hi, int64_t block) {
    VITZOO_DISPATCH(output_sweep, q, map, q, S, z, eps, out, lo, hi, block);
  }, nogil);
  m.def("query_grad_sweep", [](const Tensor& q, const Tensor& dout, const Tensor& S, const Tensor& z, double eps,
                               int64_t map, const OptTensor& dq, int64_t lo, int64_t hi, int64_t block) {
    return VITZOO_DISPATCH(query_grad_sweep, q, map, q, dout, S, z, eps, dq, lo, hi, block);
  }, nogil);
  m.def("key_value_grad_sweep", [](const Tensor& k, const Tensor& v, const Tensor& dS, const Tensor& dz, int64_t map,
                                   const OptTensor& dk, const OptTensor& dv, int64_t lo, int64_t hi, int64_t block) {
    VITZOO_DISPATCH(key_value_grad_sweep, k, map, k, v, dS, dz, dk, dv, lo, hi, block);
  }, nogil);
  m.def("has_blas", [] { return has_mkl(); });  // float32 products straight to MKL
}
