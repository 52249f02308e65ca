// transpose.cu: swap_axes01, dst (b, a, r) = src (a, b, r) — moves conv outputs
// between (c, n*oh*ow) GEMM layout and NCHW. One thread per destination element,
// so writes are coalesced; reads are coalesced along r.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

__global__ void swap_axes01_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t a, int64_t b,
                                   int64_t r, int64_t total) {
  for (int64_t idx = global_index(); idx < total; idx += global_stride()) {
    const int64_t ri = idx % r, t = idx / r;
    const int64_t ai = t % a, bi = t / a;
    dst[idx] = src[(ai * b + bi) * r + ri];
  }
}

}  // namespace

void swap_axes01(const float* src, float* dst, int64_t a, int64_t b, int64_t r, cudaStream_t s) {
  require_non_negative("swap_axes01", "a", a);
  require_non_negative("swap_axes01", "b", b);
  require_non_negative("swap_axes01", "r", r);
  const int64_t total = a * b * r;
  if (total == 0) return;
  swap_axes01_kernel<<<grid_for(total), kBlock, 0, s>>>(src, dst, a, b, r, total);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
