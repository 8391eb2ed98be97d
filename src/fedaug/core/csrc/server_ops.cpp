// The server's arithmetic on uploads, each in one pass over the data (fedaug.core.server_ops).
//
// weighted_sum: acc_i = sum_k w_k * (double) x_k[i], accumulated in client order with two roundings
// per term (the product, then the sum: compiled with -ffp-contract=off, so no fused multiply-add),
// exactly as fedavg's PyTorch path computes it (zeros, then acc += double(x_k) * w_k). The elements
// are taken in chunks that stay in the L2 cache while every client's chunk is added, eight clients a
// pass: each upload is read once and the float64 accumulator is written once per eight clients,
// instead of three passes per client.
//
// upload_stats: for pairs (t, r) of float32 tensors, sum_i (double)(t_i - r_i)^2 with t_i - r_i
// rounded to float32 and the (exact) squares summed in float64 in a fixed order (16 lanes, then a
// fixed tree), plus min and max of t, in one pass; NaN for all three where t holds a NaN or an infinity.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using at::Tensor;

constexpr int64_t kChunk = 16384;  // float64 accumulator elements (128 KB) kept in L2 while the clients are added
constexpr int kBlock = 8;          // clients added per pass over a chunk of the accumulator

// acc[i] = (((acc[i] + x_k[i] w_k) + x_k+1[i] w_k+1) + ...): the same two roundings per client in client order
// as one client a pass, with the accumulator read and written once per block of clients instead of once per
// client (the loop's loads and stores, not the memory, bound it: W2's uploads ~2x faster on an AMD EPYC).
template <typename T, int B>
inline void add_block(double* a, const T* const* xs, const double* ws, int64_t start, int64_t len) {
  const T* x[B];
  double w[B];
  for (int j = 0; j < B; ++j) {
    x[j] = xs[j] + start;
    w[j] = ws[j];
  }
  for (int64_t i = 0; i < len; ++i) {
    double s = a[i];
    for (int j = 0; j < B; ++j) s = s + static_cast<double>(x[j][i]) * w[j];
    a[i] = s;
  }
}

template <typename T>
void accumulate(double* acc, const std::vector<const T*>& xs, const std::vector<double>& ws, int64_t n) {
  const int64_t clients = static_cast<int64_t>(xs.size());
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t len = std::min(kChunk, n - start);
    double* a = acc + start;
    for (int64_t i = 0; i < len; ++i) a[i] = 0.0;
    int64_t k = 0;
    for (; k + kBlock <= clients; k += kBlock) add_block<T, kBlock>(a, xs.data() + k, ws.data() + k, start, len);
    for (; k < clients; ++k) add_block<T, 1>(a, xs.data() + k, ws.data() + k, start, len);
  }
}

Tensor weighted_sum(const std::vector<Tensor>& tensors, const std::vector<double>& weights) {
  TORCH_CHECK(!tensors.empty() && tensors.size() == weights.size(), "weighted_sum: ", tensors.size(),
              " tensors and ", weights.size(), " weights");
  const auto dtype = tensors[0].scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "weighted_sum: float32 or float64 tensors, got ", dtype);
  for (const auto& t : tensors) {
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == dtype && t.sizes() == tensors[0].sizes(),
                "weighted_sum: contiguous CPU tensors of one dtype and shape");
  }
  Tensor acc = at::empty(tensors[0].sizes(), tensors[0].options().dtype(at::kDouble));
  const int64_t n = acc.numel();
  if (dtype == at::kFloat) {
    std::vector<const float*> xs;
    for (const auto& t : tensors) xs.push_back(t.data_ptr<float>());
    accumulate(acc.data_ptr<double>(), xs, weights, n);
  } else {
    std::vector<const double*> xs;
    for (const auto& t : tensors) xs.push_back(t.data_ptr<double>());
    accumulate(acc.data_ptr<double>(), xs, weights, n);
  }
  return acc;
}

// GCC/Clang vector types: elementwise semantics on every CPU, whatever its vector width.
typedef float f8 __attribute__((vector_size(32)));
typedef double d8 __attribute__((vector_size(64)));

template <typename V>
V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

// One pass over x and y (16 elements a step): sum_i (double)(x_i - y_i)^2 with each difference
// rounded to float32, in 16 lanes (element i goes to lane i % 16, the tail to lane 0), each a serial
// sum (two chains of 8 lanes keep the adds in flight), then a fixed tree: the same bits on every CPU.
// Also min and max of x, and whether x holds a NaN or an infinity (then v * 0 is NaN in some lane).
struct Stats {
  double squares;
  float lo, hi;
  bool finite;
};

Stats pass(const float* x, const float* y, int64_t n) {
  d8 acc[2] = {};  // lanes 0-7 and 8-15
  f8 lo = f8{} + x[0], hi = lo, probe = {};
  const int64_t body = n - n % 16;
  for (int64_t i = 0; i < body; i += 16) {
    const f8 v0 = load<f8>(x + i), v1 = load<f8>(x + i + 8);
    const f8 d0 = v0 - load<f8>(y + i), d1 = v1 - load<f8>(y + i + 8);
    const d8 a = __builtin_convertvector(d0, d8), c = __builtin_convertvector(d1, d8);
    acc[0] += a * a;  // exact squares: a fused add would change nothing
    acc[1] += c * c;
    lo = v0 < lo ? v0 : lo;
    lo = v1 < lo ? v1 : lo;
    hi = v0 > hi ? v0 : hi;
    hi = v1 > hi ? v1 : hi;
    probe += v0 * 0.0f + v1 * 0.0f;
  }
  Stats s{0.0, lo[0], hi[0], true};
  float bad = 0.0f;
  for (int j = 0; j < 8; ++j) {
    s.lo = std::min(s.lo, lo[j]);
    s.hi = std::max(s.hi, hi[j]);
    bad += probe[j];
  }
  for (int64_t i = body; i < n; ++i) {
    const float d = x[i] - y[i];
    acc[0][0] += static_cast<double>(d) * static_cast<double>(d);
    s.lo = std::min(s.lo, x[i]);
    s.hi = std::max(s.hi, x[i]);
    bad += x[i] * 0.0f;
  }
  double lane[16];
  std::memcpy(lane, acc, sizeof(lane));
  for (int width = 16; width > 1; width /= 2) {  // the fixed tree: lane j += lane j + width/2
    for (int j = 0; j < width / 2; ++j) lane[j] += lane[j + width / 2];
  }
  s.squares = lane[0];
  s.finite = !std::isnan(bad);
  return s;
}

Tensor upload_stats(const std::vector<Tensor>& ts, const std::vector<Tensor>& rs) {
  TORCH_CHECK(ts.size() == rs.size(), "upload_stats: ", ts.size(), " uploads and ", rs.size(), " references");
  Tensor out = at::empty({static_cast<int64_t>(ts.size()), 3}, at::TensorOptions().dtype(at::kDouble));
  double* o = out.data_ptr<double>();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t k = 0; k < ts.size(); ++k) {
    const Tensor& t = ts[k];
    const Tensor& r = rs[k];
    TORCH_CHECK(t.device().is_cpu() && r.device().is_cpu() && t.is_contiguous() && r.is_contiguous() &&
                t.scalar_type() == at::kFloat && r.scalar_type() == at::kFloat && t.numel() == r.numel() &&
                t.numel() > 0, "upload_stats: non-empty contiguous float32 CPU pairs of equal size");
    const Stats st = pass(t.data_ptr<float>(), r.data_ptr<float>(), t.numel());
    o[3 * k] = st.finite ? st.squares : nan;
    o[3 * k + 1] = st.finite ? static_cast<double>(st.lo) : nan;
    o[3 * k + 2] = st.finite ? static_cast<double>(st.hi) : nan;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(fedaug_server, m) {
  m.def("weighted_sum(Tensor[] tensors, float[] weights) -> Tensor");
  m.def("upload_stats(Tensor[] uploads, Tensor[] references) -> Tensor");
}

TORCH_LIBRARY_IMPL(fedaug_server, CPU, m) {
  m.impl("weighted_sum", weighted_sum);
  m.impl("upload_stats", upload_stats);
}
