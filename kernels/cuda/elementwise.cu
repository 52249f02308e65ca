// elementwise.cu: fill, axpy, scale and mul over n contiguous floats.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

__global__ void fill_kernel(float* __restrict__ x, int64_t n, float value) {
  for (int64_t i = global_index(); i < n; i += global_stride()) x[i] = value;
}

// y may alias x only when alpha is applied in place (y += alpha * y): still per-element safe.
__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) y[i] += alpha * x[i];
}

__global__ void scale_kernel(float* __restrict__ x, float alpha, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) x[i] *= alpha;
}

// out may alias a or b.
__global__ void mul_kernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) out[i] = a[i] * b[i];
}

// One thread per element of the m x n matrix; ldc >= n.
__global__ void scale_matrix_kernel(float* __restrict__ c, int64_t m, int64_t n, int64_t ldc, float beta) {
  const int64_t total = m * n;
  for (int64_t i = global_index(); i < total; i += global_stride()) {
    const int64_t r = i / n, col = i - r * n;
    float* p = c + r * ldc + col;
    *p = beta == 0.f ? 0.f : beta * *p;
  }
}

}  // namespace

void fill(float* x, int64_t n, float value, cudaStream_t s) {
  require_non_negative("fill", "n", n);
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kBlock, 0, s>>>(x, n, value);
  CUDA_CHECK_LAUNCH();
}

void axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s) {
  require_non_negative("axpy", "n", n);
  if (n == 0) return;
  axpy_kernel<<<grid_for(n), kBlock, 0, s>>>(alpha, x, y, n);
  CUDA_CHECK_LAUNCH();
}

void scale(float* x, float alpha, int64_t n, cudaStream_t s) {
  require_non_negative("scale", "n", n);
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kBlock, 0, s>>>(x, alpha, n);
  CUDA_CHECK_LAUNCH();
}

void mul(const float* a, const float* b, float* out, int64_t n, cudaStream_t s) {
  require_non_negative("mul", "n", n);
  if (n == 0) return;
  mul_kernel<<<grid_for(n), kBlock, 0, s>>>(a, b, out, n);
  CUDA_CHECK_LAUNCH();
}

void scale_matrix(float* c, int64_t m, int64_t n, int64_t ldc, float beta, cudaStream_t s) {
  require_non_negative("scale_matrix", "m", m);
  require_non_negative("scale_matrix", "n", n);
  if (ldc < n) throw std::invalid_argument("cuda scale_matrix: ldc < n");
  if (m * n == 0) return;
  scale_matrix_kernel<<<grid_for(m * n), kBlock, 0, s>>>(c, m, n, ldc, beta);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
