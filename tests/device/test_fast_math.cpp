// test_fast_math.cpp: the CPU backend's branch-free exp and GELU-tanh
// (device/cpu/fast_math.h) against double-precision evaluations, asserting the
// error bounds the header states, over a dense sweep of x in [-20, 20], the
// powers of two down to the subnormals and the special values. GELU is checked
// through CpuDevice's activation ops (the vectorised loops, on 1 and 2 threads)
// and must give the same bits as the scalar functions.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "device/cpu/cpu_device.h"
#include "device/cpu/fast_math.h"
#include "device/tensor.h"

using namespace cleave;

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr float kInf = std::numeric_limits<float>::infinity();

// The tanh argument u(x) and GELU-tanh's two forms in double. The sigmoid form
// x * sigmoid(2u) equals 0.5 x (1 + tanh(u)) exactly, but stays accurate where
// 1 + tanh(u) cancels (u << 0), so it is the reference; the tanh form checks
// it where it is well conditioned.
double ref_u(double x) { return std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x); }
double ref_gelu(double x) {
  const double u = ref_u(x), e = std::exp(-2.0 * std::fabs(u));
  return x * (u < 0 ? e : 1.0) / (1.0 + e);
}
double ref_gelu_tanh_form(double x) { return 0.5 * x * (1.0 + std::tanh(ref_u(x))); }
// The derivative's two terms, sigmoid(2u) and 2 x u'(x) sigmoid(2u) (1 - sigmoid(2u)).
void ref_grad_terms(double x, double& a, double& b) {
  const double u = ref_u(x), e = std::exp(-2.0 * std::fabs(u));
  const double du = std::sqrt(2.0 / kPi) * (1.0 + 3.0 * 0.044715 * x * x);
  a = (u < 0 ? e : 1.0) / (1.0 + e);
  b = 2.0 * x * du * e / ((1.0 + e) * (1.0 + e));
}

// x in [-20, 20] every 2^-17 (5.2 million points), then +-2^-k down to the
// smallest subnormal.
std::vector<float> sweep() {
  std::vector<float> xs;
  for (int64_t i = -20 * (1 << 17); i <= 20 * (1 << 17); ++i) xs.push_back(std::ldexp(static_cast<float>(i), -17));
  for (int k = 0; k <= 149; ++k) {
    xs.push_back(std::ldexp(1.f, -k));
    xs.push_back(-std::ldexp(1.f, -k));
  }
  return xs;
}

bool same_bits(float a, float b) {
  uint32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return ia == ib;
}

// y = gelu_tanh(xs) and dx = gelu_tanh'(xs) (dy = 1) through a CPU device.
void device_gelu(int threads, const std::vector<float>& xs, std::vector<float>& y, std::vector<float>& dx) {
  DeviceOptions opts;
  opts.threads = threads;
  CpuDevice dev(opts);
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor tx(dev, {n}), ty(dev, {n}), tdy(dev, {n}), tdx(dev, {n});
  tx.from_host(xs);
  tdy.from_host(std::vector<float>(xs.size(), 1.f));
  dev.activation_forward(Activation::gelu_tanh, tx, ty);
  dev.activation_backward(Activation::gelu_tanh, tx, ty, tdy, tdx);
  y = ty.to_host();
  dx = tdx.to_host();
}

}  // namespace

TEST_CASE("exp_neg is within 2 ulp of exp while the result is a normal float", "[device][fast_math]") {
  double worst = 0, worst_sub = 0;
  for (int64_t i = 0; i <= 104 * (1 << 16); ++i) {
    const float v = -std::ldexp(static_cast<float>(i), -16);
    const double want = std::exp(static_cast<double>(v));
    const double err = std::fabs(cpu_detail::exp_neg(v) - want);
    if (want >= FLT_MIN)
      worst = std::max(worst, err / want);
    else
      worst_sub = std::max(worst_sub, err);
  }
  INFO("worst relative error " << worst << ", worst absolute error below FLT_MIN " << worst_sub);
  CHECK(worst <= 2 * std::ldexp(1.0, -23));
  CHECK(worst_sub <= std::numeric_limits<float>::denorm_min());
  CHECK(cpu_detail::exp_neg(0.f) == 1.f);
  CHECK(cpu_detail::exp_neg(-104.f) <= std::numeric_limits<float>::denorm_min());
  CHECK(cpu_detail::exp_neg(-200.f) == 0.f);
  CHECK(cpu_detail::exp_neg(-kInf) == 0.f);
}

TEST_CASE("the double references agree where 1 + tanh(u) does not cancel", "[device][fast_math]") {
  for (double x = -3; x <= 20; x += 1.0 / 64)
    REQUIRE(std::fabs(ref_gelu(x) - ref_gelu_tanh_form(x)) <= 1e-13 * std::max(1.0, std::fabs(ref_gelu(x))));
}

TEST_CASE("GELU-tanh forward and backward are within the stated bounds of double precision",
          "[device][fast_math]") {
  const std::vector<float> xs = sweep();
  for (int threads : {1, 2}) {
    INFO(threads << " thread(s)");
    std::vector<float> y, dx;
    device_gelu(threads, xs, y, dx);
    double worst_pos = 0, worst_near = 0, worst_scaled = 0, worst_sub = 0, worst_grad = 0, worst_grad_sub = 0;
    size_t scalar_mismatches = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double x = xs[i], u = ref_u(x), want = ref_gelu(x), err = std::fabs(y[i] - want);
      if (std::fabs(want) >= FLT_MIN) {
        const double rel = err / std::fabs(want);
        if (x >= 0) worst_pos = std::max(worst_pos, rel);
        if (x < 0 && x >= -2) worst_near = std::max(worst_near, rel);
        worst_scaled = std::max(worst_scaled, rel / (1 + 2 * std::fabs(u)));
      } else {
        worst_sub = std::max(worst_sub, err);
      }
      double a, b;
      ref_grad_terms(x, a, b);
      const double mag = std::fabs(a) + std::fabs(b), gerr = std::fabs(dx[i] - (a + b));
      if (mag >= FLT_MIN)
        worst_grad = std::max(worst_grad, gerr / mag / (1 + 2 * std::fabs(u)));
      else
        worst_grad_sub = std::max(worst_grad_sub, gerr);
      if (!same_bits(y[i], cpu_detail::gelu_tanh(xs[i])) || !same_bits(dx[i], cpu_detail::gelu_tanh_grad(xs[i])))
        ++scalar_mismatches;
    }
    INFO("relative error: x >= 0 " << worst_pos << ", x in [-2, 0) " << worst_near << ", scaled by 1 + 2|u| "
                                   << worst_scaled << "; subnormal absolute " << worst_sub);
    INFO("derivative error over term magnitudes and 1 + 2|u| " << worst_grad << "; tiny absolute "
                                                                 << worst_grad_sub);
    CHECK(worst_pos <= 2.5e-7);
    CHECK(worst_near <= 1e-6);
    CHECK(worst_scaled <= 2.5e-7);
    CHECK(worst_sub <= 5e-43);
    CHECK(worst_grad <= 5e-7);
    CHECK(worst_grad_sub <= 5e-43);
    CHECK(scalar_mismatches == 0);
  }
}

TEST_CASE("GELU-tanh's special values", "[device][fast_math]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> xs{0.f, -0.f, kInf, -kInf, nan, FLT_MAX, -FLT_MAX, 1e20f, -1e20f, 1e13f, -1e13f, 50.f, -50.f};
  std::vector<float> y, dx;
  device_gelu(1, xs, y, dx);
  CHECK(same_bits(y[0], 0.f));
  CHECK(same_bits(y[1], -0.f));
  CHECK(dx[0] == 0.5f);
  CHECK(dx[1] == 0.5f);
  CHECK(y[2] == kInf);
  CHECK(dx[2] == 1.f);
  CHECK(y[3] == 0.f);  // the limit, not inf * 0
  CHECK(dx[3] == 0.f);
  CHECK(std::isnan(y[4]));
  CHECK(std::isnan(dx[4]));
  for (size_t i = 5; i < xs.size(); i += 2) {
    INFO("x = " << xs[i] << " and " << xs[i + 1]);
    CHECK(y[i] == xs[i]);
    CHECK(dx[i] == 1.f);
    CHECK(y[i + 1] == 0.f);
    CHECK(dx[i + 1] == 0.f);
  }
}
