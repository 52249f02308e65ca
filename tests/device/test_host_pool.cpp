// test_host_pool.cpp: the CPU backend's block pool (device/cpu/host_pool.h):
// released blocks come back for the same size, the cache stays within the peak
// in use and the memory limit, and old sizes age out; the device's peak bytes in
// use count every allocation, the ops' own scratch included.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "device/cpu/cpu_device.h"
#include "device/cpu/host_pool.h"
#include "device/device.h"
#include "device/tensor.h"

using namespace cleave;

TEST_CASE("host pool hands a released block out again for the same size", "[device][memory]") {
  HostPool pool(0);
  void* a = pool.allocate(1000);
  REQUIRE(reinterpret_cast<std::uintptr_t>(a) % HostPool::kAlignment == 0);
  CHECK(pool.in_use() == 1000);
  pool.release(a, 1000);
  CHECK(pool.in_use() == 0);
  CHECK(pool.cached() == 1024);  // rounded to the alignment
  CHECK(pool.allocate(1000) == a);
  CHECK(pool.cached() == 0);
  void* b = pool.allocate(5000);  // another size: a fresh block
  CHECK(b != a);
  pool.release(b, 5000);
  pool.release(a, 1000);
}

TEST_CASE("host pool caches no more than the peak in use, dropping the oldest sizes", "[device][memory]") {
  HostPool pool(0);
  void* a = pool.allocate(4096);
  void* b = pool.allocate(4096);
  pool.release(a, 4096);
  pool.release(b, 4096);
  CHECK(pool.cached() == 8192);  // the peak was 8192
  void* c = pool.allocate(8192);  // no cached block of this size; 8192 in use now
  CHECK(pool.cached() == 8192);
  pool.release(c, 8192);  // the peak is still 8192: both 4096 blocks go, c stays
  CHECK(pool.cached() == 8192);
  CHECK(pool.allocate(8192) == c);
  CHECK(pool.cached() == 0);
  pool.release(c, 8192);
}

TEST_CASE("host pool keeps in use plus cached within the limit", "[device][memory]") {
  HostPool pool(64 * 1024);
  void* a = pool.allocate(32 * 1024);
  void* b = pool.allocate(16 * 1024);
  pool.release(a, 32 * 1024);
  CHECK(pool.cached() == 32 * 1024);
  // 16 KiB in use + 32 KiB cached + 24 KiB new would pass the limit: the cache gives way.
  void* c = pool.allocate(24 * 1024);
  CHECK(pool.in_use() == 40 * 1024);
  CHECK(pool.cached() == 0);
  CHECK_THROWS_AS(pool.allocate(32 * 1024), OutOfMemory);  // 40 + 32 KiB in use: over
  CHECK(pool.in_use() == 40 * 1024);                         // a refused request leaves no trace
  pool.release(b, 16 * 1024);
  pool.release(c, 24 * 1024);
  CHECK(pool.cached() <= 64 * 1024);
}

TEST_CASE("host pool trim frees the cache and keeps blocks in use", "[device][memory]") {
  HostPool pool(0);
  void* a = pool.allocate(4096);
  void* b = pool.allocate(8192);
  pool.release(b, 8192);
  CHECK(pool.cached() == 8192);
  pool.trim();
  CHECK(pool.cached() == 0);
  CHECK(pool.in_use() == 4096);
  pool.release(a, 4096);  // still a valid block
  CHECK(pool.cached() == 4096);
}

TEST_CASE("cpu device tensors reuse released memory", "[device][memory]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  const float* first = nullptr;
  {
    Tensor t(dev, {256, 1024});
    first = t.host_data();
  }
  CHECK(dev.bytes_in_use() == 0);
  CHECK(dev.bytes_cached() == 1u << 20);
  Tensor again(dev, {1024, 256});  // same bytes, another shape
  CHECK(again.host_data() == first);
  CHECK(dev.bytes_cached() == 0);
  {
    Tensor more(dev, {1024});
  }
  CHECK(dev.bytes_cached() > 0);
  dev.release_cached_memory();  // what a daemon does when its job ends
  CHECK(dev.bytes_cached() == 0);
  CHECK(dev.bytes_in_use() == 1u << 20);
}

TEST_CASE("host pool keeps the peak bytes in use until reset_peak", "[device][memory]") {
  HostPool pool(0);
  void* a = pool.allocate(1000);
  void* b = pool.allocate(3000);
  CHECK(pool.peak_in_use() == 4000);  // requested bytes, not rounded blocks
  pool.release(b, 3000);
  CHECK(pool.peak_in_use() == 4000);  // a high-water mark
  void* c = pool.allocate(3000);      // served from the cache: still counted
  CHECK(pool.peak_in_use() == 4000);
  pool.release(c, 3000);
  pool.reset_peak();
  CHECK(pool.peak_in_use() == 1000);  // what is in use now
  void* d = pool.allocate(500);
  CHECK(pool.peak_in_use() == 1500);
  pool.release(d, 500);
  pool.release(a, 1000);
  CHECK(pool.peak_in_use() == 1500);
}

TEST_CASE("a CPU device's peak counts its tensors and its ops' own scratch", "[device][memory]") {
  DeviceOptions opts;
  opts.threads = 2;
  CpuDevice dev(opts);
  const size_t start = dev.bytes_in_use();
  dev.reset_peak();
  CHECK(dev.peak_bytes_in_use() == start);
  {
    Tensor a(dev, {1000});
    Tensor b(dev, {3000});
    CHECK(dev.peak_bytes_in_use() == start + 16000);
  }
  CHECK(dev.bytes_in_use() == start);
  CHECK(dev.peak_bytes_in_use() == start + 16000);
  dev.reset_peak();
  CHECK(dev.peak_bytes_in_use() == start);
  // bias_grad_rows sums rows into per-thread partials taken from the pool: they show in
  // the peak (and count against --memory-limit) although they are gone when it returns.
  const int64_t rows = 4096, features = 64;
  Tensor dy(dev, {rows, features});
  Tensor db(dev, {features});
  dev.fill(dy, 1.f);
  dev.fill(db, 0.f);
  dev.reset_peak();
  const size_t held = dev.bytes_in_use();
  dev.bias_grad_rows(dy, db, rows, features);
  CHECK(dev.bytes_in_use() == held);
  CHECK(dev.peak_bytes_in_use() >= held + features * sizeof(float));
  CHECK(dev.peak_bytes_in_use() - held <= CpuDevice::bias_grad_rows_workspace_bytes(rows, features));
  CHECK(db.to_host() == std::vector<float>(features, static_cast<float>(rows)));
  // The convolution's columns and weight-gradient partials, within the bound the memory
  // model uses.
  Window2d g;
  g.n = 8, g.c = 3, g.h = 16, g.w = 16, g.kh = 3, g.kw = 3, g.ph = 1, g.pw = 1;
  const int64_t oc = 4, ckk = 27, ohw = 256;
  Tensor x(dev, {g.n, g.c, g.h, g.w}), w(dev, {oc, ckk}), bias(dev, {oc}), y(dev, {g.n, oc, 16, 16});
  Tensor dw(dev, {oc, ckk}), dbias(dev, {oc}), dx(dev, {g.n, g.c, g.h, g.w});
  for (const Tensor* t : {&x, &w, &bias, &dw, &dbias}) dev.fill(*t, 0.5f);
  dev.reset_peak();
  const size_t before = dev.bytes_in_use();
  dev.conv2d_forward(x, w, bias, y, g, oc);
  dev.conv2d_backward(x, w, y, dw, dbias, dx, g, oc);
  CHECK(dev.peak_bytes_in_use() > before);
  CHECK(dev.peak_bytes_in_use() - before <= conv2d_workspace_bytes(Backend::cpu, g, oc));
  // The GPU backends' portable lowering holds the whole batch's columns.
  CHECK(conv2d_workspace_bytes(Backend::cuda, g, oc) == static_cast<size_t>((ckk + oc) * g.n * ohw) * sizeof(float));
}
