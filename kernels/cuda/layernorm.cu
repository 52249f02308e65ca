// layernorm.cu: layer normalisation over the last dimension, forward and backward.
//
// Forward and the dx part of backward: one block per row, two-pass mean and
// variance (as the CPU backend) with block reductions. dgamma / dbeta: one
// thread column per feature summing over rows in a fixed order (no atomics).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

// x, y (rows, cols); one block per row.
// y may alias x.
__global__ void layernorm_forward_kernel(const float* x, const float* __restrict__ gamma,
                                         const float* __restrict__ beta, float* y,
                                         float* __restrict__ mean, float* __restrict__ rstd, int64_t cols,
                                         float eps) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* in = x + r * cols;
  float* out = y + r * cols;
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += in[j];
  const float mu = block_sum(s, shared) / static_cast<float>(cols);
  float sq = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float d = in[j] - mu;
    sq += d * d;
  }
  const float rs = 1.f / sqrtf(block_sum(sq, shared) / static_cast<float>(cols) + eps);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) out[j] = (in[j] - mu) * rs * gamma[j] + beta[j];
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma.
// dx may alias dy or x (each element is read before the same thread writes it).
__global__ void layernorm_backward_dx_kernel(const float* x, const float* __restrict__ gamma,
                                             const float* __restrict__ mean, const float* __restrict__ rstd,
                                             const float* dy, float* dx, int64_t cols) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* in = x + r * cols;
  const float* d = dy + r * cols;
  float* out = dx + r * cols;
  const float mu = mean[r], rs = rstd[r];
  float s1 = 0.f, s2 = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (in[j] - mu) * rs;
    const float dxhat = d[j] * gamma[j];
    s1 += dxhat;
    s2 += dxhat * xhat;
  }
  const float m1 = block_sum(s1, shared) / static_cast<float>(cols);
  const float m2 = block_sum(s2, shared) / static_cast<float>(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (in[j] - mu) * rs;
    out[j] = rs * (d[j] * gamma[j] - m1 - xhat * m2);
  }
}

// dgamma[j] += sum_r dy[r,j] * xhat[r,j]; dbeta[j] += sum_r dy[r,j]. Block (kColTile, kRowLanes).
__global__ void layernorm_backward_params_kernel(const float* __restrict__ x, const float* __restrict__ mean,
                                                 const float* __restrict__ rstd, const float* __restrict__ dy,
                                                 float* __restrict__ dgamma, float* __restrict__ dbeta,
                                                 int64_t rows, int64_t cols) {
  __shared__ float pg[kRowLanes][kColTile + 1];
  __shared__ float pb[kRowLanes][kColTile + 1];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  float ag = 0.f, ab = 0.f;
  if (j < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      const float d = dy[r * cols + j];
      ag += d * ((x[r * cols + j] - mean[r]) * rstd[r]);
      ab += d;
    }
  pg[threadIdx.y][threadIdx.x] = ag;
  pb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float sg = 0.f, sb = 0.f;
    for (int k = 0; k < kRowLanes; ++k) {
      sg += pg[k][threadIdx.x];
      sb += pb[k][threadIdx.x];
    }
    dgamma[j] += sg;
    dbeta[j] += sb;
  }
}

void check_rows_cols(const char* op, int64_t rows, int64_t cols) {
  require_non_negative(op, "rows", rows);
  require_non_negative(op, "cols", cols);
  if (cols == 0) throw std::invalid_argument(std::string("cuda ") + op + ": cols must be > 0");
  if (rows > 0x7fffffff) throw std::invalid_argument(std::string("cuda ") + op + ": too many rows");
}

}  // namespace

void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                       int64_t rows, int64_t cols, float eps, cudaStream_t s) {
  check_rows_cols("layernorm_forward", rows, cols);
  if (rows == 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(rows), row_block(cols), 0, s>>>(x, gamma, beta, y, mean, rstd,
                                                                                   cols, eps);
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                        float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols, cudaStream_t s) {
  check_rows_cols("layernorm_backward", rows, cols);
  if (rows == 0) return;
  // Parameter gradients first: dx may alias dy or x.
  const int64_t tiles = (cols + kColTile - 1) / kColTile;
  layernorm_backward_params_kernel<<<static_cast<unsigned>(tiles), dim3(kColTile, kRowLanes), 0, s>>>(
      x, mean, rstd, dy, dgamma, dbeta, rows, cols);
  CUDA_CHECK_LAUNCH();
  layernorm_backward_dx_kernel<<<static_cast<unsigned>(rows), row_block(cols), 0, s>>>(x, gamma, mean, rstd, dy,
                                                                                       dx, cols);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
