// test_cpu_device.cpp: the CPU backend, op by op, against the naive references in
// reference_ops.h, plus Tensor handles, memory limits, parse_bytes and open_device.
// Each op runs on a 1-thread and a 2-thread device with sizes large enough to take
// the parallel paths.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "device/backends.h"
#include "device/cpu/blas_kernels.h"
#include "device/cpu/cpu_device.h"
#include "device/cpu/process_env.h"
#include "device/device.h"
#include "device/tensor.h"
#include "device/reference_ops.h"
#include "skip.h"

using namespace cleave;
using ref::Vec;

namespace {

Vec random_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

Tensor make(Device& dev, const Vec& v, Shape shape) {
  Tensor t(dev, std::move(shape));
  REQUIRE(static_cast<size_t>(t.numel()) == v.size());
  t.from_host(v);
  return t;
}
Tensor make(Device& dev, const Vec& v) { return make(dev, v, {static_cast<int64_t>(v.size())}); }

// Largest |a - b| / (abs_tol + rel_tol * |b|) over all elements; <= 1 means close.
void require_close(const Vec& got, const Vec& want, float rel = 1e-5f, float abs_tol = 1e-5f) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = abs_tol + rel * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      REQUIRE(std::fabs(got[i] - want[i]) <= tol);
    }
  }
}

// Devices the op tests run on: single-threaded and two threads.
std::vector<std::unique_ptr<Device>> devices() {
  std::vector<std::unique_ptr<Device>> out;
  out.push_back(make_cpu_device(DeviceOptions{1, 0, 0, ""}));
  out.push_back(make_cpu_device(DeviceOptions{2, 0, 0, ""}));
  return out;
}

}  // namespace

// -----------------------------------------------------------------------------------------
// Tensor handles, names, parsing, registry

TEST_CASE("numel and shape_str", "[device][tensor]") {
  CHECK(numel({}) == 1);
  CHECK(numel({64, 1, 28, 28}) == 64 * 28 * 28);
  CHECK(numel({3, 0, 2}) == 0);
  CHECK(shape_str({64, 1, 28, 28}) == "(64, 1, 28, 28)");
  CHECK(shape_str({}) == "()");
  CHECK_THROWS_AS(numel({2, -1}), std::invalid_argument);
}

TEST_CASE("tensor views, reshape, host access", "[device][tensor]") {
  auto dev = make_cpu_device({});
  Tensor base(*dev, {4, 5});
  CHECK(base.defined());
  CHECK(base.numel() == 20);
  CHECK(base.bytes() == 80);
  CHECK(reinterpret_cast<uintptr_t>(base.host_data()) % 64 == 0);
  Vec v = random_vec(20, 1);
  base.from_host(v);
  CHECK(base.to_host() == v);

  Tensor row = Tensor::view(base, 5, {5});
  CHECK(row.offset() == 5);
  CHECK(row.to_host() == Vec(v.begin() + 5, v.begin() + 10));
  Tensor sub = Tensor::view(row, 2, {3});  // offsets compose
  CHECK(sub.offset() == 7);
  CHECK(sub.to_host() == Vec(v.begin() + 7, v.begin() + 10));
  sub.from_host(Vec{1.f, 2.f, 3.f});
  CHECK(base.to_host()[8] == 2.f);
  CHECK(Tensor::view(base, 15, {5}).numel() == 5);
  CHECK_THROWS_AS(Tensor::view(base, 16, {5}), std::out_of_range);
  CHECK_THROWS_AS(Tensor::view(base, -1, {2}), std::out_of_range);
  CHECK_THROWS_AS(Tensor::view(row, 1, {5}), std::out_of_range);
  CHECK_THROWS_AS(Tensor::view(Tensor(), 0, {1}), std::out_of_range);

  Tensor r = base.reshaped({2, 10});
  CHECK(r.shape() == Shape{2, 10});
  CHECK(r.handle() == base.handle());
  CHECK_THROWS_AS(base.reshaped({3, 7}), std::invalid_argument);
  CHECK_THROWS_AS(base.from_host(Vec(3)), std::invalid_argument);

  float host[6] = {1, 2, 3, 4, 5, 6};
  Tensor w = Tensor::wrap_host(*dev, host, {2, 3});
  CHECK(w.host_data() == host);
  dev->scale(w, 2.f);
  CHECK(host[5] == 12.f);
  CHECK_FALSE(w.buffer()->release);  // non-owning
}

TEST_CASE("views keep their buffer alive", "[device][tensor]") {
  auto dev = std::make_unique<CpuDevice>(DeviceOptions{});
  Tensor v;
  {
    Tensor block(*dev, {100});
    dev->fill(block, 3.f);
    v = Tensor::view(block, 90, {10});
  }
  CHECK(dev->bytes_in_use() == 400);
  CHECK(v.to_host() == Vec(10, 3.f));
  v = Tensor();
  CHECK(dev->bytes_in_use() == 0);
}

TEST_CASE("parse_bytes", "[device]") {
  CHECK(parse_bytes("1024") == 1024);
  CHECK(parse_bytes("64K") == 64 * 1024);
  CHECK(parse_bytes("64k") == 64 * 1024);
  CHECK(parse_bytes("512M") == 512ull << 20);
  CHECK(parse_bytes("4G") == 4ull << 30);
  CHECK(parse_bytes("1.5G") == (3ull << 30) / 2);
  CHECK(parse_bytes("2GiB") == 2ull << 30);
  CHECK(parse_bytes("2gib") == 2ull << 30);
  CHECK(parse_bytes("3MB") == 3ull << 20);
  CHECK(parse_bytes("0") == 0);
  CHECK(parse_bytes("100B") == 100);
  for (const char* bad : {"", "abc", "12X", "-5M", "1.5", "M", "1.2.3G", "4 G B", "1e3"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_bytes(bad), std::invalid_argument);
  }
  try {
    parse_bytes("12X");
    FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("12X") != std::string::npos);
  }
}

TEST_CASE("open_device and backend names", "[device]") {
  CHECK(std::string(backend_name(Backend::cpu)) == "cpu");
  CHECK(std::string(backend_name(Backend::opencl)) == "opencl");
  CHECK(std::string(backend_name(Backend::cuda)) == "cuda");
  const auto compiled = compiled_backends();
  REQUIRE_FALSE(compiled.empty());
  CHECK(compiled.back() == Backend::cpu);

  auto cpu = open_device("cpu", DeviceOptions{2, 0, 0, ""});
  REQUIRE(cpu);
  CHECK(cpu->backend() == Backend::cpu);
  CHECK(cpu->host_accessible());
  CHECK(cpu->name() == "cpu (2 threads, OpenBLAS)");
  CHECK(open_device("auto"));
  try {
    open_device("nonsense");
    FAIL("no throw");
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("nonsense") != std::string::npos);
    CHECK(msg.find("cpu") != std::string::npos);
  }
  CHECK_THROWS_AS(open_device("cpu", DeviceOptions{-1, 0, 0, ""}), std::invalid_argument);
#if !CLEAVE_HAVE_CUDA
  CHECK_THROWS_WITH(open_device("cuda"), Catch::Contains("not compiled"));
#endif
#if !CLEAVE_HAVE_OPENCL
  CHECK_THROWS_WITH(open_device("opencl"), Catch::Contains("not compiled"));
#endif
}

TEST_CASE("memory limit and accounting", "[device][memory]") {
  DeviceOptions opts;
  opts.memory_limit = 1 << 20;
  CpuDevice dev(opts);
  CHECK(dev.memory().total == (1u << 20));
  CHECK(dev.memory().free <= (1u << 20));
  {
    Tensor a(dev, {128, 1024});  // 512 KiB
    CHECK(dev.bytes_in_use() == 512u << 10);
    CHECK(dev.memory().free <= 512u << 10);
    try {
      Tensor b(dev, {192, 1024});  // 768 KiB more: over the limit
      FAIL("no throw");
    } catch (const OutOfMemory& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find("limit") != std::string::npos);
      CHECK(msg.find("1.0 MiB") != std::string::npos);
      CHECK(msg.find("0.8 MiB") != std::string::npos);  // what was asked for
    }
    CHECK(dev.bytes_in_use() == 512u << 10);  // a failed allocation leaves no trace
    Tensor c(dev, {128, 1024});               // exactly fills the limit
    CHECK(dev.bytes_in_use() == 1u << 20);
    CHECK_THROWS_AS(Tensor(dev, {1}), OutOfMemory);
  }
  CHECK(dev.bytes_in_use() == 0);
  Tensor again(dev, {256, 1024});  // everything was released
  CHECK(again.numel() == 256 * 1024);

  CpuDevice unlimited{DeviceOptions{}};
  CHECK(unlimited.memory().total > (64u << 20));
  CHECK(unlimited.memory().free <= unlimited.memory().total);
}

namespace {

// MemAvailable of /proc/meminfo in bytes, 0 when it does not say.
size_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (in >> key) {
    if (key == "MemAvailable:" && in >> kib) return kib * 1024;
    std::getline(in, key);
  }
  return 0;
}

}  // namespace

TEST_CASE("the CPU's free memory is what the kernel can make available, page cache included", "[device][memory]") {
  const size_t before = mem_available();
  if (before == 0) CLEAVE_SKIP("/proc/meminfo has no MemAvailable");
  CpuDevice dev{DeviceOptions{}};
  const size_t free = dev.memory().free;
  const size_t after = mem_available();
  const size_t slack = size_t{64} << 20;  // other processes allocate meanwhile
  CHECK(free + slack >= std::min(before, after));
  CHECK(free <= std::max(before, after) + slack);
}

TEST_CASE("ops reject tensors of the wrong size or device", "[device][errors]") {
  CpuDevice a{DeviceOptions{}}, b{DeviceOptions{}};
  Tensor x(a, {10}), y(a, {10}), z(a, {9}), other(b, {10});
  CHECK_THROWS_AS(a.axpy(1.f, x, z), std::invalid_argument);
  CHECK_THROWS_AS(a.axpy(1.f, x, other), std::invalid_argument);
  CHECK_THROWS_AS(a.copy(x, z), std::invalid_argument);
  CHECK_THROWS_AS(a.mul(x, y, Tensor()), std::invalid_argument);
  CHECK_THROWS_AS(a.add_bias_rows(x, y, 3, 4), std::invalid_argument);
  CHECK_THROWS_AS(a.gemm(false, false, 2, 2, 2, 1.f, x, 1, y, 2, 0.f, y, 2), std::invalid_argument);  // lda < k
  CHECK_THROWS_AS(a.gemm(false, false, 4, 4, 4, 1.f, x, 4, y, 4, 0.f, y, 4), std::invalid_argument);  // too small
  Window2d g{1, 1, 3, 3, 5, 5, 1, 1, 0, 0};  // kernel bigger than the image
  CHECK_THROWS_AS(a.im2col(x, y, g), std::invalid_argument);
  Window2d zero_stride{1, 1, 3, 3, 2, 2, 0, 1, 0, 0};
  CHECK_THROWS_AS(a.maxpool_forward(x, y, y, zero_stride), std::invalid_argument);
  Tensor logits = make(a, {0.f, 1.f, 2.f, 3.f}, {2, 2}), loss(a, {2}), d(a, {2, 2});
  CHECK_THROWS_AS(a.softmax_xent(logits, make(a, {0.f, 2.f}), loss, d, 2, 2, 1.f), std::invalid_argument);
  CHECK_THROWS_AS(a.softmax_xent(logits, make(a, {-1.f, 0.f}), loss, d, 2, 2, 1.f), std::invalid_argument);
  CHECK_THROWS_AS(a.softmax_xent(logits, make(a, {NAN, 0.f}), loss, d, 2, 2, 1.f), std::invalid_argument);
  AdamStep bad_step;
  bad_step.step = 0;
  CHECK_THROWS_AS(a.adam_step(x, y, x, y, bad_step), std::invalid_argument);
}

// -----------------------------------------------------------------------------------------
// GEMM

TEST_CASE("gemm: all transpose combinations with padded leading dimensions", "[device][gemm]") {
  for (auto& dev : devices()) {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{7, 5, 3}, {33, 17, 65}, {1, 9, 4}, {64, 96, 80}}) {
          INFO("ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k);
          const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
          const int64_t rows_a = ta ? k : m, rows_b = tb ? n : k;
          Vec a = random_vec(static_cast<size_t>(rows_a * lda), 11);
          Vec b = random_vec(static_cast<size_t>(rows_b * ldb), 12);
          Vec c = random_vec(static_cast<size_t>(m * ldc), 13);
          Tensor ta_t = make(*dev, a), tb_t = make(*dev, b), tc_t = make(*dev, c);
          dev->gemm(ta, tb, m, n, k, 0.75f, ta_t, lda, tb_t, ldb, -0.5f, tc_t, ldc);
          Vec want = c;
          ref::gemm(ta, tb, m, n, k, 0.75f, a, lda, b, ldb, -0.5f, want, ldc);
          Vec got = tc_t.to_host();
          require_close(got, want, 1e-4f, 1e-4f);
          for (int64_t i = 0; i < m; ++i)  // padding columns of C untouched
            for (int64_t j = n; j < ldc; ++j) REQUIRE(got[i * ldc + j] == c[i * ldc + j]);
        }
  }
}

TEST_CASE("gemm: beta 0 overwrites (even NaN), k 0 scales C", "[device][gemm]") {
  CpuDevice dev{DeviceOptions{}};
  Vec a = random_vec(6, 1), b = random_vec(6, 2);
  Tensor ta = make(dev, a), tb = make(dev, b), tc = make(dev, Vec(4, NAN));
  dev.gemm(false, false, 2, 2, 3, 1.f, ta, 3, tb, 2, 0.f, tc, 2);
  Vec want(4, 0.f);
  ref::gemm(false, false, 2, 2, 3, 1.f, a, 3, b, 2, 0.f, want, 2);
  require_close(tc.to_host(), want);
  Tensor tc2 = make(dev, {1.f, 2.f, 3.f, 4.f});
  dev.gemm(false, false, 2, 2, 0, 1.f, ta, 1, tb, 2, 2.f, tc2, 2);
  CHECK(tc2.to_host() == Vec{2.f, 4.f, 6.f, 8.f});
}

// -----------------------------------------------------------------------------------------
// elementwise

TEST_CASE("copy, fill, axpy, scale, mul, sum_squares", "[device][elementwise]") {
  for (auto& dev : devices()) {
    for (size_t n : {size_t{1}, size_t{37}, size_t{100003}}) {
      Vec x = random_vec(n, 21), y = random_vec(n, 22);
      Tensor tx = make(*dev, x), ty = make(*dev, y), tout(*dev, {static_cast<int64_t>(n)});
      dev->copy(tx, tout);
      CHECK(tout.to_host() == x);
      dev->fill(tout, 2.5f);
      CHECK(tout.to_host() == Vec(n, 2.5f));
      dev->axpy(-1.5f, tx, ty);
      Vec want(n);
      for (size_t i = 0; i < n; ++i) want[i] = y[i] + -1.5f * x[i];
      require_close(ty.to_host(), want);
      dev->mul(tx, ty, tout);
      for (size_t i = 0; i < n; ++i) want[i] = x[i] * want[i];
      require_close(tout.to_host(), want);
      dev->mul(tout, tout, tout);  // in place
      for (size_t i = 0; i < n; ++i) want[i] = want[i] * want[i];
      require_close(tout.to_host(), want);
      dev->scale(tx, 3.f);
      double ss = 0;
      for (size_t i = 0; i < n; ++i) {
        want[i] = 3.f * x[i];
        ss += static_cast<double>(want[i]) * want[i];
      }
      require_close(tx.to_host(), want);
      CHECK(dev->sum_squares(tx) == Approx(ss).epsilon(1e-5));
    }
  }
}

TEST_CASE("activations forward and backward", "[device][elementwise]") {
  for (auto& dev : devices()) {
    for (Activation act : {Activation::relu, Activation::gelu, Activation::tanh, Activation::gelu_tanh}) {
      INFO("activation " << static_cast<int>(act));
      const size_t n = 70001;
      Vec x = random_vec(n, 31, -6.f, 6.f), dy = random_vec(n, 32);
      x[0] = 0.f;
      x[1] = -0.f;
      Tensor tx = make(*dev, x), ty(*dev, {static_cast<int64_t>(n)}), tdy = make(*dev, dy);
      Tensor tdx(*dev, {static_cast<int64_t>(n)});
      dev->activation_forward(act, tx, ty);
      Vec y_want(n), dx_want(n);
      for (size_t i = 0; i < n; ++i) {
        y_want[i] = ref::act(act, x[i]);
        dx_want[i] = dy[i] * ref::act_grad(act, x[i]);
      }
      require_close(ty.to_host(), y_want, 1e-5f, 1e-6f);
      dev->activation_backward(act, tx, ty, tdy, tdx);
      require_close(tdx.to_host(), dx_want, 1e-4f, 1e-6f);
      // in place: y overwrites x, dx overwrites dy
      Tensor inplace = make(*dev, x);
      dev->activation_forward(act, inplace, inplace);
      require_close(inplace.to_host(), y_want, 1e-5f, 1e-6f);
      if (act != Activation::gelu) {  // gelu backward needs x, which in-place forward destroyed
        dev->activation_backward(act, tx, inplace, tdy, tdy);
        require_close(tdy.to_host(), dx_want, 1e-4f, 1e-6f);
      }
    }
  }
}

TEST_CASE("gelu matches PyTorch's exact erf GELU at known points", "[device][elementwise]") {
  CpuDevice dev{DeviceOptions{}};
  Tensor x = make(dev, {-3.f, -1.f, 0.f, 0.5f, 2.f}), y(dev, {5});
  dev.activation_forward(Activation::gelu, x, y);
  // torch.nn.functional.gelu(torch.tensor([-3., -1., 0., .5, 2.]))
  require_close(y.to_host(), {-0.0040496f, -0.1586553f, 0.f, 0.3457312f, 1.9544997f}, 1e-5f, 1e-6f);
}

// -----------------------------------------------------------------------------------------
// bias

TEST_CASE("bias over rows and channels", "[device][bias]") {
  for (auto& dev : devices()) {
    for (auto [rows, feats] : {std::pair<int64_t, int64_t>{1, 1}, {13, 7}, {1500, 33}}) {
      Vec y = random_vec(static_cast<size_t>(rows * feats), 41), b = random_vec(static_cast<size_t>(feats), 42);
      Tensor ty = make(*dev, y), tb = make(*dev, b);
      dev->add_bias_rows(ty, tb, rows, feats);
      Vec want = y;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t f = 0; f < feats; ++f) want[r * feats + f] += b[f];
      require_close(ty.to_host(), want);
      Vec db0 = random_vec(static_cast<size_t>(feats), 43);
      Tensor tdb = make(*dev, db0);
      dev->bias_grad_rows(make(*dev, y), tdb, rows, feats);  // accumulates
      Vec dbw(static_cast<size_t>(feats));
      for (int64_t f = 0; f < feats; ++f) {
        double s = db0[f];
        for (int64_t r = 0; r < rows; ++r) s += y[r * feats + f];
        dbw[f] = static_cast<float>(s);
      }
      require_close(tdb.to_host(), dbw, 1e-4f, 1e-4f);
    }
    for (auto [n, c, hw] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 7}, {16, 8, 28 * 28}}) {
      Vec y = random_vec(static_cast<size_t>(n * c * hw), 44), b = random_vec(static_cast<size_t>(c), 45);
      Tensor ty = make(*dev, y), tb = make(*dev, b);
      dev->add_bias_channels(ty, tb, n, c, hw);
      Vec want = y;
      for (int64_t i = 0; i < n * c * hw; ++i) want[i] += b[(i / hw) % c];
      require_close(ty.to_host(), want);
      Vec db0 = random_vec(static_cast<size_t>(c), 46);
      Tensor tdb = make(*dev, db0);
      dev->bias_grad_channels(make(*dev, y), tdb, n, c, hw);
      Vec dbw(static_cast<size_t>(c));
      for (int64_t ci = 0; ci < c; ++ci) {
        double s = db0[ci];
        for (int64_t ni = 0; ni < n; ++ni)
          for (int64_t i = 0; i < hw; ++i) s += y[(ni * c + ci) * hw + i];
        dbw[ci] = static_cast<float>(s);
      }
      require_close(tdb.to_host(), dbw, 1e-4f, 1e-4f);
    }
  }
}

// -----------------------------------------------------------------------------------------
// convolution helpers and pooling

namespace {

// Geometries with odd sizes, strides and paddings (n, c, h, w, kh, kw, sh, sw, ph, pw).
std::vector<Window2d> conv_windows() {
  return {
      {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},  {2, 3, 5, 7, 3, 3, 1, 1, 1, 1}, {2, 3, 5, 7, 3, 3, 1, 1, 0, 0},
      {1, 2, 6, 5, 3, 2, 2, 1, 1, 0},  {3, 2, 7, 9, 5, 3, 2, 3, 2, 1}, {2, 1, 4, 4, 4, 4, 1, 1, 0, 0},
      {8, 4, 16, 16, 3, 3, 1, 1, 1, 1},  // large enough for the parallel paths
      {4, 3, 9, 11, 1, 1, 2, 2, 0, 0},   {2, 2, 3, 3, 3, 3, 2, 2, 2, 2},
  };
}

std::string describe(const Window2d& g) {
  return std::to_string(g.n) + "x" + std::to_string(g.c) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w) +
         " k" + std::to_string(g.kh) + "x" + std::to_string(g.kw) + " s" + std::to_string(g.sh) + "x" +
         std::to_string(g.sw) + " p" + std::to_string(g.ph) + "x" + std::to_string(g.pw);
}

}  // namespace

TEST_CASE("im2col and col2im", "[device][conv]") {
  for (auto& dev : devices()) {
    for (const Window2d& g : conv_windows()) {
      INFO(describe(g));
      const int64_t rows = g.c * g.kh * g.kw, cols = g.n * g.out_h() * g.out_w();
      Vec x = random_vec(static_cast<size_t>(g.n * g.c * g.h * g.w), 51);
      Tensor tx = make(*dev, x, {g.n, g.c, g.h, g.w});
      Tensor tcols = make(*dev, Vec(static_cast<size_t>(rows * cols), NAN), {rows, cols});  // all overwritten
      dev->im2col(tx, tcols, g);
      CHECK(tcols.to_host() == ref::im2col(x, g));

      Vec c = random_vec(static_cast<size_t>(rows * cols), 52);
      Tensor tdx = make(*dev, Vec(x.size(), NAN), {g.n, g.c, g.h, g.w});  // overwritten
      dev->col2im(make(*dev, c), tdx, g);
      require_close(tdx.to_host(), ref::col2im(c, g), 1e-5f, 1e-5f);
    }
  }
}

namespace {

// What conv2d_forward and conv2d_backward produce for one geometry.
struct ConvResult {
  Vec y, dw, db, dx;
};

// Runs both conv2d ops on dev with seeded inputs; dw and db start from seeded
// values (the ops accumulate), dx from NaN (overwritten). `lowering` calls the
// portable Device implementation instead of the backend's own.
ConvResult run_conv(Device& dev, const Window2d& g, int64_t oc, bool bias, bool want_dx, bool lowering) {
  const int64_t ckk = g.c * g.kh * g.kw, ohw = g.out_h() * g.out_w();
  Tensor x = make(dev, random_vec(static_cast<size_t>(g.n * g.c * g.h * g.w), 71), {g.n, g.c, g.h, g.w});
  Tensor w = make(dev, random_vec(static_cast<size_t>(oc * ckk), 72), {oc, ckk});
  Tensor b = bias ? make(dev, random_vec(static_cast<size_t>(oc), 73)) : Tensor();
  Tensor y = make(dev, Vec(static_cast<size_t>(g.n * oc * ohw), NAN), {g.n, oc, ohw});
  Tensor dy = make(dev, random_vec(static_cast<size_t>(g.n * oc * ohw), 74), {g.n, oc, ohw});
  Tensor dw = make(dev, random_vec(static_cast<size_t>(oc * ckk), 75), {oc, ckk});
  Tensor db = bias ? make(dev, random_vec(static_cast<size_t>(oc), 76)) : Tensor();
  Tensor dx = want_dx ? make(dev, Vec(static_cast<size_t>(g.n * g.c * g.h * g.w), NAN), {g.n, g.c, g.h, g.w})
                      : Tensor();
  if (lowering) {
    dev.Device::conv2d_forward(x, w, b, y, g, oc);
    dev.Device::conv2d_backward(x, w, dy, dw, db, dx, g, oc);
  } else {
    dev.conv2d_forward(x, w, b, y, g, oc);
    dev.conv2d_backward(x, w, dy, dw, db, dx, g, oc);
  }
  return {y.to_host(), dw.to_host(), bias ? db.to_host() : Vec(), want_dx ? dx.to_host() : Vec()};
}

// conv_windows() plus batches large enough for several samples per gradient group
// and a 1x1 window with stride 1 (which skips im2col on the CPU).
std::vector<Window2d> conv_op_windows() {
  std::vector<Window2d> out = conv_windows();
  out.push_back({40, 3, 6, 6, 3, 3, 1, 1, 1, 1});
  out.push_back({17, 2, 5, 4, 2, 2, 2, 1, 0, 1});
  out.push_back({5, 6, 7, 7, 1, 1, 1, 1, 0, 0});
  return out;
}

// The reference result, with dw and db accumulated onto run_conv's starting values.
ConvResult reference_conv(const Window2d& g, int64_t oc, bool bias, bool want_dx) {
  const int64_t ckk = g.c * g.kh * g.kw;
  const Vec x = random_vec(static_cast<size_t>(g.n * g.c * g.h * g.w), 71);
  const Vec w = random_vec(static_cast<size_t>(oc * ckk), 72);
  const Vec dy = random_vec(static_cast<size_t>(g.n * oc * g.out_h() * g.out_w()), 74);
  ConvResult r;
  r.y = ref::conv2d(x, w, bias ? random_vec(static_cast<size_t>(oc), 73) : Vec(), g, oc);
  Vec dw, db, dx;
  ref::conv2d_backward(x, w, dy, g, oc, dw, db, dx);
  r.dw = random_vec(static_cast<size_t>(oc * ckk), 75);
  for (size_t i = 0; i < dw.size(); ++i) r.dw[i] += dw[i];
  if (bias) {
    r.db = random_vec(static_cast<size_t>(oc), 76);
    for (size_t i = 0; i < db.size(); ++i) r.db[i] += db[i];
  }
  if (want_dx) r.dx = dx;
  return r;
}

void require_close_conv(const ConvResult& got, const ConvResult& want) {
  require_close(got.y, want.y, 1e-4f, 1e-4f);
  require_close(got.dw, want.dw, 1e-4f, 1e-4f);
  require_close(got.db, want.db, 1e-4f, 1e-4f);
  require_close(got.dx, want.dx, 1e-4f, 1e-4f);
}

}  // namespace

TEST_CASE("conv2d forward and backward against a direct convolution", "[device][conv]") {
  for (auto& dev : devices()) {
    for (const Window2d& g : conv_op_windows()) {
      for (int64_t oc : {1, 5, 16}) {
        for (bool bias : {true, false}) {
          const bool want_dx = oc != 5;  // the first layer of a model wants no dx
          INFO(dev->name() << " " << describe(g) << " oc " << oc << (bias ? " bias" : "") << (want_dx ? " dx" : ""));
          const ConvResult want = reference_conv(g, oc, bias, want_dx);
          require_close_conv(run_conv(*dev, g, oc, bias, want_dx, false), want);
          require_close_conv(run_conv(*dev, g, oc, bias, want_dx, true), want);  // the portable lowering
        }
      }
    }
  }
}

TEST_CASE("conv2d gives the same bits on 1, 2 and 3 threads", "[device][conv]") {
  // Weight gradients are summed in groups fixed by the batch size, not the team.
  CpuDevice one{DeviceOptions{1, 0, 0, ""}}, two{DeviceOptions{2, 0, 0, ""}}, three{DeviceOptions{3, 0, 0, ""}};
  for (const Window2d& g : conv_op_windows()) {
    if (g.n < 2) continue;
    INFO(describe(g));
    const ConvResult a = run_conv(one, g, 16, true, true, false);
    for (CpuDevice* dev : {&two, &three}) {
      const ConvResult b = run_conv(*dev, g, 16, true, true, false);
      CHECK(a.y == b.y);
      CHECK(a.dw == b.dw);
      CHECK(a.db == b.db);
      CHECK(a.dx == b.dx);
    }
  }
}

TEST_CASE("swap_axes01", "[device][conv]") {
  for (auto& dev : devices()) {
    for (auto [a, b, r] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 1}, {7, 4, 3}, {40, 70, 1},
                           {16, 8, 196}, {5, 9, 8}, {64, 33, 2}}) {
      INFO(a << " " << b << " " << r);
      Vec src = random_vec(static_cast<size_t>(a * b * r), 61);
      Tensor tdst(*dev, {b, a, r});
      dev->swap_axes01(make(*dev, src), tdst, a, b, r);
      CHECK(tdst.to_host() == ref::swap_axes01(src, a, b, r));
    }
  }
}

TEST_CASE("max pooling, ties pick the first maximum", "[device][pool]") {
  std::vector<Window2d> windows = {
      {2, 3, 6, 6, 2, 2, 2, 2, 0, 0}, {1, 2, 7, 5, 3, 3, 2, 2, 1, 1}, {2, 2, 5, 8, 3, 2, 1, 2, 1, 1},
      {3, 1, 9, 9, 3, 3, 3, 3, 0, 0}, {16, 8, 28, 28, 2, 2, 2, 2, 0, 0}, {1, 2, 7, 9, 2, 2, 2, 2, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
  };
  for (auto& dev : devices()) {
    for (const Window2d& g : windows) {
      INFO(describe(g));
      // Few distinct values so windows contain ties; negatives so padding must not win.
      Vec x = random_vec(static_cast<size_t>(g.n * g.c * g.h * g.w), 71, -4.f, 0.f);
      for (float& v : x) v = std::floor(v);
      const int64_t ny = g.n * g.c * g.out_h() * g.out_w();
      Tensor ty(*dev, {ny}), targ(*dev, {ny});
      dev->maxpool_forward(make(*dev, x), ty, targ, g);
      Vec y_want, arg_want;
      ref::maxpool(x, g, y_want, arg_want);
      CHECK(ty.to_host() == y_want);
      CHECK(targ.to_host() == arg_want);

      Vec dy = random_vec(static_cast<size_t>(ny), 72);
      Tensor tdx = make(*dev, Vec(x.size(), NAN));
      dev->maxpool_backward(make(*dev, dy), targ, tdx, g);
      require_close(tdx.to_host(), ref::maxpool_backward(dy, arg_want, g), 1e-6f, 1e-6f);
    }
  }
}

TEST_CASE("average pooling counts padding in the divisor", "[device][pool]") {
  std::vector<Window2d> windows = {
      {2, 3, 6, 6, 2, 2, 2, 2, 0, 0}, {1, 2, 7, 5, 3, 3, 2, 2, 1, 1}, {2, 2, 5, 8, 3, 2, 1, 2, 1, 1},
      {16, 8, 28, 28, 3, 3, 1, 1, 1, 1},
  };
  for (auto& dev : devices()) {
    for (const Window2d& g : windows) {
      INFO(describe(g));
      Vec x = random_vec(static_cast<size_t>(g.n * g.c * g.h * g.w), 81);
      const int64_t ny = g.n * g.c * g.out_h() * g.out_w();
      Tensor ty(*dev, {ny});
      dev->avgpool_forward(make(*dev, x), ty, g);
      require_close(ty.to_host(), ref::avgpool(x, g), 1e-5f, 1e-6f);
      Vec dy = random_vec(static_cast<size_t>(ny), 82);
      Tensor tdx = make(*dev, Vec(x.size(), NAN));
      dev->avgpool_backward(make(*dev, dy), tdx, g);
      require_close(tdx.to_host(), ref::avgpool_backward(dy, g), 1e-5f, 1e-6f);
    }
  }
  // Hand-checked: 3x3 window, padding 1, corner output sees 4 real values / 9.
  CpuDevice dev{DeviceOptions{}};
  Tensor x = make(dev, Vec(9, 9.f)), y(dev, {9});
  dev.avgpool_forward(x, y, Window2d{1, 1, 3, 3, 3, 3, 1, 1, 1, 1});
  CHECK(y.to_host()[0] == 4.f);
  CHECK(y.to_host()[4] == 9.f);
}

// -----------------------------------------------------------------------------------------
// layer norm

TEST_CASE("layer norm forward, backward against finite differences", "[device][layernorm]") {
  for (auto& dev : devices()) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {7, 33}, {2048, 24}}) {
      INFO(rows << "x" << cols);
      const float eps = 1e-5f;
      Vec x = random_vec(static_cast<size_t>(rows * cols), 91, -2.f, 3.f);
      Vec gamma = random_vec(static_cast<size_t>(cols), 92, 0.5f, 1.5f);
      Vec beta = random_vec(static_cast<size_t>(cols), 93);
      Tensor tx = make(*dev, x), tg = make(*dev, gamma), tb = make(*dev, beta);
      Tensor ty(*dev, {rows, cols}), tmean(*dev, {rows}), trstd(*dev, {rows});
      dev->layernorm_forward(tx, tg, tb, ty, tmean, trstd, rows, cols, eps);
      Vec mean_want, rstd_want;
      Vec y_want = ref::layernorm(x, gamma, beta, rows, cols, eps, &mean_want, &rstd_want);
      require_close(ty.to_host(), y_want, 1e-4f, 1e-4f);
      require_close(tmean.to_host(), mean_want, 1e-5f, 1e-5f);
      require_close(trstd.to_host(), rstd_want, 1e-4f, 1e-4f);

      Vec dy = random_vec(static_cast<size_t>(rows * cols), 94);
      Vec dg0 = random_vec(static_cast<size_t>(cols), 95), db0 = random_vec(static_cast<size_t>(cols), 96);
      Tensor tdy = make(*dev, dy), tdx(*dev, {rows, cols}), tdg = make(*dev, dg0), tdb = make(*dev, db0);
      dev->layernorm_backward(tx, tg, tmean, trstd, tdy, tdx, tdg, tdb, rows, cols);
      if (rows * cols > 1000) continue;  // finite differences only on the small cases
      // L = sum(dy * y); numeric dL/dx, dL/dgamma, dL/dbeta in double.
      auto loss = [&](const Vec& xx, const Vec& gg, const Vec& bb) {
        std::vector<double> xd(xx.begin(), xx.end());
        double total = 0;
        for (int64_t r = 0; r < rows; ++r) {
          double mu = 0, var = 0;
          for (int64_t j = 0; j < cols; ++j) mu += xd[r * cols + j];
          mu /= static_cast<double>(cols);
          for (int64_t j = 0; j < cols; ++j) var += (xd[r * cols + j] - mu) * (xd[r * cols + j] - mu);
          var /= static_cast<double>(cols);
          for (int64_t j = 0; j < cols; ++j)
            total += dy[r * cols + j] * ((xd[r * cols + j] - mu) / std::sqrt(var + eps) * gg[j] + bb[j]);
        }
        return total;
      };
      auto numeric = [&](Vec& v, size_t i, const std::function<double()>& f) {
        const float keep = v[i];
        const float h = 1e-2f;
        v[i] = keep + h;
        const double up = f();
        v[i] = keep - h;
        const double down = f();
        v[i] = keep;
        return static_cast<float>((up - down) / (2.0 * h));
      };
      Vec dx_want(x.size()), dg_want(gamma.size()), db_want(beta.size());
      Vec xs = x, gs = gamma, bs = beta;
      for (size_t i = 0; i < x.size(); ++i) dx_want[i] = numeric(xs, i, [&] { return loss(xs, gs, bs); });
      for (size_t j = 0; j < gamma.size(); ++j) {
        dg_want[j] = dg0[j] + numeric(gs, j, [&] { return loss(xs, gs, bs); });
        db_want[j] = db0[j] + numeric(bs, j, [&] { return loss(xs, gs, bs); });
      }
      require_close(tdx.to_host(), dx_want, 2e-3f, 2e-3f);
      require_close(tdg.to_host(), dg_want, 1e-3f, 1e-3f);
      require_close(tdb.to_host(), db_want, 1e-3f, 1e-3f);
    }
  }
}

// -----------------------------------------------------------------------------------------
// losses

TEST_CASE("softmax cross-entropy", "[device][loss]") {
  for (auto& dev : devices()) {
    for (auto [rows, classes] : {std::pair<int64_t, int64_t>{1, 1}, {5, 3}, {4096, 10}, {7, 700}}) {
      Vec z = random_vec(static_cast<size_t>(rows * classes), 101, -5.f, 5.f);
      Vec labels(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) labels[r] = static_cast<float>((r * 7) % classes);
      const float scale = 1.f / static_cast<float>(rows);
      Tensor tz = make(*dev, z), tl = make(*dev, labels), tloss(*dev, {rows}), td(*dev, {rows, classes});
      dev->softmax_xent(tz, tl, tloss, td, rows, classes, scale);
      Vec loss_want(static_cast<size_t>(rows)), d_want(z.size());
      for (int64_t r = 0; r < rows; ++r) {
        double sum = 0;
        for (int64_t j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(z[r * classes + j]));
        const auto label = static_cast<int64_t>(labels[r]);
        loss_want[r] = static_cast<float>(std::log(sum) - z[r * classes + label]);
        for (int64_t j = 0; j < classes; ++j)
          d_want[r * classes + j] =
              static_cast<float>((std::exp(static_cast<double>(z[r * classes + j])) / sum - (j == label)) * scale);
      }
      require_close(tloss.to_host(), loss_want, 1e-5f, 1e-5f);
      require_close(td.to_host(), d_want, 1e-4f, 1e-7f);
      Tensor tloss2(*dev, {rows});
      dev->softmax_xent(tz, tl, tloss2, Tensor(), rows, classes, scale);  // no gradient wanted
      CHECK(tloss2.to_host() == tloss.to_host());
      Tensor tin = make(*dev, z), tloss3(*dev, {rows});
      dev->softmax_xent(tin, tl, tloss3, tin, rows, classes, scale);  // the gradient over its own logits
      CHECK(tloss3.to_host() == tloss.to_host());
      CHECK(tin.to_host() == td.to_host());
    }
  }
  // Numerically stable for huge logits.
  CpuDevice dev{DeviceOptions{}};
  Tensor z = make(dev, {1000.f, 0.f, -1000.f, 1000.f}, {2, 2}), lab = make(dev, {1.f, 0.f});
  Tensor loss(dev, {2}), d(dev, {2, 2});
  dev.softmax_xent(z, lab, loss, d, 2, 2, 1.f);
  require_close(loss.to_host(), {1000.f, 2000.f}, 1e-6f, 1e-3f);
  require_close(d.to_host(), {1.f, -1.f, -1.f, 1.f}, 1e-6f, 1e-6f);
}

TEST_CASE("mean squared error", "[device][loss]") {
  for (auto& dev : devices()) {
    const int64_t rows = 1000, cols = 37;
    Vec p = random_vec(static_cast<size_t>(rows * cols), 111), t = random_vec(static_cast<size_t>(rows * cols), 112);
    Tensor tl(*dev, {rows}), td(*dev, {rows, cols});
    dev->mse(make(*dev, p), make(*dev, t), tl, td, rows, cols, 0.5f);
    Vec lw(static_cast<size_t>(rows)), dw(p.size());
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double diff = static_cast<double>(p[r * cols + j]) - t[r * cols + j];
        s += diff * diff;
        dw[r * cols + j] = static_cast<float>(2.0 * diff * 0.5);
      }
      lw[r] = static_cast<float>(s);
    }
    require_close(tl.to_host(), lw, 1e-5f, 1e-5f);
    require_close(td.to_host(), dw, 1e-5f, 1e-6f);
  }
}

TEST_CASE("argmax_match, first maximum wins", "[device][loss]") {
  CpuDevice dev{DeviceOptions{}};
  Tensor z = make(dev, {1.f, 3.f, 3.f,  //
                        5.f, 1.f, 5.f,  //
                        0.f, 0.f, 0.f,  //
                        -1.f, -2.f, -0.5f},
                  {4, 3});
  Tensor labels = make(dev, {1.f, 2.f, 0.f, 2.f}), correct(dev, {4});
  dev.argmax_match(z, labels, correct, 4, 3);
  CHECK(correct.to_host() == Vec{1.f, 0.f, 1.f, 1.f});
}

// -----------------------------------------------------------------------------------------
// optimizers (formulas of torch.optim.SGD / Adam / AdamW written out per element)

TEST_CASE("sgd_step: PyTorch semantics over 3 steps", "[device][optim]") {
  struct Case {
    float momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (auto& dev : devices()) {
    for (Case c : {Case{0.f, 0.f, 0.f, false}, Case{0.f, 0.f, 0.01f, false}, Case{0.9f, 0.f, 0.f, false},
                   Case{0.9f, 0.1f, 0.05f, false}, Case{0.8f, 0.f, 0.01f, true}}) {
      INFO("momentum " << c.momentum << " dampening " << c.dampening << " wd " << c.weight_decay << " nesterov "
                       << c.nesterov);
      const size_t n = 50001;
      Vec p = random_vec(n, 121), buf(n, 0.f);
      Tensor tp = make(*dev, p), tg(*dev, {static_cast<int64_t>(n)});
      Tensor tbuf = c.momentum != 0.f ? Tensor(*dev, {static_cast<int64_t>(n)}) : Tensor();
      for (int step = 0; step < 3; ++step) {
        Vec g = random_vec(n, 130 + step);
        tg.from_host(g);
        SgdStep s;
        s.lr = 0.1f;
        s.momentum = c.momentum;
        s.dampening = c.dampening;
        s.weight_decay = c.weight_decay;
        s.nesterov = c.nesterov;
        s.first = step == 0;
        dev->sgd_step(tp, tg, tbuf, s);
        for (size_t i = 0; i < n; ++i) {
          double d = g[i] + static_cast<double>(c.weight_decay) * p[i];
          if (c.momentum != 0.f) {
            buf[i] = static_cast<float>(step == 0 ? d : c.momentum * buf[i] + (1.0 - c.dampening) * d);
            d = c.nesterov ? d + c.momentum * static_cast<double>(buf[i]) : buf[i];
          }
          p[i] = static_cast<float>(p[i] - 0.1 * d);
        }
        require_close(tp.to_host(), p, 1e-5f, 1e-6f);
        if (c.momentum != 0.f) require_close(tbuf.to_host(), buf, 1e-5f, 1e-6f);
        CHECK(tg.to_host() == g);  // gradients are not modified
      }
    }
  }
}

TEST_CASE("adam_step: Adam and AdamW over 3 steps", "[device][optim]") {
  for (auto& dev : devices()) {
    for (bool decoupled : {false, true}) {
      for (float wd : {0.f, 0.1f}) {
        INFO("decoupled " << decoupled << " wd " << wd);
        const size_t n = 40003;
        Vec p = random_vec(n, 141), m(n, 0.f), v(n, 0.f);
        Tensor tp = make(*dev, p), tg(*dev, {static_cast<int64_t>(n)});
        Tensor tm = make(*dev, m), tv = make(*dev, v);
        const double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-6;
        for (int step = 1; step <= 3; ++step) {
          Vec g = random_vec(n, 150 + step);
          tg.from_host(g);
          AdamStep s;
          s.lr = static_cast<float>(lr);
          s.beta1 = static_cast<float>(b1);
          s.beta2 = static_cast<float>(b2);
          s.eps = static_cast<float>(eps);
          s.weight_decay = wd;
          s.decoupled = decoupled;
          s.step = step;
          dev->adam_step(tp, tg, tm, tv, s);
          for (size_t i = 0; i < n; ++i) {
            double pi = p[i], gi = g[i];
            if (decoupled) pi *= 1.0 - lr * wd;
            else gi += wd * pi;
            const double mi = b1 * m[i] + (1 - b1) * gi;
            const double vi = b2 * v[i] + (1 - b2) * gi * gi;
            m[i] = static_cast<float>(mi);
            v[i] = static_cast<float>(vi);
            const double mhat = mi / (1 - std::pow(b1, step)), vhat = vi / (1 - std::pow(b2, step));
            p[i] = static_cast<float>(pi - lr * mhat / (std::sqrt(vhat) + eps));
          }
          require_close(tp.to_host(), p, 1e-5f, 1e-6f);
          require_close(tm.to_host(), m, 1e-5f, 1e-7f);
          require_close(tv.to_host(), v, 1e-5f, 1e-8f);
        }
      }
    }
  }
}

// OpenBLAS's kernel choice (device/cpu/blas_kernels.h): advice only where its
// kernels lack vector units this CPU has.
TEST_CASE("the daemon's advice on OpenBLAS kernels below the CPU names the core type to start with",
          "[device][cpu]") {
  const CpuVectorUnits none{}, avx2{true, false}, avx512{true, true};
  const std::string on_vm = blas_kernel_advice("Prescott", avx512);
  INFO(on_vm);
  CHECK(on_vm.find("Prescott") != std::string::npos);
  CHECK(on_vm.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
  CHECK(blas_kernel_advice("Sandybridge", avx2).find("OPENBLAS_CORETYPE=Haswell") != std::string::npos);
  CHECK(blas_kernel_advice("core2", avx2).find("OPENBLAS_CORETYPE=Haswell") != std::string::npos);
  CHECK(blas_kernel_advice("Prescott", none).empty());   // an old CPU gets old kernels: nothing to say
  CHECK(blas_kernel_advice("Haswell", avx2).empty());
  CHECK(blas_kernel_advice("Haswell", avx512).empty());  // AVX2 kernels on AVX-512: not several times slower
  CHECK(blas_kernel_advice("SkylakeX", avx512).empty());
  CHECK(blas_kernel_advice("Zen", avx2).empty());
  CHECK(blas_kernel_advice("ARMV8", none).empty());
  // The core type alone, for the environment of a process to start (cleave demo).
  CHECK(blas_better_coretype("Prescott", avx512) == "SkylakeX");
  CHECK(blas_better_coretype("Sandybridge", avx2) == "Haswell");
  CHECK(blas_better_coretype("Prescott", none).empty());
  CHECK(blas_better_coretype("Haswell", avx512).empty());
  // The finding alone, which the restart note and the advice both start with.
  CHECK(on_vm.rfind(blas_kernel_mismatch("Prescott", avx512), 0) == 0);
  CHECK(blas_kernel_mismatch("Prescott", avx512).find("AVX-512") != std::string::npos);
  CHECK(blas_kernel_mismatch("Haswell", avx2).empty());
  // This process: whatever OpenBLAS chose here, the check runs, and advice and core type agree.
  CHECK_NOTHROW(openblas_kernel_advice());
  CHECK(openblas_kernel_advice().empty() == openblas_better_coretype().empty());
  CHECK(openblas_kernel_mismatch().empty() == openblas_better_coretype().empty());
}

// What cleave and cleaved set before restarting (device/cpu/process_env.h):
// only what is unset, the user's own values kept.
TEST_CASE("the restart sets OMP_WAIT_POLICY and a better OPENBLAS_CORETYPE only where they are unset",
          "[device][cpu]") {
  auto names = [](const std::vector<EnvSetting>& set) {
    std::string out;
    for (const EnvSetting& s : set) out += s.name + "=" + s.value + " ";
    return out;
  };
  CHECK(names(cpu_environment_to_set(nullptr, nullptr, "SkylakeX")) == "OMP_WAIT_POLICY=passive OPENBLAS_CORETYPE=SkylakeX ");
  CHECK(names(cpu_environment_to_set(nullptr, nullptr, "")) == "OMP_WAIT_POLICY=passive ");
  CHECK(names(cpu_environment_to_set("active", nullptr, "Haswell")) == "OPENBLAS_CORETYPE=Haswell ");
  CHECK(cpu_environment_to_set("active", nullptr, "").empty());
  CHECK(cpu_environment_to_set("passive", "Prescott", "SkylakeX").empty());  // a core type set by hand, even a poor one
  CHECK(cpu_environment_to_set("", "", "SkylakeX").empty());                 // set, if empty, is set
}
