// probe.cpp: see probe.h.
#include "core/runtime/daemon/probe.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace cleave {

namespace {

// The median of the probe's timed repetitions; its tensors are freed on return.
double timed_gemms(Device& device) {
  const int64_t n = 256;
  Tensor a(device, {n, n}), b(device, {n, n}), c(device, {n, n});
  device.fill(a, 0.5f);
  device.fill(b, 0.25f);
  device.gemm(false, false, n, n, n, 1.f, a, n, b, n, 0.f, c, n);  // warm-up
  device.synchronize();
  std::vector<double> rates;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const int inner = 4;
    for (int i = 0; i < inner; ++i) device.gemm(false, false, n, n, n, 1.f, a, n, b, n, 0.f, c, n);
    device.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * n * n * n * inner / std::max(s, 1e-9) * 1e-9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

double measure_gflops(Device& device) {
  const double gflops = timed_gemms(device);
  // The daemon then idles until a job comes: the blocks the backend kept for
  // reuse (the CPU's pool) go back to the system now.
  device.release_cached_memory();
  return gflops;
}

}  // namespace cleave
