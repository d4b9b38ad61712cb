// Per-chunk steps of the CPU linear-attention path (torch_linear.py; built by cpu_kernel.py): the
// feature map, the normaliser and the element-wise work of each step fused into one or two row loops, the six
// (chunk x d x d) products left to ATen's bmm (MKL). Tensors are (slices, rows, width) with unit
// column stride; float32, or float64 for gradcheck. phi'(x) is read off f = phi(x): elu+1 -> min(f, 1)
// (f = exp(x) <= 1 for x <= 0, x + 1 > 1 above), relu -> [f > 0]. Built with -fno-trapping-math so
// that the branch-free row loops vectorise.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

enum Map : int64_t { kElu = 0, kRelu = 1 };  // the order of cpu_kernel.CPU_KERNEL_MAPS

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
  else return std::max(x, T(0));
}

template <Map M, typename T>
inline T dphi(T f) {
  if constexpr (M == kElu) return std::min(f, T(1));
  else return T(f > T(0));
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <typename T>
struct Rows {  // row pointers of a (slices, rows, width) tensor with unit column stride
  T* data;
  int64_t slice_stride, row_stride;
  explicit Rows(const at::Tensor& t) : data(t.data_ptr<T>()), slice_stride(t.stride(0)), row_stride(t.stride(1)) {
    TORCH_CHECK(t.dim() == 3 && (t.size(2) <= 1 || t.stride(2) == 1), "expected (slices, rows, width) with contiguous rows");
  }
  T* operator()(int64_t b, int64_t r) const { return data + b * slice_stride + r * row_stride; }
};

// body(b, r) for every row of every slice, slices split over ATen's threads (one thread in a worker).
template <typename Body>
void for_rows(int64_t slices, int64_t rows, const Body& body) {
  at::parallel_for(0, slices, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t r = 0; r < rows; ++r) body(b, r);
  });
}

template <Map M, typename T>
inline void phi_row(const T* __restrict x, T* __restrict f, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) f[i] = phi<M>(x[i]);
}

// S = phi(k)^T v and z = sum_rows phi(k) of one chunk; f: (slices, rows, D) scratch.
template <Map M, typename T>
std::vector<at::Tensor> state_step(const at::Tensor& k, const at::Tensor& v, const at::Tensor& f) {
  const int64_t width = k.size(2);
  auto z = at::zeros({k.size(0), width}, k.options());
  const Rows<T> ks(k), fs(f);
  T* zp = z.data_ptr<T>();
  for_rows(k.size(0), k.size(1), [&](int64_t b, int64_t r) {
    T* __restrict fr = fs(b, r);
    T* __restrict zb = zp + b * width;
    phi_row<M>(ks(b, r), fr, width);
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) zb[i] += fr[i];
  });
  return {at::bmm(f.mT(), v), z};
}

// out = phi(q) S / (phi(q).z + eps) of one chunk, written into out (a view of the result).
template <Map M, typename T>
void output_step(const at::Tensor& q, const at::Tensor& S, const at::Tensor& z, double eps, const at::Tensor& f,
                 const at::Tensor& den, at::Tensor out) {
  const int64_t rows = q.size(1), width = q.size(2), dv = out.size(2);
  const Rows<T> qs(q), fs(f), os(out);
  const T* zp = z.data_ptr<T>();
  T* dn = den.data_ptr<T>();
  for_rows(q.size(0), rows, [&](int64_t b, int64_t r) {
    phi_row<M>(qs(b, r), fs(b, r), width);
    dn[b * rows + r] = dot(fs(b, r), zp + b * width, width) + T(eps);
  });
  at::bmm_out(out, f, S);
  for_rows(q.size(0), rows, [&](int64_t b, int64_t r) {
    T* __restrict o = os(b, r);
    const T s = dn[b * rows + r];
#pragma omp simd
    for (int64_t i = 0; i < dv; ++i) o[i] /= s;
  });
}

// One chunk of queries: dq into its view (when given); returns the chunk's dS and dz. With
// g = dO / den, a = g S^T, w = (phi(q).a) / den:  dphi(q) = a - w z,  dS = phi(q)^T g,  dz = -sum w phi(q).
template <Map M, typename T>
std::vector<at::Tensor> query_grad_step(const at::Tensor& q, const at::Tensor& dout, const at::Tensor& S,
                                        const at::Tensor& z, double eps, const at::Tensor& f, const at::Tensor& g,
                                        at::Tensor a, const at::Tensor& den, const c10::optional<at::Tensor>& dq) {
  const int64_t rows = q.size(1), width = q.size(2), dv = g.size(2);
  auto dz = at::zeros({q.size(0), width}, q.options());
  const Rows<T> qs(q), dos(dout), fs(f), gs(g), as(a), dqs(dq.has_value() ? *dq : a);
  const T* zp = z.data_ptr<T>();
  T* dzp = dz.data_ptr<T>();
  T* dn = den.data_ptr<T>();
  for_rows(q.size(0), rows, [&](int64_t b, int64_t r) {
    phi_row<M>(qs(b, r), fs(b, r), width);
    const T s = dot(fs(b, r), zp + b * width, width) + T(eps);
    const T* __restrict d = dos(b, r);
    T* __restrict gr = gs(b, r);
    dn[b * rows + r] = s;
#pragma omp simd
    for (int64_t i = 0; i < dv; ++i) gr[i] = d[i] / s;
  });
  at::bmm_out(a, g, S.mT());
  auto dS = at::bmm(f.mT(), g);
  const bool write_dq = dq.has_value();
  for_rows(q.size(0), rows, [&](int64_t b, int64_t r) {
    const T* __restrict fr = fs(b, r);
    const T* __restrict ar = as(b, r);
    const T* __restrict zb = zp + b * width;
    T* __restrict dzb = dzp + b * width;
    const T w = dot(fr, ar, width) / dn[b * rows + r];
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) dzb[i] -= w * fr[i];
    if (!write_dq) return;
    T* __restrict o = dqs(b, r);
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) o[i] = (ar[i] - w * zb[i]) * dphi<M>(fr[i]);
  });
  return {dS, dz};
}

// One chunk of keys and values: dv = phi(k) dS and dk = (v dS^T + dz) phi'(k) into their views (each when given).
template <Map M, typename T>
void key_value_grad_step(const at::Tensor& k, const at::Tensor& v, const at::Tensor& dS, const at::Tensor& dz,
                         const at::Tensor& f, at::Tensor dfk, c10::optional<at::Tensor> dk,
                         c10::optional<at::Tensor> dv) {
  const int64_t rows = k.size(1), width = k.size(2);
  const Rows<T> ks(k), fs(f);
  for_rows(k.size(0), rows, [&](int64_t b, int64_t r) { phi_row<M>(ks(b, r), fs(b, r), width); });
  if (dv.has_value()) at::bmm_out(*dv, f, dS);
  if (!dk.has_value()) return;
  at::bmm_out(dfk, v, dS.mT());
  const Rows<T> ds(dfk), dks(*dk);
  const T* dzp = dz.data_ptr<T>();
  for_rows(k.size(0), rows, [&](int64_t b, int64_t r) {
    const T* __restrict fr = fs(b, r);
    const T* __restrict d = ds(b, r);
    const T* __restrict dzb = dzp + b * width;
    T* __restrict o = dks(b, r);
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) o[i] = (d[i] + dzb[i]) * dphi<M>(fr[i]);
  });
}

// step<M, T>(args...) for the feature map number and x's dtype (float32, or float64 for gradcheck).
#define VITZOO_DISPATCH(step, x, map, ...)                                                                 \
  [&] {                                                                                                    \
    TORCH_CHECK((x).scalar_type() == at::kFloat || (x).scalar_type() == at::kDouble,                       \
                #step ": float32 or float64 tensors, got ", (x).scalar_type());                            \
    TORCH_CHECK((map) == kElu || (map) == kRelu, #step ": unknown feature map number ", (map));            \
    const bool f32 = (x).scalar_type() == at::kFloat;                                                      \
    if ((map) == kElu) return f32 ? step<kElu, float>(__VA_ARGS__) : step<kElu, double>(__VA_ARGS__);      \
    return f32 ? step<kRelu, float>(__VA_ARGS__) : step<kRelu, double>(__VA_ARGS__);                       \
  }()

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using at::Tensor;
  using OptTensor = c10::optional<at::Tensor>;
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("state_step", [](const Tensor& k, const Tensor& v, const Tensor& f, int64_t map) {
    return VITZOO_DISPATCH(state_step, k, map, k, v, f);
  }, nogil);
  m.def("output_step", [](const Tensor& q, const Tensor& S, const Tensor& z, double eps, int64_t map,
                          const Tensor& f, const Tensor& den, const Tensor& out) {
    VITZOO_DISPATCH(output_step, q, map, q, S, z, eps, f, den, out);
  }, nogil);
  m.def("query_grad_step", [](const Tensor& q, const Tensor& dout, const Tensor& S, const Tensor& z, double eps,
                              int64_t map, const Tensor& f, const Tensor& g, const Tensor& a, const Tensor& den,
                              const OptTensor& dq) {
    return VITZOO_DISPATCH(query_grad_step, q, map, q, dout, S, z, eps, f, g, a, den, dq);
  }, nogil);
  m.def("key_value_grad_step", [](const Tensor& k, const Tensor& v, const Tensor& dS, const Tensor& dz, int64_t map,
                                  const Tensor& f, const Tensor& dfk, const OptTensor& dk, const OptTensor& dv) {
    VITZOO_DISPATCH(key_value_grad_step, k, map, k, v, dS, dz, f, dfk, dk, dv);
  }, nogil);
}
