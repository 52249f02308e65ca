// transformer.cu: the ops a GPT adds — token embedding lookup and its
// gradient, causal (lower-triangular) softmax over attention scores and its
// gradient. Numerics follow the CPU backend formula by formula and sum in its
// order: the embedding gradient walks the token rows in order per column (no
// atomics: deterministic, and the same sums as the CPU), the softmax works
// one row per thread (rows are as long as the context).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

// Index of a float token id, or -1 when it is not an integer in [0, vocab)
// (the host refuses those first; this keeps a kernel inside its buffers).
__device__ __forceinline__ int64_t token_index(float id, int64_t vocab) {
  if (!(id >= 0.f) || !(id < static_cast<float>(vocab)) || id != floorf(id)) return -1;
  return static_cast<int64_t>(id);
}

__global__ void embedding_forward_kernel(const float* __restrict__ ids, const float* __restrict__ table,
                                         float* __restrict__ y, int64_t rows, int64_t vocab, int64_t width) {
  for (int64_t i = global_index(); i < rows * width; i += global_stride()) {
    const int64_t id = token_index(ids[i / width], vocab);
    y[i] = id < 0 ? NAN : table[id * width + i % width];
  }
}

// One thread per column j: dtable[ids[r]][j] += dy[r][j] for r in order.
__global__ void embedding_backward_kernel(const float* __restrict__ ids, const float* __restrict__ dy,
                                          float* __restrict__ dtable, int64_t rows, int64_t vocab, int64_t width) {
  for (int64_t j = global_index(); j < width; j += global_stride()) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = token_index(ids[r], vocab);
      if (id >= 0) dtable[id * width + j] += dy[r * width + j];
    }
  }
}

// Row r of n (t, t) matrices: query i = r % t sees keys 0..i.
__global__ void causal_softmax_forward_kernel(const float* __restrict__ scores, float* __restrict__ probs,
                                              int64_t n, int64_t t, float scale) {
  for (int64_t r = global_index(); r < n * t; r += global_stride()) {
    const int64_t i = r % t;
    const float* z = scores + r * t;
    float* p = probs + r * t;
    float mx = scale * z[0];
    for (int64_t j = 1; j <= i; ++j) mx = fmaxf(mx, scale * z[j]);
    float sum = 0.f;
    for (int64_t j = 0; j <= i; ++j) {
      const float e = expf(scale * z[j] - mx);
      p[j] = e;
      sum += e;
    }
    const float inv = 1.f / sum;
    for (int64_t j = 0; j <= i; ++j) p[j] *= inv;
    for (int64_t j = i + 1; j < t; ++j) p[j] = 0.f;
  }
}

__global__ void causal_softmax_backward_kernel(const float* __restrict__ probs, const float* __restrict__ dprobs,
                                               float* __restrict__ dscores, int64_t n, int64_t t, float scale) {
  for (int64_t r = global_index(); r < n * t; r += global_stride()) {
    const int64_t i = r % t;
    const float* p = probs + r * t;
    const float* dp = dprobs + r * t;
    float* ds = dscores + r * t;
    float dot = 0.f;
    for (int64_t j = 0; j <= i; ++j) dot += p[j] * dp[j];
    for (int64_t j = 0; j <= i; ++j) ds[j] = scale * p[j] * (dp[j] - dot);
    for (int64_t j = i + 1; j < t; ++j) ds[j] = 0.f;
  }
}

}  // namespace

void embedding_forward(const float* ids, const float* table, float* y, int64_t rows, int64_t vocab, int64_t width,
                       cudaStream_t s) {
  require_non_negative("embedding_forward", "rows", rows);
  require_non_negative("embedding_forward", "width", width);
  if (rows * width == 0) return;
  embedding_forward_kernel<<<grid_for(rows * width), kBlock, 0, s>>>(ids, table, y, rows, vocab, width);
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t vocab,
                        int64_t width, cudaStream_t s) {
  require_non_negative("embedding_backward", "rows", rows);
  require_non_negative("embedding_backward", "width", width);
  if (rows * width == 0) return;
  embedding_backward_kernel<<<grid_for(width), kBlock, 0, s>>>(ids, dy, dtable, rows, vocab, width);
  CUDA_CHECK_LAUNCH();
}

void causal_softmax_forward(const float* scores, float* probs, int64_t n, int64_t t, float scale, cudaStream_t s) {
  require_non_negative("causal_softmax_forward", "n", n);
  require_non_negative("causal_softmax_forward", "t", t);
  if (n * t == 0) return;
  causal_softmax_forward_kernel<<<grid_for(n * t), kBlock, 0, s>>>(scores, probs, n, t, scale);
  CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(const float* probs, const float* dprobs, float* dscores, int64_t n, int64_t t,
                             float scale, cudaStream_t s) {
  require_non_negative("causal_softmax_backward", "n", n);
  require_non_negative("causal_softmax_backward", "t", t);
  if (n * t == 0) return;
  causal_softmax_backward_kernel<<<grid_for(n * t), kBlock, 0, s>>>(probs, dprobs, dscores, n, t, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
