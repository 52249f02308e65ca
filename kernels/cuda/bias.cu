// bias.cu: bias add and bias gradient for dense rows (rows, features) and for
// NCHW planes (n, c, hw). The gradients accumulate into db and are deterministic
// (fixed summation order, no atomics).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

constexpr int kColTile = 32;  // features per block in bias_grad_rows
constexpr int kRowLanes = 8;  // rows walked in parallel per feature

__global__ void add_bias_rows_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t total,
                                     int64_t features) {
  for (int64_t i = global_index(); i < total; i += global_stride()) y[i] += b[i % features];
}

// Block (kColTile, kRowLanes): thread (tx, ty) sums rows ty, ty + kRowLanes, ... of
// feature blockIdx.x * kColTile + tx; the kRowLanes partials are then added in order.
__global__ void bias_grad_rows_kernel(const float* __restrict__ dy, float* __restrict__ db, int64_t rows,
                                      int64_t features) {
  __shared__ float part[kRowLanes][kColTile + 1];
  const int64_t f = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  float acc = 0.f;
  if (f < features)
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) acc += dy[r * features + f];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && f < features) {
    float sum = 0.f;
    for (int k = 0; k < kRowLanes; ++k) sum += part[k][threadIdx.x];
    db[f] += sum;
  }
}

__global__ void add_bias_channels_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t total,
                                         int64_t c, int64_t hw) {
  for (int64_t i = global_index(); i < total; i += global_stride()) y[i] += b[(i / hw) % c];
}

// One block per channel: sums dy over all n planes of that channel.
__global__ void bias_grad_channels_kernel(const float* __restrict__ dy, float* __restrict__ db, int64_t n,
                                          int64_t c, int64_t hw) {
  __shared__ float shared[32];
  const int64_t ch = blockIdx.x;
  const int64_t count = n * hw;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t ni = j / hw, p = j - ni * hw;
    acc += dy[(ni * c + ch) * hw + p];
  }
  const float sum = block_sum(acc, shared);
  if (threadIdx.x == 0) db[ch] += sum;
}

}  // namespace

void add_bias_rows(float* y, const float* b, int64_t rows, int64_t features, cudaStream_t s) {
  require_non_negative("add_bias_rows", "rows", rows);
  require_non_negative("add_bias_rows", "features", features);
  const int64_t total = rows * features;
  if (total == 0) return;
  add_bias_rows_kernel<<<grid_for(total), kBlock, 0, s>>>(y, b, total, features);
  CUDA_CHECK_LAUNCH();
}

void bias_grad_rows(const float* dy, float* db, int64_t rows, int64_t features, cudaStream_t s) {
  require_non_negative("bias_grad_rows", "rows", rows);
  require_non_negative("bias_grad_rows", "features", features);
  if (rows == 0 || features == 0) return;
  const int64_t blocks = (features + kColTile - 1) / kColTile;
  if (blocks > 0x7fffffff) throw std::invalid_argument("cuda bias_grad_rows: too many features");
  bias_grad_rows_kernel<<<static_cast<unsigned>(blocks), dim3(kColTile, kRowLanes), 0, s>>>(dy, db, rows,
                                                                                            features);
  CUDA_CHECK_LAUNCH();
}

void add_bias_channels(float* y, const float* b, int64_t n, int64_t c, int64_t hw, cudaStream_t s) {
  require_non_negative("add_bias_channels", "n", n);
  require_non_negative("add_bias_channels", "c", c);
  require_non_negative("add_bias_channels", "hw", hw);
  const int64_t total = n * c * hw;
  if (total == 0) return;
  add_bias_channels_kernel<<<grid_for(total), kBlock, 0, s>>>(y, b, total, c, hw);
  CUDA_CHECK_LAUNCH();
}

void bias_grad_channels(const float* dy, float* db, int64_t n, int64_t c, int64_t hw, cudaStream_t s) {
  require_non_negative("bias_grad_channels", "n", n);
  require_non_negative("bias_grad_channels", "c", c);
  require_non_negative("bias_grad_channels", "hw", hw);
  if (c == 0 || n * hw == 0) return;
  if (c > 0x7fffffff) throw std::invalid_argument("cuda bias_grad_channels: too many channels");
  bias_grad_channels_kernel<<<static_cast<unsigned>(c), row_block(n * hw), 0, s>>>(dy, db, n, c, hw);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
