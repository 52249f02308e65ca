// cpu_loops.h: the loop helpers the CPU backend's source files share
// (cpu_device.cpp, cpu_conv.cpp): OpenMP chunking, raw pointers of tensors, and
// the valid output range of a padded window.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "device/tensor.h"

namespace cleave::cpu_detail {

// Below this many elementary operations a loop runs on the calling thread.
inline constexpr int64_t kMinParallelWork = 1 << 16;

// Most threads worth using for n items of `cost` elementary operations each, on
// a machine with cores enough: 1 below kMinParallelWork, else one per half of
// it, at most n. CpuDevice::team_size caps it with the device's thread count;
// alone it bounds the per-thread scratch of an op whatever that count is.
inline int64_t team_bound(int64_t n, int64_t cost) {
  if (n <= 1) return 1;
  const int64_t work = n * std::max<int64_t>(cost, 1);
  if (work < kMinParallelWork) return 1;
  return std::min(n, work / (kMinParallelWork / 2));
}

// Runs f(chunk, begin, end) over [0, n) split into `team` contiguous chunks.
template <class F>
void run_chunks(int team, int64_t n, F&& f) {
  if (team <= 1) {
    f(0, int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(team)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t nt = omp_get_num_threads();
    f(static_cast<int>(t), n * t / nt, n * (t + 1) / nt);
  }
}

inline float* ptr(const Tensor& t) { return t.defined() ? static_cast<float*>(t.handle()) + t.offset() : nullptr; }

// Output positions xo in [lo, hi) whose input column xo*s - p + j lies in [0, w).
inline void valid_range(int64_t w, int64_t out, int64_t s, int64_t p, int64_t j, int64_t& lo, int64_t& hi) {
  const int64_t first = p - j;  // xo*s >= first
  lo = first > 0 ? (first + s - 1) / s : 0;
  const int64_t last = w - 1 + p - j;  // xo*s <= last
  hi = last >= 0 ? std::min(out, last / s + 1) : 0;
  lo = std::min(lo, out);
  if (hi < lo) hi = lo;
}

}  // namespace cleave::cpu_detail
