// nn_test_util.h: shared helpers for the layer, loss and partition tests: a CPU
// device, random host data, host<->device copies, and a central finite-difference
// gradient checker for any Layer.
//
// The checker uses the scalar L(x, params) = sum_i R_i * y_i for a fixed random
// projection R, so dL/dy = R is what backward receives. Each coordinate's
// numerical derivative is (L(+eps) - L(-eps)) / (2 eps) with the difference taken
// output by output in double precision (unchanged outputs cancel exactly); it is
// compared with the analytical gradient at a relative tolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/nn/layer.h"
#include "device/device.h"

namespace cleave::test {

// One CPU device shared by a test executable (2 threads: the build machine is small).
inline Device& cpu() {
  static std::unique_ptr<Device> d = [] {
    DeviceOptions o;
    o.threads = 2;
    return open_device("cpu", o);
  }();
  return *d;
}

inline std::vector<float> random_normal(Rng& rng, int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * rng.normal();
  return v;
}

// Values with |v| in [0.1, 1): safe from the kink of relu for steps below 0.1.
inline std::vector<float> random_away_from_zero(Rng& rng, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = (rng.uniform() < 0.5f ? -1.0f : 1.0f) * rng.uniform(0.1f, 1.0f);
  return v;
}

// Distinct values at least 0.05 apart (a shuffled ramp): max-pooling picks the
// same argmax under perturbations below 0.025.
inline std::vector<float> random_distinct(Rng& rng, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * (static_cast<float>(i) - static_cast<float>(n) / 2);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
  return v;
}

inline Tensor upload(Device& d, const Shape& shape, const std::vector<float>& host) {
  Tensor t(d, shape);
  t.from_host(host);
  return t;
}

struct GradCheckOptions {
  double eps = 1e-2;
  double rtol = 3e-3;
  double atol = 3e-4;
  uint64_t ctx_seed = 7;  // LayerContext seed (fixes the dropout mask)
  bool check_input = true;  // false for inputs that are not differentiable (token ids)
};

struct GradCheckReport {
  int64_t checked = 0;
  int64_t failures = 0;
  double max_abs_err = 0;
  std::string first_failure;  // "input[3]: numerical 0.12 analytical 0.5"
  bool ok() const { return checked > 0 && failures == 0; }
};

// Checks dx and the parameter gradients of `layer` (built for per-sample shape
// `in`) on batch `batch`, with input values x and parameter values p.
inline GradCheckReport check_gradients(Layer& layer, const Shape& in, int64_t batch, const std::vector<float>& x,
                                       const std::vector<float>& p, Rng& rng, const GradCheckOptions& opt = {}) {
  Device& d = cpu();
  const Shape xs = batched(batch, in);
  const Shape ys = batched(batch, layer.output_shape(in));
  const int64_t np = layer.param_count();
  Tensor params, grads;
  if (np > 0) {
    params = Tensor(d, {np});
    grads = Tensor(d, {np});
    params.from_host(p);
    d.fill(grads, 0.0f);
    layer.bind(params, grads);
  }
  const std::vector<float> r = random_normal(rng, numel(ys));
  Tensor xt = upload(d, xs, x);

  auto forward = [&](const Tensor& xin, LayerContext& ctx) {
    Tensor y(d, ys);
    ctx = LayerContext{};
    ctx.seed = opt.ctx_seed;
    layer.forward(xin, y, ctx, true);
    return y;
  };
  // Analytical gradients.
  LayerContext ctx;
  Tensor y = forward(xt, ctx);
  Tensor dy = upload(d, ys, r);
  Tensor dx(d, xs);
  layer.backward(xt, y, dy, &dx, ctx);
  const std::vector<float> ana_x = dx.to_host();
  const std::vector<float> ana_p = np > 0 ? grads.to_host() : std::vector<float>{};

  // L(+) - L(-), output by output in double.
  auto diff = [&](const std::vector<float>& yp, const std::vector<float>& ym) {
    double s = 0;
    for (size_t i = 0; i < r.size(); ++i) s += static_cast<double>(r[i]) * (double(yp[i]) - double(ym[i]));
    return s;
  };
  GradCheckReport rep;
  auto compare = [&](const std::string& what, size_t i, double num, double ana) {
    const double err = std::fabs(num - ana);
    rep.max_abs_err = std::max(rep.max_abs_err, err);
    ++rep.checked;
    if (err > opt.atol + opt.rtol * std::max(std::fabs(num), std::fabs(ana))) {
      if (rep.failures++ == 0) {
        std::ostringstream m;
        m << what << "[" << i << "]: numerical " << num << " analytical " << ana;
        rep.first_failure = m.str();
      }
    }
  };
  std::vector<float> xv = x;
  for (size_t i = 0; opt.check_input && i < xv.size(); ++i) {
    const float orig = xv[i];
    LayerContext c;
    xv[i] = orig + static_cast<float>(opt.eps);
    const std::vector<float> yp = forward(upload(d, xs, xv), c).to_host();
    xv[i] = orig - static_cast<float>(opt.eps);
    const std::vector<float> ym = forward(upload(d, xs, xv), c).to_host();
    xv[i] = orig;
    const double h = double(orig + static_cast<float>(opt.eps)) - double(orig - static_cast<float>(opt.eps));
    compare("input", i, diff(yp, ym) / h, ana_x[i]);
  }
  std::vector<float> pv = p;
  for (size_t i = 0; i < pv.size(); ++i) {
    const float orig = pv[i];
    LayerContext c;
    pv[i] = orig + static_cast<float>(opt.eps);
    params.from_host(pv);
    const std::vector<float> yp = forward(xt, c).to_host();
    pv[i] = orig - static_cast<float>(opt.eps);
    params.from_host(pv);
    const std::vector<float> ym = forward(xt, c).to_host();
    pv[i] = orig;
    params.from_host(pv);
    const double h = double(orig + static_cast<float>(opt.eps)) - double(orig - static_cast<float>(opt.eps));
    compare("param", i, diff(yp, ym) / h, ana_p[i]);
  }
  return rep;
}

}  // namespace cleave::test
