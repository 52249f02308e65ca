// loss.cu: per-row losses — softmax cross-entropy, squared error — and the
// argmax accuracy check. One warp per row (rows are short: classes or outputs),
// 8 rows per block. Numerics follow the CPU backend: max-subtracted softmax with
// the normaliser summed in double.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
}
__device__ __forceinline__ int64_t warp_row_stride() {
  return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
}

// Class index of a float label, or -1 when it is not an integer in [0, classes).
__device__ __forceinline__ int64_t label_index(float label, int64_t classes) {
  if (!(label >= 0.f) || !(label < static_cast<float>(classes)) || label != floorf(label)) return -1;
  return static_cast<int64_t>(label);
}

// dlogits may alias logits: every read of a row happens before the warp writes it.
__global__ void softmax_xent_kernel(const float* logits, const float* __restrict__ labels,
                                    float* __restrict__ loss, float* dlogits, int64_t rows,
                                    int64_t classes, float grad_scale) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row(); r < rows; r += warp_row_stride()) {
    const float* z = logits + r * classes;
    float mx = -INFINITY;
    for (int64_t j = lane; j < classes; j += 32) mx = fmaxf(mx, z[j]);
    mx = warp_max(mx);
    double sum = 0.0;
    for (int64_t j = lane; j < classes; j += 32) sum += static_cast<double>(expf(z[j] - mx));
    sum = warp_sum(sum);
    const int64_t label = label_index(labels[r], classes);
    if (lane == 0) {
      const double lse = static_cast<double>(mx) + log(sum);
      loss[r] = label < 0 ? NAN : static_cast<float>(lse - static_cast<double>(z[label]));
    }
    __syncwarp();
    if (dlogits != nullptr) {
      float* d = dlogits + r * classes;
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = lane; j < classes; j += 32) {
        float g = expf(z[j] - mx) * inv * grad_scale;
        if (j == label) g -= grad_scale;
        d[j] = g;
      }
    }
  }
}

__global__ void mse_kernel(const float* __restrict__ pred, const float* __restrict__ target,
                           float* __restrict__ loss, float* __restrict__ dpred, int64_t rows, int64_t cols,
                           float grad_scale) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row(); r < rows; r += warp_row_stride()) {
    const float* p = pred + r * cols;
    const float* t = target + r * cols;
    float acc = 0.f;
    for (int64_t j = lane; j < cols; j += 32) {
      const float diff = p[j] - t[j];
      acc += diff * diff;
    }
    if (dpred != nullptr)
      for (int64_t j = lane; j < cols; j += 32) dpred[r * cols + j] = 2.f * (p[j] - t[j]) * grad_scale;
    acc = warp_sum(acc);
    if (lane == 0) loss[r] = acc;
  }
}

// First maximum of each row (lowest index wins ties), compared with the label.
__global__ void argmax_match_kernel(const float* __restrict__ logits, const float* __restrict__ labels,
                                    float* __restrict__ correct, int64_t rows, int64_t classes) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_row(); r < rows; r += warp_row_stride()) {
    const float* z = logits + r * classes;
    float best = -INFINITY;
    int64_t best_i = -1;
    for (int64_t j = lane; j < classes; j += 32)
      if (best_i < 0 || z[j] > best) {
        best = z[j];
        best_i = j;
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFullMask, best, o);
      const int64_t oi = __shfl_xor_sync(kFullMask, best_i, o);
      if (oi >= 0 && (best_i < 0 || ov > best || (ov == best && oi < best_i))) {
        best = ov;
        best_i = oi;
      }
    }
    if (lane == 0) correct[r] = static_cast<float>(best_i) == labels[r] ? 1.f : 0.f;
  }
}

unsigned row_grid(int64_t rows) {
  int64_t g = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(g > kMaxGrid ? kMaxGrid : g);
}

void check_rows(const char* op, int64_t rows, int64_t cols, const char* cols_name, bool cols_positive) {
  require_non_negative(op, "rows", rows);
  require_non_negative(op, cols_name, cols);
  if (cols_positive && cols == 0)
    throw std::invalid_argument(std::string("cuda ") + op + ": " + cols_name + " must be > 0");
}

}  // namespace

void softmax_xent(const float* logits, const float* labels, float* loss, float* dlogits, int64_t rows,
                  int64_t classes, float grad_scale, cudaStream_t s) {
  check_rows("softmax_xent", rows, classes, "classes", true);
  if (rows == 0) return;
  softmax_xent_kernel<<<row_grid(rows), kWarpsPerBlock * 32, 0, s>>>(logits, labels, loss, dlogits, rows, classes,
                                                                     grad_scale);
  CUDA_CHECK_LAUNCH();
}

void mse(const float* pred, const float* target, float* loss, float* dpred, int64_t rows, int64_t cols,
         float grad_scale, cudaStream_t s) {
  check_rows("mse", rows, cols, "cols", false);
  if (rows == 0) return;
  mse_kernel<<<row_grid(rows), kWarpsPerBlock * 32, 0, s>>>(pred, target, loss, dpred, rows, cols, grad_scale);
  CUDA_CHECK_LAUNCH();
}

void argmax_match(const float* logits, const float* labels, float* correct, int64_t rows, int64_t classes,
                  cudaStream_t s) {
  check_rows("argmax_match", rows, classes, "classes", true);
  if (rows == 0) return;
  argmax_match_kernel<<<row_grid(rows), kWarpsPerBlock * 32, 0, s>>>(logits, labels, correct, rows, classes);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
