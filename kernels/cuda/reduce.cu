// reduce.cu: sum of squares of a tensor (gradient norms, clipping), in two passes
// with a fixed number of blocks so the result does not depend on scheduling:
// pass 1 writes one double partial per block, pass 2 adds them in one block.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

__global__ void sum_squares_partial_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ partials) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const double v = x[i];
    acc += v * v;
  }
  const double total = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block of kSumSquaresPartials threads.
__global__ void sum_squares_final_kernel(const double* __restrict__ partials, int count, double* __restrict__ result) {
  __shared__ double shared[32];
  const double v = static_cast<int>(threadIdx.x) < count ? partials[threadIdx.x] : 0.0;
  const double total = block_sum(v, shared);
  if (threadIdx.x == 0) *result = total;
}

}  // namespace

void sum_squares(const float* x, int64_t n, double* partials, double* result, cudaStream_t s) {
  require_non_negative("sum_squares", "n", n);
  static_assert(kSumSquaresPartials % 32 == 0 && kSumSquaresPartials <= 1024, "one block sums the partials");
  const unsigned blocks = grid_for(n) < static_cast<unsigned>(kSumSquaresPartials)
                              ? grid_for(n)
                              : static_cast<unsigned>(kSumSquaresPartials);
  sum_squares_partial_kernel<<<blocks, kBlock, 0, s>>>(x, n, partials);
  CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kSumSquaresPartials, 0, s>>>(partials, static_cast<int>(blocks), result);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
