// Fused CPU kernel of fedaug.layers.functional.restyle with a StatNoise map (FedFA Eq. 2, 3, 7-9;
// VFDA Eq. 6-7): one C++ autograd node per layer instead of ~45 small ATen calls from Python.
//
// x (B, C, N) contiguous, viewed as B*C rows of N positions. Forward:
//   mu = mean(row), sigma = sqrt(var(row) * N / denom_n + eps)                  (Eq. 2)
//   fixed:  z_hat = z + noise * param                                          (FedFA-R)
//   else:   v = sum_b (z_b - mean_b z)^2 / denom_b + extra, f = param * v      (Eq. 3, 7)
//           s = sqrt(f) ("std", Eq. 9) or f ("variance", VFDA Eq. 7); z_hat = z + noise * s
//   y = (x - mu) * (sigma_hat / sigma) + mu_hat                                (Eq. 8)
// Backward: the closed-form vector-Jacobian product documented on StatNoise and _Restyle.
// Every row is reduced serially (fixed order), so results do not depend on the thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kLanes = 16;
constexpr int64_t kBlock = 4096;  // lane sums are flushed to double every kBlock elements

// sum_i term(i) for i < n, in kLanes independent lanes (vectorisable without -ffast-math)
template <typename T, typename Term>
double row_accumulate(int64_t n, Term term) {
  double total = 0.0;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int64_t e = std::min(n, s + kBlock);
    T lane[kLanes] = {};
    int64_t i = s;
    for (; i + kLanes <= e; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lane[l] += term(i + l);
    for (; i < e; ++i) lane[0] += term(i);
    for (int l = 0; l < kLanes; ++l) total += lane[l];
  }
  return total;
}

template <typename T>
double row_sum(const T* p, int64_t n) {
  return row_accumulate<T>(n, [p](int64_t i) { return p[i]; });
}

// sum_i (p[i] - m)^2
template <typename T>
double row_sq_dev(const T* p, int64_t n, T m) {
  return row_accumulate<T>(n, [p, m](int64_t i) {
    const T d = p[i] - m;
    return d * d;
  });
}

// (sum_i g[i], sum_i g[i] (x[i] - m))
template <typename T>
std::pair<double, double> row_grad_sums(const T* g, const T* x, int64_t n, T m) {
  double s0 = 0.0, s1 = 0.0;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int64_t e = std::min(n, s + kBlock);
    T a[kLanes] = {}, b[kLanes] = {};
    int64_t i = s;
    for (; i + kLanes <= e; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        a[l] += g[i + l];
        b[l] += g[i + l] * (x[i + l] - m);
      }
    for (; i < e; ++i) {
      a[0] += g[i];
      b[0] += g[i] * (x[i] - m);
    }
    for (int l = 0; l < kLanes; ++l) {
      s0 += a[l];
      s1 += b[l];
    }
  }
  return {s0, s1};
}

int64_t grain(int64_t n) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1)); }

struct Options {
  bool fixed, std_scale;
  int64_t correction;
  double extra, eps;
  bool unbiased;
};

// Forward; fills y (like x), z (2, B, C), a (B, C), dev (2, B, C) and coef (2, C) (the last two
// only for a variance-driven map).
template <typename T>
void forward_impl(const Tensor& x, const Tensor& noise, const Tensor& param, const Options& o,
                  Tensor& y, Tensor& z, Tensor& a, Tensor& dev, Tensor& coef) {
  const int64_t B = x.size(0), C = x.size(1), R = B * C, N = x.numel() / std::max<int64_t>(R, 1);
  const int64_t denom_n = (o.unbiased && N > 1) ? N - 1 : N;
  const T* xp = x.data_ptr<T>();
  T* zp = z.data_ptr<T>();  // z[0] = mu (R), z[1] = sigma (R)
  at::parallel_for(0, R, grain(N), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = xp + r * N;
      const T m = static_cast<T>(row_sum(row, N) / N);
      const double var = row_sq_dev(row, N, m) / denom_n;
      zp[r] = m;
      zp[R + r] = static_cast<T>(std::sqrt(var + o.eps));
    }
  });
  // the (B, C) map: z_hat = z + noise * s
  std::vector<T> zhat(2 * R);
  const T* np = noise.data_ptr<T>();
  const T* pp = param.data_ptr<T>();  // (2, C)
  if (o.fixed) {
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = k * R + b * C + c;
          zhat[i] = zp[i] + np[i] * pp[k * C + c];
        }
  } else {
    const int64_t denom_b = std::max<int64_t>(B - o.correction, 1);
    T* dp = dev.data_ptr<T>();
    T* cp = coef.data_ptr<T>();
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t c = 0; c < C; ++c) {
        double mean = 0.0;
        for (int64_t b = 0; b < B; ++b) mean += zp[k * R + b * C + c];
        mean /= B;
        double ss = 0.0;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t i = k * R + b * C + c;
          dp[i] = static_cast<T>(zp[i] - mean);
          ss += static_cast<double>(dp[i]) * dp[i];
        }
        const double mult = pp[k * C + c];
        const double f = mult * (ss / denom_b + o.extra);
        double s, cf;
        if (o.std_scale) {
          s = std::sqrt(f);
          cf = s > 0.0 ? mult / (s * denom_b) : 0.0;
          if (!std::isfinite(cf)) cf = 0.0;
        } else {
          s = f;
          cf = mult * 2.0 / denom_b;
        }
        cp[k * C + c] = static_cast<T>(cf);
        for (int64_t b = 0; b < B; ++b) {
          const int64_t i = k * R + b * C + c;
          zhat[i] = static_cast<T>(zp[i] + np[i] * static_cast<T>(s));
        }
      }
  }
  T* ap = a.data_ptr<T>();
  for (int64_t r = 0; r < R; ++r) ap[r] = zhat[R + r] / zp[R + r];
  T* yp = y.data_ptr<T>();
  at::parallel_for(0, R, grain(N), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T m = zp[r], w = ap[r], bias = zhat[r];
      const T* xr = xp + r * N;
      T* yr = yp + r * N;
      for (int64_t i = 0; i < N; ++i) yr[i] = (xr[i] - m) * w + bias;
    }
  });
}

template <typename T>
Tensor backward_impl(const Tensor& gy, const Tensor& x, const Tensor& z, const Tensor& a,
                     const Tensor& noise, const Tensor& dev, const Tensor& coef, const Options& o) {
  const int64_t B = x.size(0), C = x.size(1), R = B * C, N = x.numel() / std::max<int64_t>(R, 1);
  const int64_t denom_n = (o.unbiased && N > 1) ? N - 1 : N;
  const T *gp = gy.data_ptr<T>(), *xp = x.data_ptr<T>(), *zp = z.data_ptr<T>(), *ap = a.data_ptr<T>();
  // g_hat = (dL/dmu_hat, dL/dsigma_hat) = (sum g, sum g (x - mu) / sigma)
  std::vector<T> gh(2 * R);
  at::parallel_for(0, R, grain(N), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const auto sums = row_grad_sums(gp + r * N, xp + r * N, N, zp[r]);
      gh[r] = static_cast<T>(sums.first);
      gh[R + r] = static_cast<T>(sums.second / zp[R + r]);
    }
  });
  // g_z = vjp(g_hat) - a * g_hat
  std::vector<T> gz(gh);
  if (!o.fixed) {
    const T *np = noise.data_ptr<T>(), *dp = dev.data_ptr<T>(), *cp = coef.data_ptr<T>();
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t c = 0; c < C; ++c) {
        double dot = 0.0;
        for (int64_t b = 0; b < B; ++b) dot += static_cast<double>(gh[k * R + b * C + c]) * np[k * R + b * C + c];
        const T w = static_cast<T>(dot) * cp[k * C + c];
        for (int64_t b = 0; b < B; ++b) gz[k * R + b * C + c] += dp[k * R + b * C + c] * w;
      }
  }
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t r = 0; r < R; ++r) gz[k * R + r] -= gh[k * R + r] * ap[r];
  // dx = g a + k1 (x - mu) + k0, k1 = g_sigma / (sigma denom_n), k0 = g_mu / N
  Tensor gx = at::empty_like(x);
  T* gxp = gx.data_ptr<T>();
  at::parallel_for(0, R, grain(N), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T m = zp[r], w = ap[r];
      const T k1 = gz[R + r] / zp[R + r] / static_cast<T>(denom_n);
      const T k0 = gz[r] / static_cast<T>(N);
      const T *gr = gp + r * N, *xr = xp + r * N;
      T* out = gxp + r * N;
      for (int64_t i = 0; i < N; ++i) out[i] = gr[i] * w + k1 * (xr[i] - m) + k0;
    }
  });
  return gx;
}

class Restyle : public torch::autograd::Function<Restyle> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& noise,
                               const Tensor& param, bool fixed, bool std_scale, int64_t correction,
                               double extra, double eps, bool unbiased) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const Tensor x = x_in.contiguous();
    const Options o{fixed, std_scale, correction, extra, eps, unbiased};
    const int64_t B = x.size(0), C = x.size(1);
    Tensor y = at::empty_like(x), z = at::empty({2, B, C}, x.options());
    Tensor a = at::empty({B, C}, x.options());
    Tensor dev = fixed ? at::Tensor() : at::empty({2, B, C}, x.options());
    Tensor coef = fixed ? at::Tensor() : at::empty({2, C}, x.options());
    const Tensor nz = noise.contiguous(), pr = param.contiguous();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ffa_restyle_forward",
                               [&] { forward_impl<scalar_t>(x, nz, pr, o, y, z, a, dev, coef); });
    ctx->save_for_backward({x, z, a, nz, dev, coef});
    ctx->saved_data["fixed"] = fixed;
    ctx->saved_data["std_scale"] = std_scale;
    ctx->saved_data["correction"] = correction;
    ctx->saved_data["extra"] = extra;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["unbiased"] = unbiased;
    ctx->mark_non_differentiable({z});
    return {y, z};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Options o{ctx->saved_data["fixed"].toBool(), ctx->saved_data["std_scale"].toBool(),
                    ctx->saved_data["correction"].toInt(), ctx->saved_data["extra"].toDouble(),
                    ctx->saved_data["eps"].toDouble(), ctx->saved_data["unbiased"].toBool()};
    const Tensor gy = grads[0].contiguous();
    Tensor gx;
    AT_DISPATCH_FLOATING_TYPES(gy.scalar_type(), "ffa_restyle_backward", [&] {
      gx = backward_impl<scalar_t>(gy, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], o);
    });
    return {gx, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> ffa_restyle(const Tensor& x, const Tensor& noise, const Tensor& param, bool fixed,
                                       bool std_scale, int64_t correction, double extra, double eps,
                                       bool unbiased) {
  const auto out = Restyle::apply(x, noise, param, fixed, std_scale, correction, extra, eps, unbiased);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY(fedaug, m) {
  m.def("ffa_restyle(Tensor x, Tensor noise, Tensor param, bool fixed, bool std_scale, int correction, "
        "float extra, float eps, bool unbiased) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fedaug, CompositeImplicitAutograd, m) { m.impl("ffa_restyle", ffa_restyle); }
