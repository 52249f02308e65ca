// test_opencl_parity.cpp: every Device op on the OpenCL backend against the CPU
// backend (the ground truth), forward and backward, on random shapes including
// odd and size-1 dimensions, plus device choice, memory limits and the on-disk
// program cache.
//
// Every tensor is a view placed at a random element offset inside a larger
// buffer whose other elements hold a guard value; after each op the guards are
// checked, so a kernel that ignores an offset or writes out of bounds fails.
//
// Tolerance per op, |opencl - cpu| <= atol + rtol * |cpu| (docs/backends.md):
//   exact (0, 0):         fill, copy, im2col, swap_axes01, maxpool forward values
//                         and indices, maxpool backward, argmax_match, relu
//   elementwise (1e-6, 1e-7): axpy, scale, mul, add_bias_*, sgd_step
//   transcendental (2e-5, 1e-6): gelu, tanh, gelu_tanh, softmax_xent, layernorm,
//                         adam_step, causal_softmax forward (backward: atol
//                         1e-6 * max|cpu|, its row dot product)
//   exact also: embedding forward and backward (the same sums in the same order)
//   reductions (1e-5, 1e-5 * max|cpu|): bias_grad_*, col2im, avgpool, mse,
//                         layernorm dgamma/dbeta, sum_squares
//   gemm (1e-5, 2e-6 * k * max|a| * max|b|)
//
// When no OpenCL device can be opened every test skips (CLEAVE_SKIP: "Skipped" in CTest). The
// device is opened once per process (a function-local static) with its program
// cache in the build tree, so only the very first run compiles the kernels.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/backends.h"
#include "device/device.h"
#include "device/opencl/opencl_device.h"
#include "device/opencl/program_cache.h"
#include "device/tensor.h"
#include "skip.h"

using namespace cleave;

namespace {

using Vec = std::vector<float>;
constexpr float kGuard = -12345.5f;

struct Tol {
  double rtol, atol;
};
constexpr Tol kExact{0, 0};
constexpr Tol kElementwise{1e-6, 1e-7};
constexpr Tol kTranscendental{2e-5, 1e-6};

std::string program_cache_dir() { return std::string(CLEAVE_BINARY_DIR) + "/opencl-program-cache"; }

// The devices shared by all test cases of this process (PoCL compiles slowly).
struct Devices {
  std::unique_ptr<Device> cpu;
  std::unique_ptr<OpenclDevice> cl;
  std::string skip_reason;
};

Devices& devices() {
  static Devices d = [] {
    Devices out;
    out.cpu = open_device("cpu", DeviceOptions{});
    DeviceOptions opts;
    opts.cache_dir = program_cache_dir();
    try {
      out.cl = std::make_unique<OpenclDevice>(opts, false);
    } catch (const std::exception& e) {
      out.skip_reason = e.what();
    }
    return out;
  }();
  return d;
}

// Absence of OpenCL (no platform, no device) skips; any other failure to open
// the device (a kernel that does not compile, ...) fails the test.
bool opencl_absent(const std::string& why) {
  return why.find("no OpenCL platform found") != std::string::npos ||
         why.find("no usable OpenCL device") != std::string::npos;
}

#define CLEAVE_NEED_OPENCL()                                                     \
  Devices& devs = devices();                                                     \
  if (!devs.cl) {                                                                \
    if (!opencl_absent(devs.skip_reason)) FAIL(devs.skip_reason);                \
    CLEAVE_SKIP("no OpenCL device could be opened: " << devs.skip_reason);       \
  }                                                                              \
  Device& cpu = *devs.cpu;                                                       \
  OpenclDevice& cl = *devs.cl;                                                   \
  (void)cpu;                                                                     \
  (void)cl

Vec random_vec(std::mt19937& rng, int64_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A tensor placed `offset` elements into a buffer with `tail` guard elements after it.
struct Placed {
  Tensor base, t;
  int64_t offset = 0;
};

Placed place(Device& dev, const Shape& shape, const Vec& data, int64_t offset, int64_t tail) {
  const int64_t n = numel(shape);
  REQUIRE(static_cast<int64_t>(data.size()) == n);
  Placed p;
  p.offset = offset;
  p.base = Tensor(dev, {offset + n + tail});
  Vec full(static_cast<size_t>(offset + n + tail), kGuard);
  std::copy(data.begin(), data.end(), full.begin() + offset);
  p.base.from_host(full);
  p.t = Tensor::view(p.base, offset, shape);
  return p;
}

// The same data on both devices, at the same random offset.
struct Both {
  Placed cpu, cl;
  const Tensor& a() const { return cpu.t; }  // CPU tensor
  const Tensor& b() const { return cl.t; }   // OpenCL tensor
};

struct Rig {
  Device& cpu;
  Device& cl;
  std::mt19937 rng;

  Both make(const Shape& shape, const Vec& data) {
    const int64_t offset = pick(rng, 0, 9), tail = pick(rng, 0, 5);
    return Both{place(cpu, shape, data, offset, tail), place(cl, shape, data, offset, tail)};
  }
  Both random(const Shape& shape, float lo = -1.f, float hi = 1.f) { return make(shape, random_vec(rng, numel(shape), lo, hi)); }
  Both zeros(const Shape& shape) { return make(shape, Vec(static_cast<size_t>(numel(shape)), 0.f)); }
  Both garbage(const Shape& shape) {  // outputs that the op must overwrite
    return make(shape, Vec(static_cast<size_t>(numel(shape)), std::numeric_limits<float>::quiet_NaN()));
  }
};

void check_guards(const Placed& p, const std::string& what) {
  const Vec full = p.base.to_host();
  const int64_t n = p.t.numel();
  int64_t bad = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(full.size()); ++i)
    if ((i < p.offset || i >= p.offset + n) && full[static_cast<size_t>(i)] != kGuard) ++bad;
  INFO(what << ": elements outside the view were modified");
  CHECK(bad == 0);
}

// Compares the OpenCL result with the CPU result element by element.
void expect_close(const Both& t, Tol tol, const std::string& what) {
  const Vec want = t.a().to_host();
  const Vec got = t.b().to_host();
  REQUIRE(want.size() == got.size());
  double worst = 0;
  int64_t worst_i = -1, bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) {
        ++bad;
        if (worst_i < 0) worst_i = static_cast<int64_t>(i);
      }
      continue;
    }
    const double err = std::fabs(g - w);
    if (err > tol.atol + tol.rtol * std::fabs(w)) {
      ++bad;
      if (err > worst || worst_i < 0) {
        worst = err;
        worst_i = static_cast<int64_t>(i);
      }
    }
  }
  if (bad > 0) {
    const size_t i = static_cast<size_t>(worst_i);
    FAIL_CHECK(what << ": " << bad << " of " << want.size() << " elements differ; worst at " << worst_i << ": opencl "
                    << got[i] << " vs cpu " << want[i] << " (rtol " << tol.rtol << ", atol " << tol.atol << ")");
  }
  check_guards(t.cpu, what + " (cpu)");
  check_guards(t.cl, what + " (opencl)");
}

float max_abs(const Tensor& t) {
  float m = 0;
  for (float v : t.to_host())
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

Tol reduction_tol(const Both& t) { return Tol{1e-5, 1e-5 * std::max(1.f, max_abs(t.a()))}; }

std::string window_str(const Window2d& g) {
  return "n" + std::to_string(g.n) + " c" + std::to_string(g.c) + " " + std::to_string(g.h) + "x" +
         std::to_string(g.w) + " k" + std::to_string(g.kh) + "x" + std::to_string(g.kw) + " s" +
         std::to_string(g.sh) + "x" + std::to_string(g.sw) + " p" + std::to_string(g.ph) + "x" + std::to_string(g.pw);
}

// Random valid windows: odd sizes, strides 1..3, padding up to half the kernel.
Window2d random_window(std::mt19937& rng) {
  Window2d g;
  g.n = pick(rng, 1, 3);
  g.c = pick(rng, 1, 4);
  g.kh = pick(rng, 1, 5);
  g.kw = pick(rng, 1, 4);
  g.sh = pick(rng, 1, 3);
  g.sw = pick(rng, 1, 3);
  g.ph = pick(rng, 0, g.kh / 2);
  g.pw = pick(rng, 0, g.kw / 2);
  g.h = pick(rng, std::max<int64_t>(1, g.kh - 2 * g.ph), 13);
  g.w = pick(rng, std::max<int64_t>(1, g.kw - 2 * g.pw), 11);
  return g;
}

}  // namespace

TEST_CASE("opencl device opens and describes itself", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  CHECK(cl.backend() == Backend::opencl);
  CHECK_FALSE(cl.host_accessible());
  CHECK(cl.name().rfind("opencl (", 0) == 0);
  const MemoryInfo mem = cl.memory();
  CHECK(mem.total > 0);
  CHECK(mem.free <= mem.total);
  INFO("program from cache: " << cl.program_from_cache() << ", build " << cl.program_build_seconds() << " s, file "
                              << cl.program_cache_file());
  CHECK(std::filesystem::exists(cl.program_cache_file()));
  // Host-only helpers refuse politely.
  Tensor t(cl, {4});
  CHECK_THROWS_AS(t.host_data(), std::logic_error);
}

TEST_CASE("opencl upload, download, copy and fill at offsets", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(11)};
  for (int64_t n : {1, 7, 64, 1000, 4097}) {
    Both x = rig.random({n});
    expect_close(x, kExact, "upload/download n=" + std::to_string(n));
    Both y = rig.garbage({n});
    cpu.copy(x.a(), y.a());
    cl.copy(x.b(), y.b());
    expect_close(y, kExact, "copy n=" + std::to_string(n));
    cpu.fill(y.a(), 0.25f);
    cl.fill(y.b(), 0.25f);
    expect_close(y, kExact, "fill n=" + std::to_string(n));
  }
  // Overlapping copy inside one buffer has memmove semantics.
  Vec data = random_vec(rig.rng, 40);
  Tensor base_cpu(cpu, {40}), base_cl(cl, {40});
  base_cpu.from_host(data);
  base_cl.from_host(data);
  cpu.copy(Tensor::view(base_cpu, 0, {30}), Tensor::view(base_cpu, 7, {30}));
  cl.copy(Tensor::view(base_cl, 0, {30}), Tensor::view(base_cl, 7, {30}));
  CHECK(base_cl.to_host() == base_cpu.to_host());
  // Zero-sized tensors are no-ops.
  Tensor empty(cl, {0});
  cl.fill(empty, 1.f);
  CHECK(empty.to_host().empty());
}

TEST_CASE("opencl gemm: all transposes, leading dimensions and offsets", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(21)};
  struct Case {
    int64_t m, n, k;
  };
  std::vector<Case> cases = {{1, 1, 1}, {3, 5, 7}, {17, 1, 9}, {1, 13, 4}, {33, 31, 29}, {64, 48, 32}, {130, 97, 75}};
  for (int i = 0; i < 4; ++i) cases.push_back({pick(rig.rng, 1, 70), pick(rig.rng, 1, 70), pick(rig.rng, 1, 70)});
  for (const Case& cs : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t ra = ta ? cs.k : cs.m, ca = ta ? cs.m : cs.k;
        const int64_t rb = tb ? cs.n : cs.k, cb = tb ? cs.k : cs.n;
        const int64_t lda = ca + pick(rig.rng, 0, 3), ldb = cb + pick(rig.rng, 0, 3), ldc = cs.n + pick(rig.rng, 0, 3);
        Both a = rig.random({(ra - 1) * lda + ca});
        Both b = rig.random({(rb - 1) * ldb + cb});
        const bool beta_zero = pick(rig.rng, 0, 2) == 0;
        const float alpha = std::uniform_real_distribution<float>(-2.f, 2.f)(rig.rng);
        const float beta = beta_zero ? 0.f : std::uniform_real_distribution<float>(-1.f, 1.f)(rig.rng);
        // beta == 0 must ignore C completely, even NaN in it.
        Both c = beta_zero ? rig.garbage({(cs.m - 1) * ldc + cs.n}) : rig.random({(cs.m - 1) * ldc + cs.n});
        cpu.gemm(ta, tb, cs.m, cs.n, cs.k, alpha, a.a(), lda, b.a(), ldb, beta, c.a(), ldc);
        cl.gemm(ta, tb, cs.m, cs.n, cs.k, alpha, a.b(), lda, b.b(), ldb, beta, c.b(), ldc);
        const std::string what = "gemm m" + std::to_string(cs.m) + " n" + std::to_string(cs.n) + " k" +
                                 std::to_string(cs.k) + (ta ? " A^T" : "") + (tb ? " B^T" : "") +
                                 (beta_zero ? " beta=0" : "");
        // The padding columns of C (between n and ldc) hold NaN when beta == 0 on both sides alike.
        expect_close(c, Tol{1e-5, 2e-6 * static_cast<double>(cs.k) * std::fabs(alpha)}, what);
      }
    }
  }
  // k == 0: C := beta * C.
  Both c = rig.random({3 * 5});
  cpu.gemm(false, false, 3, 5, 0, 1.f, c.a(), 1, c.a(), 5, 0.5f, c.a(), 5);
  cl.gemm(false, false, 3, 5, 0, 1.f, c.b(), 1, c.b(), 5, 0.5f, c.b(), 5);
  expect_close(c, kExact, "gemm k=0");
  // Bad leading dimensions are refused with a message.
  CHECK_THROWS_WITH(cl.gemm(false, false, 4, 4, 4, 1.f, c.b(), 3, c.b(), 4, 0.f, c.b(), 4),
                    Catch::Contains("leading dimension"));
}

TEST_CASE("opencl elementwise ops and activations", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(31)};
  for (int64_t n : {1, 5, 63, 65, 1001, 40000}) {
    const std::string sz = " n=" + std::to_string(n);
    Both x = rig.random({n}, -3.f, 3.f), y = rig.random({n}, -3.f, 3.f);
    cpu.axpy(-0.75f, x.a(), y.a());
    cl.axpy(-0.75f, x.b(), y.b());
    expect_close(y, kElementwise, "axpy" + sz);
    cpu.scale(y.a(), 1.5f);
    cl.scale(y.b(), 1.5f);
    expect_close(y, kElementwise, "scale" + sz);
    Both out = rig.garbage({n});
    cpu.mul(x.a(), y.a(), out.a());
    cl.mul(x.b(), y.b(), out.b());
    expect_close(out, kElementwise, "mul" + sz);

    for (Activation act : {Activation::relu, Activation::gelu, Activation::tanh, Activation::gelu_tanh}) {
      const std::string name = act == Activation::relu   ? "relu"
                               : act == Activation::gelu ? "gelu"
                               : act == Activation::tanh ? "tanh"
                                                         : "gelu_tanh";
      const Tol tol = act == Activation::relu ? kExact : kTranscendental;
      Both fx = rig.garbage({n});
      cpu.activation_forward(act, x.a(), fx.a());
      cl.activation_forward(act, x.b(), fx.b());
      expect_close(fx, tol, name + " forward" + sz);
      Both dy = rig.random({n}), dx = rig.garbage({n});
      cpu.activation_backward(act, x.a(), fx.a(), dy.a(), dx.a());
      cl.activation_backward(act, x.b(), fx.b(), dy.b(), dx.b());
      expect_close(dx, tol, name + " backward" + sz);
      if (act == Activation::relu) {  // relu backward from y alone
        Both dx2 = rig.garbage({n});
        cpu.activation_backward(act, Tensor(), fx.a(), dy.a(), dx2.a());
        cl.activation_backward(act, Tensor(), fx.b(), dy.b(), dx2.b());
        expect_close(dx2, kExact, "relu backward from y" + sz);
      }
    }
  }
  // In place (out aliases an input element for element).
  Both x = rig.random({333}, -2.f, 2.f);
  cpu.activation_forward(Activation::gelu, x.a(), x.a());
  cl.activation_forward(Activation::gelu, x.b(), x.b());
  expect_close(x, kTranscendental, "gelu in place");
  Both xt = rig.random({333}, -6.f, 6.f);
  cpu.activation_forward(Activation::gelu_tanh, xt.a(), xt.a());
  cl.activation_forward(Activation::gelu_tanh, xt.b(), xt.b());
  expect_close(xt, kTranscendental, "gelu_tanh in place");
}

TEST_CASE("opencl bias over rows and channels, forward and backward", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(41)};
  for (int iter = 0; iter < 6; ++iter) {
    const int64_t rows = iter == 0 ? 1 : pick(rig.rng, 1, 300), features = iter == 1 ? 1 : pick(rig.rng, 1, 130);
    const std::string sz = " " + std::to_string(rows) + "x" + std::to_string(features);
    Both y = rig.random({rows, features}), b = rig.random({features});
    cpu.add_bias_rows(y.a(), b.a(), rows, features);
    cl.add_bias_rows(y.b(), b.b(), rows, features);
    expect_close(y, kElementwise, "add_bias_rows" + sz);
    Both db = rig.random({features});  // accumulates
    cpu.bias_grad_rows(y.a(), db.a(), rows, features);
    cl.bias_grad_rows(y.b(), db.b(), rows, features);
    expect_close(db, reduction_tol(db), "bias_grad_rows" + sz);

    const int64_t n = pick(rig.rng, 1, 9), c = pick(rig.rng, 1, 17), hw = iter == 2 ? 1 : pick(rig.rng, 1, 800);
    const std::string csz = " n" + std::to_string(n) + " c" + std::to_string(c) + " hw" + std::to_string(hw);
    Both yc = rig.random({n, c, hw}), bc = rig.random({c});
    cpu.add_bias_channels(yc.a(), bc.a(), n, c, hw);
    cl.add_bias_channels(yc.b(), bc.b(), n, c, hw);
    expect_close(yc, kElementwise, "add_bias_channels" + csz);
    Both dbc = rig.random({c});
    cpu.bias_grad_channels(yc.a(), dbc.a(), n, c, hw);
    cl.bias_grad_channels(yc.b(), dbc.b(), n, c, hw);
    expect_close(dbc, reduction_tol(dbc), "bias_grad_channels" + csz);
  }
  // A CNN-sized channel gradient (64 x 32 x 28 x 28).
  Both dy = rig.random({64, 32, 784}), db = rig.zeros({32});
  cpu.bias_grad_channels(dy.a(), db.a(), 64, 32, 784);
  cl.bias_grad_channels(dy.b(), db.b(), 64, 32, 784);
  expect_close(db, reduction_tol(db), "bias_grad_channels 64x32x784");
}

TEST_CASE("opencl im2col, col2im and swap_axes01", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(51)};
  std::vector<Window2d> windows;
  windows.push_back(Window2d{2, 3, 8, 8, 3, 3, 1, 1, 1, 1});  // "same" 3x3
  windows.push_back(Window2d{1, 1, 5, 7, 5, 5, 1, 1, 2, 2});  // kernel as big as the padded image
  windows.push_back(Window2d{3, 2, 9, 6, 2, 3, 2, 3, 0, 1});  // strided, non-square
  windows.push_back(Window2d{1, 1, 1, 1, 1, 1, 1, 1, 0, 0});  // 1x1
  for (int i = 0; i < 8; ++i) windows.push_back(random_window(rig.rng));
  for (const Window2d& g : windows) {
    const std::string w = " " + window_str(g);
    const int64_t oh = g.out_h(), ow = g.out_w();
    Both x = rig.random({g.n, g.c, g.h, g.w});
    Both cols = rig.garbage({g.c * g.kh * g.kw, g.n * oh * ow});
    cpu.im2col(x.a(), cols.a(), g);
    cl.im2col(x.b(), cols.b(), g);
    expect_close(cols, kExact, "im2col" + w);
    Both dcols = rig.random({g.c * g.kh * g.kw, g.n * oh * ow});
    Both dx = rig.garbage({g.n, g.c, g.h, g.w});
    cpu.col2im(dcols.a(), dx.a(), g);
    cl.col2im(dcols.b(), dx.b(), g);
    expect_close(dx, reduction_tol(dx), "col2im" + w);
  }
  for (int i = 0; i < 6; ++i) {
    const int64_t a = pick(rig.rng, 1, 40), b = pick(rig.rng, 1, 40), r = i == 0 ? 1 : pick(rig.rng, 1, 50);
    Both src = rig.random({a, b, r}), dst = rig.garbage({b, a, r});
    cpu.swap_axes01(src.a(), dst.a(), a, b, r);
    cl.swap_axes01(src.b(), dst.b(), a, b, r);
    expect_close(dst, kExact, "swap_axes01 " + std::to_string(a) + "x" + std::to_string(b) + "x" + std::to_string(r));
  }
  Window2d bad{1, 1, 2, 2, 5, 5, 1, 1, 0, 0};  // kernel larger than the image
  Tensor x(cl, {4}), cols(cl, {100});
  CHECK_THROWS_WITH(cl.im2col(x, cols, bad), Catch::Contains("invalid window"));
}

TEST_CASE("opencl conv2d forward and backward (the portable lowering) against the cpu's own", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(53)};
  std::vector<Window2d> windows;
  windows.push_back(Window2d{5, 3, 8, 8, 3, 3, 1, 1, 1, 1});  // "same" 3x3
  windows.push_back(Window2d{3, 4, 6, 5, 1, 1, 1, 1, 0, 0});  // pointwise
  for (int i = 0; i < 6; ++i) windows.push_back(random_window(rig.rng));
  for (const Window2d& g : windows) {
    const int64_t oc = pick(rig.rng, 1, 9), ckk = g.c * g.kh * g.kw, oh = g.out_h(), ow = g.out_w();
    const bool bias = oc % 2 == 1;
    const std::string w = " " + window_str(g) + " oc" + std::to_string(oc);
    Both x = rig.random({g.n, g.c, g.h, g.w}), wt = rig.random({oc, ckk});
    Both b = bias ? rig.random({oc}) : Both{};
    Both y = rig.garbage({g.n, oc, oh, ow});
    cpu.conv2d_forward(x.a(), wt.a(), b.a(), y.a(), g, oc);
    cl.conv2d_forward(x.b(), wt.b(), b.b(), y.b(), g, oc);
    expect_close(y, Tol{1e-5, 2e-6 * static_cast<double>(ckk + 1)}, "conv2d_forward" + w);
    Both dy = rig.random({g.n, oc, oh, ow}), dw = rig.random({oc, ckk});
    Both db = bias ? rig.random({oc}) : Both{};
    Both dx = rig.garbage({g.n, g.c, g.h, g.w});
    cpu.conv2d_backward(x.a(), wt.a(), dy.a(), dw.a(), db.a(), dx.a(), g, oc);
    cl.conv2d_backward(x.b(), wt.b(), dy.b(), dw.b(), db.b(), dx.b(), g, oc);
    expect_close(dw, Tol{1e-5, 2e-6 * static_cast<double>(g.n * oh * ow + 1)}, "conv2d_backward dw" + w);
    if (bias) expect_close(db, reduction_tol(db), "conv2d_backward db" + w);
    expect_close(dx, Tol{1e-5, 2e-6 * static_cast<double>(oc * g.kh * g.kw + 1)}, "conv2d_backward dx" + w);
  }
}

TEST_CASE("opencl max and average pooling, forward and backward", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(61)};
  std::vector<Window2d> windows;
  windows.push_back(Window2d{2, 3, 28, 28, 2, 2, 2, 2, 0, 0});  // the CNN's pool
  windows.push_back(Window2d{1, 2, 7, 9, 3, 3, 2, 2, 1, 1});    // overlapping windows with padding
  windows.push_back(Window2d{2, 1, 5, 5, 3, 2, 1, 1, 1, 0});    // stride 1: heavy overlap
  for (int i = 0; i < 8; ++i) windows.push_back(random_window(rig.rng));
  for (const Window2d& g : windows) {
    const std::string w = " " + window_str(g);
    const int64_t oh = g.out_h(), ow = g.out_w();
    Vec data = random_vec(rig.rng, g.n * g.c * g.h * g.w);
    for (size_t i = 0; i < data.size(); i += 5) data[i] = 0.5f;  // ties: the first maximum wins
    Both x = rig.make({g.n, g.c, g.h, g.w}, data);
    Both y = rig.garbage({g.n, g.c, oh, ow}), arg = rig.garbage({g.n, g.c, oh, ow});
    cpu.maxpool_forward(x.a(), y.a(), arg.a(), g);
    cl.maxpool_forward(x.b(), y.b(), arg.b(), g);
    expect_close(y, kExact, "maxpool_forward values" + w);
    expect_close(arg, kExact, "maxpool_forward argmax" + w);
    Both dy = rig.random({g.n, g.c, oh, ow}), dx = rig.garbage({g.n, g.c, g.h, g.w});
    cpu.maxpool_backward(dy.a(), arg.a(), dx.a(), g);
    cl.maxpool_backward(dy.b(), arg.b(), dx.b(), g);
    expect_close(dx, reduction_tol(dx), "maxpool_backward" + w);

    Both ya = rig.garbage({g.n, g.c, oh, ow});
    cpu.avgpool_forward(x.a(), ya.a(), g);
    cl.avgpool_forward(x.b(), ya.b(), g);
    expect_close(ya, reduction_tol(ya), "avgpool_forward" + w);
    Both dxa = rig.garbage({g.n, g.c, g.h, g.w});
    cpu.avgpool_backward(dy.a(), dxa.a(), g);
    cl.avgpool_backward(dy.b(), dxa.b(), g);
    expect_close(dxa, reduction_tol(dxa), "avgpool_backward" + w);
  }
  // NaN propagates through max pooling like PyTorch.
  Window2d g{1, 1, 2, 2, 2, 2, 2, 2, 0, 0};
  Both x = rig.make({1, 1, 2, 2}, {1.f, std::numeric_limits<float>::quiet_NaN(), 3.f, 2.f});
  Both y = rig.garbage({1}), arg = rig.garbage({1});
  cpu.maxpool_forward(x.a(), y.a(), arg.a(), g);
  cl.maxpool_forward(x.b(), y.b(), arg.b(), g);
  expect_close(y, kExact, "maxpool NaN value");
  expect_close(arg, kExact, "maxpool NaN index");
}

TEST_CASE("opencl layer norm, forward and backward", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(71)};
  for (int iter = 0; iter < 6; ++iter) {
    const int64_t rows = iter == 0 ? 1 : pick(rig.rng, 1, 70), cols = iter == 1 ? 1 : pick(rig.rng, 2, 300);
    const std::string sz = " " + std::to_string(rows) + "x" + std::to_string(cols);
    Both x = rig.random({rows, cols}, -2.f, 3.f), gamma = rig.random({cols}, 0.5f, 1.5f), beta = rig.random({cols});
    Both y = rig.garbage({rows, cols}), mean = rig.garbage({rows}), rstd = rig.garbage({rows});
    cpu.layernorm_forward(x.a(), gamma.a(), beta.a(), y.a(), mean.a(), rstd.a(), rows, cols, 1e-5f);
    cl.layernorm_forward(x.b(), gamma.b(), beta.b(), y.b(), mean.b(), rstd.b(), rows, cols, 1e-5f);
    expect_close(y, kTranscendental, "layernorm_forward y" + sz);
    expect_close(mean, kTranscendental, "layernorm_forward mean" + sz);
    expect_close(rstd, kTranscendental, "layernorm_forward rstd" + sz);
    Both dy = rig.random({rows, cols}), dx = rig.garbage({rows, cols});
    Both dgamma = rig.random({cols}), dbeta = rig.random({cols});  // accumulate
    cpu.layernorm_backward(x.a(), gamma.a(), mean.a(), rstd.a(), dy.a(), dx.a(), dgamma.a(), dbeta.a(), rows, cols);
    cl.layernorm_backward(x.b(), gamma.b(), mean.b(), rstd.b(), dy.b(), dx.b(), dgamma.b(), dbeta.b(), rows, cols);
    expect_close(dx, Tol{1e-4, 1e-5 * std::max(1.f, max_abs(dx.a()))}, "layernorm_backward dx" + sz);
    expect_close(dgamma, reduction_tol(dgamma), "layernorm_backward dgamma" + sz);
    expect_close(dbeta, reduction_tol(dbeta), "layernorm_backward dbeta" + sz);
  }
}

TEST_CASE("opencl token embedding, forward and backward", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(75)};
  for (int iter = 0; iter < 7; ++iter) {
    const int64_t rows = iter == 0 ? 1 : pick(rig.rng, 1, 300), vocab = iter == 1 ? 1 : pick(rig.rng, 2, 300);
    const int64_t width = iter == 2 ? 1 : pick(rig.rng, 1, 70);
    const std::string sz = " rows " + std::to_string(rows) + " vocab " + std::to_string(vocab) + " width " +
                           std::to_string(width);
    Vec ids(static_cast<size_t>(rows));
    // Few distinct ids in some cases, so that one table row gathers many gradient rows.
    const int64_t top = iter == 3 ? std::min<int64_t>(vocab - 1, 2) : vocab - 1;
    for (float& id : ids) id = static_cast<float>(pick(rig.rng, 0, top));
    Both id = rig.make({rows}, ids), table = rig.random({vocab, width}), y = rig.garbage({rows, width});
    cpu.embedding_forward(id.a(), table.a(), y.a(), rows, vocab, width);
    cl.embedding_forward(id.b(), table.b(), y.b(), rows, vocab, width);
    expect_close(y, kExact, "embedding_forward" + sz);
    // Backward accumulates, summing each table row's gradients in row order as the CPU does.
    Both dy = rig.random({rows, width}), dtable = rig.random({vocab, width});
    cpu.embedding_backward(id.a(), dy.a(), dtable.a(), rows, vocab, width);
    cl.embedding_backward(id.b(), dy.b(), dtable.b(), rows, vocab, width);
    expect_close(dtable, kExact, "embedding_backward" + sz);
  }
  // Deterministic: the same gradient twice gives the same bits.
  const int64_t rows = 4096, vocab = 5, width = 33;
  Vec ids(rows);
  for (float& v : ids) v = static_cast<float>(pick(rig.rng, 0, vocab - 1));
  Tensor id(cl, {rows}), dy(cl, {rows, width}), d1(cl, {vocab, width}), d2(cl, {vocab, width});
  id.from_host(ids);
  dy.from_host(random_vec(rig.rng, rows * width));
  cl.fill(d1, 0.f);
  cl.fill(d2, 0.f);
  cl.embedding_backward(id, dy, d1, rows, vocab, width);
  cl.embedding_backward(id, dy, d2, rows, vocab, width);
  CHECK(d1.to_host() == d2.to_host());
  // An id that is not a token index is refused before anything is written.
  Tensor bad(cl, {2}), table(cl, {3, 4}), y(cl, {2, 4});
  cl.fill(y, 7.f);
  for (float wrong : {3.f, -1.f, 0.5f, std::numeric_limits<float>::quiet_NaN()}) {
    bad.from_host(Vec{1.f, wrong});
    CHECK_THROWS_WITH(cl.embedding_forward(bad, table, y, 2, 3, 4), Catch::Contains("in row 1 is not"));
    CHECK_THROWS_WITH(cl.embedding_backward(bad, y, table, 2, 3, 4), Catch::Contains("in row 1 is not"));
  }
  CHECK(y.to_host() == Vec(8, 7.f));
}

TEST_CASE("opencl causal softmax, forward and backward", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(77)};
  for (int iter = 0; iter < 7; ++iter) {
    const int64_t n = iter == 0 ? 1 : pick(rig.rng, 1, 12), t = iter == 1 ? 1 : pick(rig.rng, 2, 70);
    const float scale = iter == 2 ? 1.f : std::uniform_real_distribution<float>(0.05f, 0.7f)(rig.rng);
    const std::string sz = " n" + std::to_string(n) + " t" + std::to_string(t) + " scale " + std::to_string(scale);
    // Large scores in one case: the max subtraction keeps exp finite. Above the
    // diagonal the scores hold NaN, which must not be read.
    Vec sc = random_vec(rig.rng, n * t * t, iter == 3 ? 60.f : -6.f, iter == 3 ? 200.f : 6.f);
    for (int64_t m = 0; m < n; ++m)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = i + 1; j < t; ++j) sc[static_cast<size_t>((m * t + i) * t + j)] = std::nanf("");
    Both scores = rig.make({n, t, t}, sc), probs = rig.garbage({n, t, t});
    cpu.causal_softmax_forward(scores.a(), probs.a(), n, t, scale);
    cl.causal_softmax_forward(scores.b(), probs.b(), n, t, scale);
    expect_close(probs, kTranscendental, "causal_softmax_forward" + sz);
    Both dprobs = rig.random({n, t, t}), dscores = rig.garbage({n, t, t});
    cpu.causal_softmax_backward(probs.a(), dprobs.a(), dscores.a(), n, t, scale);
    cl.causal_softmax_backward(probs.b(), dprobs.b(), dscores.b(), n, t, scale);
    expect_close(dscores, Tol{2e-5, 1e-6 * std::max(1.f, max_abs(dscores.a()))}, "causal_softmax_backward" + sz);
  }
}

TEST_CASE("opencl transformer ops pass a finite-difference gradient check", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  // On the OpenCL device alone: the loss L = sum w * f(x) for random weights w,
  // its analytic gradient from the backward op, and central differences of L
  // computed in double from the forward op's outputs.
  std::mt19937 rng(79);
  const auto loss = [](const Vec& out, const Vec& w) {
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
    return s;
  };
  SECTION("causal softmax") {
    const int64_t n = 2, t = 5;
    const float scale = 0.5f, h = 1e-2f;
    Vec x = random_vec(rng, n * t * t, -2.f, 2.f), w = random_vec(rng, n * t * t);
    Tensor xs(cl, {n, t, t}), p(cl, {n, t, t}), wt(cl, {n, t, t}), dx(cl, {n, t, t});
    const auto forward = [&](const Vec& in) {
      xs.from_host(in);
      cl.causal_softmax_forward(xs, p, n, t, scale);
      return loss(p.to_host(), w);
    };
    forward(x);
    wt.from_host(w);
    cl.causal_softmax_backward(p, wt, dx, n, t, scale);
    const Vec analytic = dx.to_host();
    for (size_t i = 0; i < x.size(); ++i) {
      Vec hi = x, lo = x;
      hi[i] += h;
      lo[i] -= h;
      const double numeric = (forward(hi) - forward(lo)) / (2.0 * h);
      INFO("element " << i);
      CHECK(std::fabs(numeric - analytic[i]) <= 2e-3 + 2e-2 * std::fabs(numeric));
    }
  }
  SECTION("gelu_tanh") {
    const int64_t n = 64;
    const float h = 1e-2f;
    Vec x = random_vec(rng, n, -4.f, 4.f), w = random_vec(rng, n);
    Tensor xs(cl, {n}), y(cl, {n}), wt(cl, {n}), dx(cl, {n});
    xs.from_host(x);
    wt.from_host(w);
    cl.activation_forward(Activation::gelu_tanh, xs, y);
    cl.activation_backward(Activation::gelu_tanh, xs, y, wt, dx);
    const Vec analytic = dx.to_host();
    for (size_t i = 0; i < x.size(); ++i) {
      Vec hi = x, lo = x;
      hi[i] += h;
      lo[i] -= h;
      xs.from_host(hi);
      cl.activation_forward(Activation::gelu_tanh, xs, y);
      const double up = y.to_host()[i];
      xs.from_host(lo);
      cl.activation_forward(Activation::gelu_tanh, xs, y);
      const double numeric = w[i] * (up - y.to_host()[i]) / (2.0 * h);
      INFO("x " << x[i]);
      CHECK(std::fabs(numeric - analytic[i]) <= 2e-3 + 2e-2 * std::fabs(numeric));
    }
  }
}

TEST_CASE("opencl losses: softmax cross-entropy, mse, argmax match", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(81)};
  for (int iter = 0; iter < 6; ++iter) {
    const int64_t rows = iter == 0 ? 1 : pick(rig.rng, 1, 130), classes = iter == 1 ? 1 : pick(rig.rng, 2, 37);
    const std::string sz = " " + std::to_string(rows) + "x" + std::to_string(classes);
    Vec labels(static_cast<size_t>(rows));
    for (float& l : labels) l = static_cast<float>(pick(rig.rng, 0, classes - 1));
    Both logits = rig.random({rows, classes}, -8.f, 8.f), lab = rig.make({rows}, labels);
    if (iter == 2) {  // large logits: the max subtraction keeps exp finite
      Vec big = random_vec(rig.rng, rows * classes, 80.f, 120.f);
      logits = rig.make({rows, classes}, big);
    }
    Both loss = rig.garbage({rows}), dlogits = rig.garbage({rows, classes});
    cpu.softmax_xent(logits.a(), lab.a(), loss.a(), dlogits.a(), rows, classes, 1.f / static_cast<float>(rows));
    cl.softmax_xent(logits.b(), lab.b(), loss.b(), dlogits.b(), rows, classes, 1.f / static_cast<float>(rows));
    expect_close(loss, Tol{2e-5, 2e-6}, "softmax_xent loss" + sz);
    expect_close(dlogits, Tol{2e-5, 1e-7}, "softmax_xent dlogits" + sz);
    Both loss2 = rig.garbage({rows});  // evaluation only: no gradient tensor
    cpu.softmax_xent(logits.a(), lab.a(), loss2.a(), Tensor(), rows, classes, 1.f);
    cl.softmax_xent(logits.b(), lab.b(), loss2.b(), Tensor(), rows, classes, 1.f);
    expect_close(loss2, Tol{2e-5, 2e-6}, "softmax_xent loss without gradient" + sz);

    Both correct = rig.garbage({rows});
    cpu.argmax_match(logits.a(), lab.a(), correct.a(), rows, classes);
    cl.argmax_match(logits.b(), lab.b(), correct.b(), rows, classes);
    expect_close(correct, kExact, "argmax_match" + sz);

    const int64_t cols = pick(rig.rng, 1, 50);
    Both pred = rig.random({rows, cols}), target = rig.random({rows, cols});
    Both mloss = rig.garbage({rows}), dpred = rig.garbage({rows, cols});
    cpu.mse(pred.a(), target.a(), mloss.a(), dpred.a(), rows, cols, 0.5f);
    cl.mse(pred.b(), target.b(), mloss.b(), dpred.b(), rows, cols, 0.5f);
    expect_close(mloss, reduction_tol(mloss), "mse loss");
    expect_close(dpred, kElementwise, "mse dpred");
    Both mloss2 = rig.garbage({rows});
    cpu.mse(pred.a(), target.a(), mloss2.a(), Tensor(), rows, cols, 0.5f);
    cl.mse(pred.b(), target.b(), mloss2.b(), Tensor(), rows, cols, 0.5f);
    expect_close(mloss2, reduction_tol(mloss2), "mse loss without gradient");
  }
  // A label outside [0, classes) poisons its row instead of reading out of bounds.
  Tensor logits(cl, {2, 3}), lab(cl, {2}), loss(cl, {2});
  logits.from_host(Vec{1, 2, 3, 4, 5, 6});
  lab.from_host(Vec{1, 7});
  cl.softmax_xent(logits, lab, loss, Tensor(), 2, 3, 1.f);
  const Vec l = loss.to_host();
  CHECK(std::isfinite(l[0]));
  CHECK(std::isnan(l[1]));
}

TEST_CASE("opencl optimizer steps: SGD variants, Adam and AdamW over several steps", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(91)};
  struct SgdCase {
    float momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const SgdCase& sc : {SgdCase{0.f, 0.f, 0.f, false}, SgdCase{0.f, 0.f, 0.01f, false},
                            SgdCase{0.9f, 0.f, 0.f, false}, SgdCase{0.9f, 0.1f, 5e-4f, false},
                            SgdCase{0.9f, 0.f, 1e-3f, true}}) {
    const int64_t n = pick(rig.rng, 1, 5000);
    Both p = rig.random({n}), buf = rig.garbage({n});
    for (int step = 0; step < 4; ++step) {
      Both g = rig.random({n});
      SgdStep s;
      s.lr = 0.05f;
      s.momentum = sc.momentum;
      s.dampening = sc.dampening;
      s.weight_decay = sc.weight_decay;
      s.nesterov = sc.nesterov;
      s.first = step == 0;
      cpu.sgd_step(p.a(), g.a(), sc.momentum != 0.f ? buf.a() : Tensor(), s);
      cl.sgd_step(p.b(), g.b(), sc.momentum != 0.f ? buf.b() : Tensor(), s);
    }
    const std::string what = "sgd momentum " + std::to_string(sc.momentum) + (sc.nesterov ? " nesterov" : "") +
                             " wd " + std::to_string(sc.weight_decay);
    expect_close(p, kElementwise, what + " params");
    if (sc.momentum != 0.f) expect_close(buf, kElementwise, what + " buffer");
  }
  for (bool decoupled : {false, true}) {
    for (float wd : {0.f, 0.01f}) {
      const int64_t n = pick(rig.rng, 1, 5000);
      Both p = rig.random({n}), m = rig.zeros({n}), v = rig.zeros({n});
      for (int64_t step = 1; step <= 5; ++step) {
        Both g = rig.random({n}, -0.1f, 0.1f);
        AdamStep s;
        s.lr = 1e-3f;
        s.weight_decay = wd;
        s.decoupled = decoupled;
        s.step = step;
        cpu.adam_step(p.a(), g.a(), m.a(), v.a(), s);
        cl.adam_step(p.b(), g.b(), m.b(), v.b(), s);
      }
      const std::string what = std::string(decoupled ? "adamw" : "adam") + " wd " + std::to_string(wd);
      expect_close(p, kTranscendental, what + " params");
      expect_close(m, kElementwise, what + " m");
      expect_close(v, kElementwise, what + " v");
    }
  }
  Tensor p(cl, {3}), g(cl, {3}), m(cl, {3}), v(cl, {3});
  AdamStep bad;
  bad.step = 0;
  CHECK_THROWS_WITH(cl.adam_step(p, g, m, v, bad), Catch::Contains("step must be >= 1"));
}

TEST_CASE("opencl sum_squares", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Rig rig{cpu, cl, std::mt19937(101)};
  for (int64_t n : {1, 2, 255, 257, 65537, 1000003}) {
    Both x = rig.random({n});
    const double want = cpu.sum_squares(x.a()), got = cl.sum_squares(x.b());
    INFO("n=" << n << " cpu " << want << " opencl " << got);
    CHECK(std::fabs(got - want) <= 1e-5 * want + 1e-7);
  }
  Tensor empty(cl, {0});
  CHECK(cl.sum_squares(empty) == 0.f);
}

TEST_CASE("opencl ops reject bad tensors with clear messages", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  Tensor on_cpu(cpu, {8}), a(cl, {8}), small(cl, {3});
  CHECK_THROWS_WITH(cl.axpy(1.f, on_cpu, a), Catch::Contains("lives on another device"));
  CHECK_THROWS_WITH(cl.mul(a, small, a), Catch::Contains("b (3) has 3 elements, expected 8"));
  CHECK_THROWS_WITH(cl.add_bias_rows(a, small, 2, 4), Catch::Contains("b (3) has 3 elements, needs 4"));
  CHECK_THROWS_WITH(cl.layernorm_forward(a, a, a, a, a, a, 2, 0, 1e-5f), Catch::Contains("cols must be > 0"));
  CHECK_THROWS_WITH(cl.swap_axes01(a, a, 2, 2, 2), Catch::Contains("must not overlap"));
  CHECK_THROWS_WITH(cl.copy(a, small), Catch::Contains("expected 8"));
}

TEST_CASE("opencl and cpu refuse bad arguments with the same message", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  // The checks are shared (device/op_checks.h): only the backend prefix differs.
  const auto message = [](Device& d, auto&& op) -> std::string {
    Tensor a(d, {8}), small(d, {3});
    try {
      op(d, a, small);
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      return m.substr(m.find(' ') + 1);
    }
    return "(nothing thrown)";
  };
  const auto same = [&](const char* what, auto&& op) {
    INFO(what);
    const std::string want = message(cpu, op), got = message(cl, op);
    CHECK(got == want);
    CHECK(got != "(nothing thrown)");
  };
  same("gemm", [](Device& d, Tensor& a, Tensor&) { d.gemm(false, false, 4, 4, 4, 1.f, a, 3, a, 4, 0.f, a, 4); });
  same("gemm range", [](Device& d, Tensor& a, Tensor&) {
    d.gemm(false, false, 1, 1, int64_t{1} << 31, 1.f, a, int64_t{1} << 31, a, 1, 0.f, a, 1);
  });
  same("swap_axes01 partial overlap", [](Device& d, Tensor& a, Tensor&) {
    d.swap_axes01(Tensor::view(a, 0, {4}), Tensor::view(a, 2, {4}), 2, 2, 1);
  });
  same("activation", [](Device& d, Tensor& a, Tensor& small) {
    d.activation_backward(Activation::tanh, a, small, a, a);
  });
  same("window", [](Device& d, Tensor& a, Tensor& small) {
    Window2d g;
    g.n = 1, g.c = 1, g.h = 2, g.w = 2, g.kh = 3, g.kw = 3;
    d.avgpool_backward(a, small, g);
  });
  same("loss", [](Device& d, Tensor& a, Tensor& small) { d.mse(a, a, small, Tensor(), 4, 2, 1.f); });
  same("embedding sizes", [](Device& d, Tensor& a, Tensor& small) { d.embedding_forward(small, a, a, 4, 2, 2); });
  same("embedding id", [](Device& d, Tensor& a, Tensor&) {
    d.fill(a, 9.f);  // ids 9 in a vocabulary of 4
    d.embedding_forward(a, a, a, 2, 4, 2);
  });
  same("causal softmax", [](Device& d, Tensor& a, Tensor& small) {
    d.causal_softmax_backward(a, a, small, 2, 2, 1.f);
  });
  same("adam", [](Device& d, Tensor& a, Tensor&) {
    AdamStep s;
    s.step = 0;
    d.adam_step(a, a, a, a, s);
  });
}

TEST_CASE("opencl memory accounting and limits", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  DeviceOptions opts;
  opts.cache_dir = program_cache_dir();
  opts.memory_limit = 1 << 20;  // 1 MiB
  OpenclDevice small(opts, false);
  CHECK(small.memory().total == opts.memory_limit);
  {
    Tensor a(small, {128 * 1024});  // 512 KiB
    CHECK(small.bytes_in_use() == 512 * 1024);
    CHECK(small.memory().free == 512 * 1024);
    CHECK_THROWS_AS(Tensor(small, {200 * 1024}), OutOfMemory);  // 800 KiB more would exceed 1 MiB
    CHECK_THROWS_WITH(Tensor(small, {200 * 1024}), Catch::Contains("limit"));
    Tensor b(small, {64 * 1024});  // still fits
    CHECK(small.bytes_in_use() == 768 * 1024);
  }
  CHECK(small.bytes_in_use() == 0);
  // Failure injection: allocate until the limit, every failure is a clean OutOfMemory.
  std::vector<Tensor> held;
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    try {
      held.emplace_back(small, Shape{10000});
    } catch (const OutOfMemory&) {
      ++refused;
    }
  }
  CHECK(held.size() == (1 << 20) / 40000);
  CHECK(refused == 40 - static_cast<int>(held.size()));
  for (Tensor& t : held) small.fill(t, 1.f);
  CHECK(small.sum_squares(held.back()) == 10000.f);
}

TEST_CASE("opencl device choice: ordinals and GPU-only requests", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  DeviceOptions opts;
  opts.cache_dir = program_cache_dir();
  opts.ordinal = 1000;
  CHECK_THROWS_WITH(OpenclDevice(opts, false), Catch::Contains("ordinal 1000 is out of range"));
  opts.ordinal = -1;
  CHECK_THROWS_AS(OpenclDevice(opts, false), std::invalid_argument);
  if (!cl.is_gpu()) {
    // The host has only CPU OpenCL devices (PoCL): a GPU-only request (--backend auto) refuses them.
    opts.ordinal = 0;
    CHECK_THROWS_WITH(make_opencl_device(opts, true), Catch::Contains("no OpenCL GPU device"));
    CHECK(open_device("auto", opts)->backend() != Backend::opencl);
  }
  opts.ordinal = 0;
  CHECK(open_device("opencl", opts)->backend() == Backend::opencl);
}

TEST_CASE("opencl program cache: second start loads the binary, bad files are rebuilt", "[opencl]") {
  CLEAVE_NEED_OPENCL();
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(CLEAVE_BINARY_DIR) / ("opencl-cache-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  DeviceOptions opts;
  opts.cache_dir = dir.string();
  std::string file;
  {
    OpenclDevice first(opts, false);
    CHECK_FALSE(first.program_from_cache());  // empty cache: compiled from source
    file = first.program_cache_file();
    CHECK(fs::exists(file));
  }
  {
    OpenclDevice second(opts, false);
    CHECK(second.program_from_cache());
    CHECK(second.program_cache_file() == file);
    WARN("program build: from source then from cache in " << second.program_build_seconds() << " s");
    Tensor t(second, {5});
    second.fill(t, 2.f);
    CHECK(second.sum_squares(t) == 20.f);  // the cached program works
  }
  {
    // A corrupted file is a miss: rebuilt from source and rewritten.
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.write("garbage!", 8);
  }
  {
    OpenclDevice third(opts, false);
    CHECK_FALSE(third.program_from_cache());
  }
  {
    OpenclDevice fourth(opts, false);
    CHECK(fourth.program_from_cache());
  }
  fs::remove_all(dir);
  // An unusable cache directory (below a regular file) only costs the compile.
  const fs::path blocker = fs::path(CLEAVE_BINARY_DIR) / ("opencl-cache-blocker-" + std::to_string(::getpid()));
  std::ofstream(blocker) << "not a directory";
  opts.cache_dir = (blocker / "sub").string();
  {
    OpenclDevice nocache(opts, false);
    CHECK_FALSE(nocache.program_from_cache());
    Tensor t(nocache, {3});
    nocache.fill(t, 1.f);
    CHECK(nocache.sum_squares(t) == 3.f);
  }
  fs::remove(blocker);
}

TEST_CASE("opencl cache directory defaults", "[opencl]") {
  CHECK(opencl_cache_dir("/some/dir") == "/some/dir");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg != nullptr && xdg[0] == '/') {
    CHECK(opencl_cache_dir("") == std::string(xdg) + "/cleave/opencl");
  } else if (home != nullptr && home[0] != '\0') {
    CHECK(opencl_cache_dir("") == std::string(home) + "/.cache/cleave/opencl");
  }
}

TEST_CASE("opencl program cache files: keys, round trip, corruption", "[opencl]") {
  namespace fs = std::filesystem;
  // Every part of the key matters, and so do the boundaries between parts.
  const std::string k = program_cache_key({"source", "device", "driver 1.0", ""});
  CHECK(k.size() == 16);
  CHECK(k == program_cache_key({"source", "device", "driver 1.0", ""}));
  CHECK(k != program_cache_key({"source", "device", "driver 1.1", ""}));
  CHECK(k != program_cache_key({"source", "device", "driver 1.0", "-cl-fast-relaxed-math"}));
  CHECK(program_cache_key({"ab", "c"}) != program_cache_key({"a", "bc"}));

  const fs::path dir = fs::path(CLEAVE_BINARY_DIR) / ("opencl-cache-files-" + std::to_string(::getpid())) / "nested";
  fs::remove_all(dir.parent_path());
  const std::vector<unsigned char> binary = {1, 2, 3, 0, 255, 42, 7};
  CHECK_FALSE(read_cached_program(dir.string(), k).has_value());  // absent
  REQUIRE(write_cached_program(dir.string(), k, binary));         // creates the directories
  auto back = read_cached_program(dir.string(), k);
  REQUIRE(back.has_value());
  CHECK(*back == binary);
  // No temporary files are left behind.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
  // A truncated file and a flipped byte both read as a miss.
  const std::string path = cached_program_path(dir.string(), k);
  fs::resize_file(path, fs::file_size(path) - 1);
  CHECK_FALSE(read_cached_program(dir.string(), k).has_value());
  REQUIRE(write_cached_program(dir.string(), k, binary));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x99');
  }
  CHECK_FALSE(read_cached_program(dir.string(), k).has_value());
  // No directory, or one that cannot be created: nothing cached, no exception.
  CHECK_FALSE(write_cached_program("", k, binary));
  const fs::path blocker = dir / "file";
  std::ofstream(blocker) << "x";
  CHECK_FALSE(write_cached_program((blocker / "sub").string(), k, binary));
  fs::remove_all(dir.parent_path());
}
