// test_cuda_parity.cpp: the CUDA backend, op by op, forward and backward, against
// the CPU backend (the ground truth) on random inputs and shapes, odd sizes included.
//
// Tests tagged [cuda] need a usable NVIDIA GPU: where none can be opened they skip
// with the reason (CLEAVE_SKIP, tests/skip.h: "Skipped" in CTest). "open_device
// cuda without GPU gives a clear error" runs everywhere and checks the no-GPU path itself.
//
// Every comparison prints one line to stdout,
//   PARITY <op> max_err <e> tol <t> pass|FAIL
// which scripts/cuda-check.sh turns into a table. The error of one element is
//   |cuda - cpu| / max(1, |cpu|)     (absolute for small values, relative for large;
//                                     NaN on one side only is an infinite error)
// and each op has a tolerance on its maximum, chosen from what the op does:
//   0      pure data movement or identical single operations: copy, fill, views,
//          im2col, swap_axes01, relu, mul, scale, bias add, maxpool (values and
//          argmax, ties included), argmax_match
//   1e-6   identical formulas where nvcc may fuse a multiply-add (FMA) the CPU
//          build does not, or the same sums in the same order: axpy, col2im,
//          pool backward, avgpool, mse gradient, SGD
//   1e-5   float transcendentals (CUDA's erff/expf/tanhf are within 2 ulp, glibc's
//          within 1): GELU, tanh, gelu_tanh, softmax cross-entropy, causal
//          softmax forward and backward, Adam (bias-corrected, 5 steps),
//          sum_squares (both sum in double)
//   and 0 also for the embedding forward and backward (the same sums in the
//          same order as the CPU)
//   1e-4   reductions in a different order over up to ~1000 terms: GEMM (cuBLAS vs
//          OpenBLAS), conv2d, bias gradients, layer norm forward and backward, mse loss
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/tensor.h"
#include "skip.h"

using namespace cleave;

namespace {

using Vec = std::vector<float>;

constexpr double kExact = 0.0;
constexpr double kFma = 1e-6;
constexpr double kTranscendental = 1e-5;
constexpr double kReduction = 1e-4;

// The CPU reference and the CUDA device under test, opened once per process.
struct Backends {
  std::unique_ptr<Device> cpu, gpu;
  std::string why;  // reason the GPU could not be opened
};

Backends& backends() {
  static Backends b = [] {
    Backends out;
    out.cpu = open_device("cpu");
    try {
      out.gpu = open_device("cuda");
    } catch (const std::exception& e) {
      out.why = e.what();
    }
    return out;
  }();
  return b;
}

// Evaluates to the Backends, or skips the test (tests/skip.h) when there is no GPU.
#define CUDA_OR_SKIP(b)                                                         \
  Backends& b = backends();                                                     \
  if (!(b).gpu) CLEAVE_SKIP("no CUDA device: " << (b).why)

enum class Side { cpu, gpu };

// The same tensor contents on both devices.
struct Twin {
  Tensor c, g;
  Twin() = default;
  Twin(const Vec& v, Shape shape) {
    Backends& b = backends();
    c = Tensor(*b.cpu, shape);
    g = Tensor(*b.gpu, shape);
    REQUIRE(static_cast<size_t>(c.numel()) == v.size());
    c.from_host(v);
    g.from_host(v);
  }
  explicit Twin(const Vec& v) : Twin(v, {static_cast<int64_t>(v.size())}) {}
  const Tensor& operator[](Side s) const { return s == Side::cpu ? c : g; }
};

// Runs f(device, side) on the CPU, then on the GPU.
template <class F>
void both(F&& f) {
  Backends& b = backends();
  f(*b.cpu, Side::cpu);
  f(*b.gpu, Side::gpu);
}

Vec random_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Small integers: many exact ties for max / argmax tests.
Vec tie_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-2, 2);
  Vec v(n);
  for (float& x : v) x = static_cast<float>(dist(gen));
  return v;
}

Vec label_vec(size_t rows, int64_t classes, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, classes - 1);
  Vec v(rows);
  for (float& x : v) x = static_cast<float>(dist(gen));
  return v;
}

double element_error(float gpu, float cpu) {
  const bool gn = std::isnan(gpu), cn = std::isnan(cpu);
  if (gn || cn) return gn && cn ? 0.0 : std::numeric_limits<double>::infinity();
  if (gpu == cpu) return 0.0;  // equal infinities included
  const double d = std::fabs(static_cast<double>(gpu) - static_cast<double>(cpu));
  return d / std::max(1.0, std::fabs(static_cast<double>(cpu)));
}

// Compares the two sides of `t` within `tol`; prints a PARITY line either way.
void expect_parity(const std::string& op, const Twin& t, double tol) {
  const Vec cpu = t.c.to_host();
  const Vec gpu = t.g.to_host();
  REQUIRE(cpu.size() == gpu.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double e = element_error(gpu[i], cpu[i]);
    if (e > worst || std::isinf(e)) {
      worst = e;
      at = i;
      if (std::isinf(e)) break;
    }
  }
  const bool pass = worst <= tol;
  std::printf("PARITY %-34s max_err %.3e tol %.0e %s\n", op.c_str(), worst, tol, pass ? "pass" : "FAIL");
  std::fflush(stdout);
  INFO(op << ": worst element " << at << " of " << cpu.size() << ": cuda " << (gpu.empty() ? 0.f : gpu[at])
          << " vs cpu " << (cpu.empty() ? 0.f : cpu[at]) << ", error " << worst << " > tolerance " << tol);
  CHECK(pass);
}

std::string dims(std::initializer_list<int64_t> ds) {
  std::string s;
  for (int64_t d : ds) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

std::string window_str(const Window2d& g) {
  return dims({g.n, g.c, g.h, g.w}) + "/k" + dims({g.kh, g.kw}) + "s" + dims({g.sh, g.sw}) + "p" +
         dims({g.ph, g.pw});
}

// Window geometries with odd sizes, padding, non-square kernels and strides.
std::vector<Window2d> windows() {
  auto w = [](int64_t n, int64_t c, int64_t h, int64_t wd, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
              int64_t ph, int64_t pw) {
    Window2d g;
    g.n = n, g.c = c, g.h = h, g.w = wd, g.kh = kh, g.kw = kw, g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw;
    return g;
  };
  return {w(2, 3, 7, 9, 3, 3, 2, 2, 1, 1),  w(1, 1, 5, 5, 2, 2, 2, 2, 0, 0),  w(3, 2, 8, 8, 3, 2, 1, 2, 1, 0),
          w(2, 5, 13, 11, 5, 5, 3, 3, 2, 2), w(1, 4, 1, 1, 1, 1, 1, 1, 0, 0), w(4, 3, 28, 28, 2, 2, 2, 2, 0, 0),
          w(1, 2, 6, 17, 3, 5, 1, 1, 1, 2)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Runs everywhere: the no-GPU path must be a clear error, and everything else keeps working.

TEST_CASE("open_device cuda without GPU gives a clear error", "[device]") {
  std::unique_ptr<Device> cuda;
  std::string message;
  try {
    cuda = open_device("cuda");
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  auto cpu = open_device("cpu");
  REQUIRE(cpu->backend() == Backend::cpu);
  Tensor t(*cpu, {3});
  cpu->fill(t, 2.5f);
  CHECK(t.to_host() == Vec{2.5f, 2.5f, 2.5f});

  if (!cuda) {
    INFO("message: " << message);
    CHECK_THAT(message, Catch::Contains("CUDA backend compiled in but no CUDA device is usable"));
    CHECK_THAT(message, Catch::Contains("use --backend cpu or opencl"));
    // `auto` falls back to a working non-CUDA device.
    auto fallback = open_device("auto");
    REQUIRE(fallback);
    CHECK(fallback->backend() != Backend::cuda);
    Tensor f(*fallback, {2});
    fallback->fill(f, -1.f);
    CHECK(f.to_host() == Vec{-1.f, -1.f});
  } else {
    CHECK(cuda->backend() == Backend::cuda);
    CHECK_THAT(cuda->name(), Catch::StartsWith("cuda:"));
    CHECK_FALSE(cuda->host_accessible());
    CHECK(open_device("auto")->backend() == Backend::cuda);
    DeviceOptions bad;
    bad.ordinal = 1 << 20;
    CHECK_THROWS_WITH(open_device("cuda", bad), Catch::Contains("no GPU with ordinal"));
  }
}

// ---------------------------------------------------------------------------------------------

TEST_CASE("cuda: memory, copies, views and errors", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  Device& gpu = *b.gpu;
  const MemoryInfo mem = gpu.memory();
  CHECK(mem.total > 0);
  CHECK(mem.free <= mem.total);

  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
    const Vec v = random_vec(n, 11 + static_cast<uint32_t>(n));
    Twin a(v), c(random_vec(n, 12));
    both([&](Device& d, Side s) { d.copy(a[s], c[s]); });
    expect_parity("copy n=" + std::to_string(n), c, kExact);
    CHECK(a.g.to_host() == v);  // upload/download round trip is exact
    both([&](Device& d, Side s) { d.fill(c[s], -3.25f); });
    expect_parity("fill n=" + std::to_string(n), c, kExact);
  }

  // Views at an element offset: ops must honour the offset on both sides.
  Twin base(random_vec(50, 13), {50});
  both([&](Device& d, Side s) {
    const Tensor x = Tensor::view(base[s], 3, {20});
    const Tensor y = Tensor::view(base[s], 27, {20});
    d.axpy(0.5f, x, y);
    d.scale(Tensor::view(base[s], 1, {5}), -2.f);
  });
  expect_parity("views (axpy, scale at offsets)", base, kFma);

  // Overlapping copy inside one buffer behaves like memmove.
  Twin mv(random_vec(40, 14), {40});
  both([&](Device& d, Side s) { d.copy(Tensor::view(mv[s], 0, {30}), Tensor::view(mv[s], 5, {30})); });
  expect_parity("copy overlapping (memmove)", mv, kExact);

  // Bad input is a clear exception, not a crash.
  Tensor x(gpu, {4}), y(gpu, {5});
  CHECK_THROWS_AS(gpu.axpy(1.f, x, y), std::invalid_argument);
  Tensor on_cpu(*b.cpu, {4});
  CHECK_THROWS_WITH(gpu.axpy(1.f, on_cpu, x), Catch::Contains("another device"));
  CHECK_THROWS_AS(gpu.gemm(false, false, 4, 4, 4, 1.f, x, 4, x, 4, 0.f, x, 4), std::invalid_argument);
  Window2d bad;
  bad.n = 1, bad.c = 1, bad.h = 2, bad.w = 2, bad.kh = 5, bad.kw = 5;
  CHECK_THROWS_WITH(gpu.im2col(x, y, bad), Catch::Contains("invalid window"));
  CHECK_THROWS_AS(gpu.upload(x, nullptr), std::invalid_argument);

  // Memory limit: OutOfMemory, accounting released with the last tensor.
  DeviceOptions lim;
  lim.memory_limit = 1 << 20;
  auto small = open_device("cuda", lim);
  CHECK(small->memory().total == size_t{1} << 20);
  {
    Tensor half(*small, {128 * 1024});  // 512 KiB
    CHECK_THROWS_AS(Tensor(*small, {256 * 1024}), OutOfMemory);
  }
  Tensor full(*small, {256 * 1024});  // 1 MiB fits again once `half` is gone
  small->fill(full, 1.f);
  CHECK(small->sum_squares(full) == Approx(256.0 * 1024.0));
}

TEST_CASE("cuda parity: gemm", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 64}, {128, 96, 257}, {3, 200, 1}, {65, 1, 129}};
  uint32_t seed = 100;
  for (const Case& cs : cases)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int64_t pad : {0, 3}) {
          const int64_t rows_a = ta ? cs.k : cs.m, cols_a = ta ? cs.m : cs.k;
          const int64_t rows_b = tb ? cs.n : cs.k, cols_b = tb ? cs.k : cs.n;
          const int64_t lda = cols_a + pad, ldb = cols_b + pad, ldc = cs.n + pad;
          Twin a(random_vec(static_cast<size_t>(rows_a * lda), ++seed));
          Twin bb(random_vec(static_cast<size_t>(rows_b * ldb), ++seed));
          const float beta = pad == 0 ? 0.f : 0.5f;
          Vec c0 = random_vec(static_cast<size_t>(cs.m * ldc), ++seed);
          if (beta == 0.f) std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());
          Twin c(c0);
          both([&](Device& d, Side s) {
            d.gemm(ta != 0, tb != 0, cs.m, cs.n, cs.k, 0.75f, a[s], lda, bb[s], ldb, beta, c[s], ldc);
          });
          expect_parity(std::string("gemm ") + (ta ? "T" : "N") + (tb ? "T" : "N") + " " +
                            dims({cs.m, cs.n, cs.k}) + (pad ? " ld+3 beta.5" : " beta0(NaN C)"),
                        c, kReduction);
        }
  // k = 0: C = beta * C.
  Twin a(random_vec(4, 1)), bb(random_vec(4, 2)), c(random_vec(12, 3));
  both([&](Device& d, Side s) { d.gemm(false, false, 3, 4, 0, 1.f, a[s], 1, bb[s], 4, 0.5f, c[s], 4); });
  expect_parity("gemm k=0", c, kExact);
}

TEST_CASE("cuda parity: elementwise and activations", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
    const std::string sz = " n=" + std::to_string(n);
    const uint32_t seed = static_cast<uint32_t>(n);
    {
      Twin x(random_vec(n, seed)), y(random_vec(n, seed + 1));
      both([&](Device& d, Side s) { d.axpy(-1.7f, x[s], y[s]); });
      expect_parity("axpy" + sz, y, kFma);
      both([&](Device& d, Side s) { d.scale(y[s], 0.3f); });
      expect_parity("scale" + sz, y, kExact);
      Twin out(Vec(n, 0.f));
      both([&](Device& d, Side s) { d.mul(x[s], y[s], out[s]); });
      expect_parity("mul" + sz, out, kExact);
    }
    struct A {
      Activation act;
      const char* name;
      double tol;
    };
    for (const A& a : {A{Activation::relu, "relu", kExact}, A{Activation::gelu, "gelu", kTranscendental},
                       A{Activation::tanh, "tanh", kTranscendental},
                       A{Activation::gelu_tanh, "gelu_tanh", kTranscendental}}) {
      Vec xv = random_vec(n, seed + 2, -4.f, 4.f);
      if (n > 2) xv[1] = 0.f;  // relu's kink
      Twin x(xv), y(Vec(n, 0.f)), dy(random_vec(n, seed + 3)), dx(Vec(n, 0.f));
      both([&](Device& d, Side s) { d.activation_forward(a.act, x[s], y[s]); });
      expect_parity(std::string(a.name) + " forward" + sz, y, a.tol);
      // Backward from the same (CPU) y on both sides, so only the backward op is compared.
      Twin yc(y.c.to_host());
      both([&](Device& d, Side s) { d.activation_backward(a.act, x[s], yc[s], dy[s], dx[s]); });
      expect_parity(std::string(a.name) + " backward" + sz, dx, a.tol == kExact ? kExact : std::max(a.tol, kFma));
    }
    // relu backward from y alone (x undefined), as layers that keep only y call it.
    Twin y(random_vec(n, seed + 4)), dy(random_vec(n, seed + 5)), dx(Vec(n, 0.f));
    both([&](Device& d, Side s) { d.activation_backward(Activation::relu, Tensor{}, y[s], dy[s], dx[s]); });
    expect_parity("relu backward from y" + sz, dx, kExact);
  }
}

TEST_CASE("cuda parity: bias add and gradients", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  uint32_t seed = 200;
  for (int64_t rows : {1, 7, 300})
    for (int64_t features : {1, 10, 33, 257}) {
      const std::string sz = " " + dims({rows, features});
      Twin y(random_vec(static_cast<size_t>(rows * features), ++seed)), bias(random_vec(static_cast<size_t>(features), ++seed));
      both([&](Device& d, Side s) { d.add_bias_rows(y[s], bias[s], rows, features); });
      expect_parity("add_bias_rows" + sz, y, kExact);
      Twin db(random_vec(static_cast<size_t>(features), ++seed));  // accumulates onto this
      both([&](Device& d, Side s) { d.bias_grad_rows(y[s], db[s], rows, features); });
      expect_parity("bias_grad_rows" + sz, db, kReduction);
    }
  for (int64_t n : {1, 3})
    for (int64_t c : {1, 6, 17})
      for (int64_t hw : {1, 49, 785}) {
        const std::string sz = " " + dims({n, c, hw});
        Twin y(random_vec(static_cast<size_t>(n * c * hw), ++seed)), bias(random_vec(static_cast<size_t>(c), ++seed));
        both([&](Device& d, Side s) { d.add_bias_channels(y[s], bias[s], n, c, hw); });
        expect_parity("add_bias_channels" + sz, y, kExact);
        Twin db(random_vec(static_cast<size_t>(c), ++seed));
        both([&](Device& d, Side s) { d.bias_grad_channels(y[s], db[s], n, c, hw); });
        expect_parity("bias_grad_channels" + sz, db, kReduction);
      }
}

TEST_CASE("cuda parity: im2col, col2im, swap_axes01", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  uint32_t seed = 300;
  for (const Window2d& g : windows()) {
    const int64_t rows = g.c * g.kh * g.kw, ncols = g.n * g.out_h() * g.out_w();
    Twin x(random_vec(static_cast<size_t>(g.n * g.c * g.h * g.w), ++seed));
    Twin cols(Vec(static_cast<size_t>(rows * ncols), 7.f));
    both([&](Device& d, Side s) { d.im2col(x[s], cols[s], g); });
    expect_parity("im2col " + window_str(g), cols, kExact);
    Twin dcols(random_vec(static_cast<size_t>(rows * ncols), ++seed));
    Twin dx(Vec(static_cast<size_t>(g.n * g.c * g.h * g.w), 9.f));  // overwritten
    both([&](Device& d, Side s) { d.col2im(dcols[s], dx[s], g); });
    expect_parity("col2im " + window_str(g), dx, kFma);
  }
  for (int64_t a : {1, 5, 33})
    for (int64_t bb : {1, 8, 65})
      for (int64_t r : {1, 3, 49}) {
        Twin src(random_vec(static_cast<size_t>(a * bb * r), ++seed)), dst(Vec(static_cast<size_t>(a * bb * r), 0.f));
        both([&](Device& d, Side s) { d.swap_axes01(src[s], dst[s], a, bb, r); });
        expect_parity("swap_axes01 " + dims({a, bb, r}), dst, kExact);
      }
}

TEST_CASE("cuda parity: conv2d forward and backward", "[cuda][device]") {
  // The CUDA device runs the portable lowering (im2col + cuBLAS); the CPU its own per-sample form.
  CUDA_OR_SKIP(b);
  uint32_t seed = 350;
  for (const Window2d& g : windows()) {
    for (int64_t oc : {1, 7}) {
      const int64_t ckk = g.c * g.kh * g.kw, ohw = g.out_h() * g.out_w();
      const bool bias = oc == 7;
      const std::string w = " " + window_str(g) + " oc" + std::to_string(oc);
      Twin x(random_vec(static_cast<size_t>(g.n * g.c * g.h * g.w), ++seed));
      Twin wt(random_vec(static_cast<size_t>(oc * ckk), ++seed));
      Twin bb = bias ? Twin(random_vec(static_cast<size_t>(oc), ++seed)) : Twin();
      Twin y(Vec(static_cast<size_t>(g.n * oc * ohw), 7.f));
      both([&](Device& d, Side s) { d.conv2d_forward(x[s], wt[s], bb[s], y[s], g, oc); });
      expect_parity("conv2d_forward" + w, y, kReduction);
      Twin dy(random_vec(static_cast<size_t>(g.n * oc * ohw), ++seed));
      Twin dw(random_vec(static_cast<size_t>(oc * ckk), ++seed));
      Twin db = bias ? Twin(random_vec(static_cast<size_t>(oc), ++seed)) : Twin();
      Twin dx(Vec(static_cast<size_t>(g.n * g.c * g.h * g.w), 9.f));  // overwritten
      both([&](Device& d, Side s) { d.conv2d_backward(x[s], wt[s], dy[s], dw[s], db[s], dx[s], g, oc); });
      expect_parity("conv2d_backward dw" + w, dw, kReduction);
      if (bias) expect_parity("conv2d_backward db" + w, db, kReduction);
      expect_parity("conv2d_backward dx" + w, dx, kReduction);
    }
  }
}

TEST_CASE("cuda parity: max and average pooling", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  uint32_t seed = 400;
  for (const Window2d& g : windows()) {
    const size_t in = static_cast<size_t>(g.n * g.c * g.h * g.w);
    const size_t out = static_cast<size_t>(g.n * g.c * g.out_h() * g.out_w());
    for (int ties = 0; ties < 2; ++ties) {
      const std::string tag = window_str(g) + (ties ? " ties" : "");
      Twin x(ties ? tie_vec(in, ++seed) : random_vec(in, ++seed));
      Twin y(Vec(out, 0.f)), arg(Vec(out, 0.f));
      both([&](Device& d, Side s) { d.maxpool_forward(x[s], y[s], arg[s], g); });
      expect_parity("maxpool forward " + tag, y, kExact);
      expect_parity("maxpool argmax " + tag, arg, kExact);
      // Backward from the CPU's argmax on both sides.
      Twin argc(arg.c.to_host()), dy(random_vec(out, ++seed)), dx(Vec(in, 5.f));
      both([&](Device& d, Side s) { d.maxpool_backward(dy[s], argc[s], dx[s], g); });
      expect_parity("maxpool backward " + tag, dx, kFma);
    }
    Twin x(random_vec(in, ++seed)), y(Vec(out, 0.f));
    both([&](Device& d, Side s) { d.avgpool_forward(x[s], y[s], g); });
    expect_parity("avgpool forward " + window_str(g), y, kFma);
    Twin dy(random_vec(out, ++seed)), dx(Vec(in, 5.f));
    both([&](Device& d, Side s) { d.avgpool_backward(dy[s], dx[s], g); });
    expect_parity("avgpool backward " + window_str(g), dx, kFma);
  }
}

TEST_CASE("cuda parity: layer norm", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  uint32_t seed = 500;
  for (int64_t rows : {1, 5, 64})
    for (int64_t cols : {1, 7, 33, 300, 1031}) {
      const std::string sz = " " + dims({rows, cols});
      const size_t rc = static_cast<size_t>(rows * cols);
      Twin x(random_vec(rc, ++seed, -3.f, 3.f)), gamma(random_vec(static_cast<size_t>(cols), ++seed, 0.5f, 1.5f));
      Twin beta(random_vec(static_cast<size_t>(cols), ++seed)), y(Vec(rc, 0.f));
      Twin mean(Vec(static_cast<size_t>(rows), 0.f)), rstd(Vec(static_cast<size_t>(rows), 0.f));
      both([&](Device& d, Side s) {
        d.layernorm_forward(x[s], gamma[s], beta[s], y[s], mean[s], rstd[s], rows, cols, 1e-5f);
      });
      expect_parity("layernorm forward y" + sz, y, kReduction);
      expect_parity("layernorm forward mean" + sz, mean, kReduction);
      expect_parity("layernorm forward rstd" + sz, rstd, kReduction);
      // Backward from the CPU's saved statistics on both sides.
      Twin mc(mean.c.to_host()), rsc(rstd.c.to_host()), dy(random_vec(rc, ++seed)), dx(Vec(rc, 0.f));
      Twin dgamma(random_vec(static_cast<size_t>(cols), ++seed)), dbeta(random_vec(static_cast<size_t>(cols), ++seed));
      both([&](Device& d, Side s) {
        d.layernorm_backward(x[s], gamma[s], mc[s], rsc[s], dy[s], dx[s], dgamma[s], dbeta[s], rows, cols);
      });
      expect_parity("layernorm backward dx" + sz, dx, kReduction);
      expect_parity("layernorm backward dgamma" + sz, dgamma, kReduction);
      expect_parity("layernorm backward dbeta" + sz, dbeta, kReduction);
    }
}

TEST_CASE("cuda parity: losses and accuracy", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  uint32_t seed = 600;
  for (int64_t rows : {1, 7, 64})
    for (int64_t classes : {1, 2, 10, 33, 1000}) {
      const std::string sz = " " + dims({rows, classes});
      const size_t rc = static_cast<size_t>(rows * classes);
      const float scale = 1.f / static_cast<float>(rows);
      Twin logits(random_vec(rc, ++seed, -5.f, 5.f)), labels(label_vec(static_cast<size_t>(rows), classes, ++seed));
      Twin loss(Vec(static_cast<size_t>(rows), 0.f)), dlogits(Vec(rc, 0.f));
      both([&](Device& d, Side s) {
        d.softmax_xent(logits[s], labels[s], loss[s], dlogits[s], rows, classes, scale);
      });
      expect_parity("softmax_xent loss" + sz, loss, kTranscendental);
      expect_parity("softmax_xent dlogits" + sz, dlogits, kTranscendental);
      Twin loss_only(Vec(static_cast<size_t>(rows), 0.f));
      both([&](Device& d, Side s) {
        d.softmax_xent(logits[s], labels[s], loss_only[s], Tensor{}, rows, classes, scale);
      });
      expect_parity("softmax_xent eval-only loss" + sz, loss_only, kTranscendental);

      Twin tied(tie_vec(rc, ++seed)), correct(Vec(static_cast<size_t>(rows), 5.f));
      both([&](Device& d, Side s) { d.argmax_match(tied[s], labels[s], correct[s], rows, classes); });
      expect_parity("argmax_match ties" + sz, correct, kExact);
      both([&](Device& d, Side s) { d.argmax_match(logits[s], labels[s], correct[s], rows, classes); });
      expect_parity("argmax_match" + sz, correct, kExact);
    }
  for (int64_t rows : {1, 9, 64})
    for (int64_t cols : {1, 17, 300}) {
      const std::string sz = " " + dims({rows, cols});
      const size_t rc = static_cast<size_t>(rows * cols);
      Twin pred(random_vec(rc, ++seed)), target(random_vec(rc, ++seed));
      Twin loss(Vec(static_cast<size_t>(rows), 0.f)), dpred(Vec(rc, 0.f));
      both([&](Device& d, Side s) { d.mse(pred[s], target[s], loss[s], dpred[s], rows, cols, 0.5f); });
      expect_parity("mse loss" + sz, loss, kReduction);
      expect_parity("mse dpred" + sz, dpred, kFma);
      both([&](Device& d, Side s) { d.mse(pred[s], target[s], loss[s], Tensor{}, rows, cols, 0.5f); });
      expect_parity("mse eval-only loss" + sz, loss, kReduction);
    }
}

TEST_CASE("cuda parity: token embedding and causal softmax", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  uint32_t seed = 600;
  struct E {
    int64_t rows, vocab, width;
  };
  for (const E& e : {E{1, 1, 1}, E{7, 3, 5}, E{300, 257, 33}, E{1031, 4, 64}, E{16, 1000, 1}}) {
    const std::string sz = " " + dims({e.rows, e.vocab, e.width});
    Twin ids(label_vec(static_cast<size_t>(e.rows), e.vocab, ++seed));
    Twin table(random_vec(static_cast<size_t>(e.vocab * e.width), ++seed), {e.vocab, e.width});
    Twin y(Vec(static_cast<size_t>(e.rows * e.width), std::numeric_limits<float>::quiet_NaN()), {e.rows, e.width});
    both([&](Device& d, Side s) { d.embedding_forward(ids[s], table[s], y[s], e.rows, e.vocab, e.width); });
    expect_parity("embedding_forward" + sz, y, kExact);
    Twin dy(random_vec(static_cast<size_t>(e.rows * e.width), ++seed), {e.rows, e.width});
    both([&](Device& d, Side s) { d.embedding_backward(ids[s], dy[s], table[s], e.rows, e.vocab, e.width); });
    expect_parity("embedding_backward" + sz, table, kExact);  // accumulated onto the table
  }
  {  // an id outside the vocabulary is refused before anything runs
    Tensor ids(*b.gpu, {2}), table(*b.gpu, {3, 4}), y(*b.gpu, {2, 4});
    ids.from_host(Vec{1.f, 3.f});
    CHECK_THROWS_WITH(b.gpu->embedding_forward(ids, table, y, 2, 3, 4), Catch::Contains("in row 1 is not"));
    CHECK_THROWS_WITH(b.gpu->embedding_backward(ids, y, table, 2, 3, 4), Catch::Contains("in row 1 is not"));
  }
  struct C {
    int64_t n, t;
    float scale;
  };
  for (const C& c : {C{1, 1, 1.f}, C{3, 7, 0.35f}, C{8, 64, 0.125f}, C{2, 257, 0.5f}}) {
    const std::string sz = " " + dims({c.n, c.t, c.t});
    const size_t count = static_cast<size_t>(c.n * c.t * c.t);
    Twin scores(random_vec(count, ++seed, -6.f, 6.f)), probs(Vec(count, std::numeric_limits<float>::quiet_NaN()));
    both([&](Device& d, Side s) { d.causal_softmax_forward(scores[s], probs[s], c.n, c.t, c.scale); });
    expect_parity("causal_softmax_forward" + sz, probs, kTranscendental);
    // Backward from the same (CPU) probabilities on both sides.
    Twin pc(probs.c.to_host()), dprobs(random_vec(count, ++seed)), dscores(Vec(count, 0.f));
    both([&](Device& d, Side s) { d.causal_softmax_backward(pc[s], dprobs[s], dscores[s], c.n, c.t, c.scale); });
    expect_parity("causal_softmax_backward" + sz, dscores, kTranscendental);
  }
}

TEST_CASE("cuda parity: optimizers and sum_squares", "[cuda][device]") {
  CUDA_OR_SKIP(b);
  uint32_t seed = 700;
  struct SgdCase {
    const char* name;
    float momentum, dampening, weight_decay;
    bool nesterov;
  };
  const SgdCase sgd_cases[] = {{"plain", 0.f, 0.f, 0.f, false},
                               {"weight decay", 0.f, 0.f, 0.01f, false},
                               {"momentum", 0.9f, 0.f, 0.f, false},
                               {"momentum dampening wd", 0.9f, 0.1f, 0.01f, false},
                               {"nesterov wd", 0.9f, 0.f, 0.001f, true}};
  for (size_t n : {size_t{1}, size_t{1000}, size_t{4097}})
    for (const SgdCase& sc : sgd_cases) {
      Twin p(random_vec(n, ++seed)), buf(Vec(n, 0.f));
      for (int step = 0; step < 3; ++step) {
        Twin g(random_vec(n, ++seed));
        SgdStep st;
        st.lr = 0.05f, st.momentum = sc.momentum, st.dampening = sc.dampening;
        st.weight_decay = sc.weight_decay, st.nesterov = sc.nesterov, st.first = step == 0;
        both([&](Device& d, Side s) { d.sgd_step(p[s], g[s], sc.momentum != 0.f ? buf[s] : Tensor{}, st); });
      }
      expect_parity(std::string("sgd ") + sc.name + " n=" + std::to_string(n), p, kFma);
      if (sc.momentum != 0.f) expect_parity(std::string("sgd ") + sc.name + " buffer n=" + std::to_string(n), buf, kFma);
    }
  struct AdamCase {
    const char* name;
    float weight_decay;
    bool decoupled;
  };
  for (size_t n : {size_t{1}, size_t{1000}, size_t{4097}})
    for (const AdamCase& ac : {AdamCase{"adam", 0.f, false}, AdamCase{"adam L2", 0.01f, false},
                               AdamCase{"adamw", 0.01f, true}}) {
      Twin p(random_vec(n, ++seed)), m(Vec(n, 0.f)), v(Vec(n, 0.f));
      for (int64_t step = 1; step <= 5; ++step) {
        Twin g(random_vec(n, ++seed));
        AdamStep st;
        st.lr = 1e-2f, st.weight_decay = ac.weight_decay, st.decoupled = ac.decoupled, st.step = step;
        both([&](Device& d, Side s) { d.adam_step(p[s], g[s], m[s], v[s], st); });
      }
      const std::string sz = " n=" + std::to_string(n);
      expect_parity(std::string(ac.name) + " params" + sz, p, kTranscendental);
      expect_parity(std::string(ac.name) + " m" + sz, m, kTranscendental);
      expect_parity(std::string(ac.name) + " v" + sz, v, kTranscendental);
    }
  for (size_t n : {size_t{1}, size_t{1000}, size_t{(1u << 20) + 3}}) {
    Twin t(random_vec(n, ++seed, -2.f, 2.f));
    const float c = b.cpu->sum_squares(t.c), g = b.gpu->sum_squares(t.g);
    const double err = std::fabs(static_cast<double>(g) - c) / std::max(1.0, std::fabs(static_cast<double>(c)));
    std::printf("PARITY %-34s max_err %.3e tol %.0e %s\n", ("sum_squares n=" + std::to_string(n)).c_str(), err,
                kTranscendental, err <= kTranscendental ? "pass" : "FAIL");
    CHECK(err <= kTranscendental);
  }
}
