// ops.h: the CUDA kernel launchers, one group per kernels/cuda/*.cu file.
//
// Each launcher takes raw device pointers (already offset to element 0 of the
// tensor), sizes, and the stream to run on. It validates its scalar arguments
// (std::invalid_argument), computes the grid, launches asynchronously and checks
// the launch (cleave::CudaError). Tensor-level checks (device, shape, extent)
// happen one layer up, in CudaDevice. Semantics are those of the matching
// Device op in device/device.h; "accumulates" vs "overwrites" is noted per op.
// Plain C++: included from cuda_device.cpp, which the host compiler builds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/device.h"

namespace cleave::cuda {

// --- elementwise.cu (n elements) ---------------------------------------------
void fill(float* x, int64_t n, float value, cudaStream_t s);
void axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s);  // y += alpha x
void scale(float* x, float alpha, int64_t n, cudaStream_t s);                // x *= alpha
void mul(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);
// c (m rows of n, row stride ldc) *= beta; beta == 0 writes zeros (NaN-free, like BLAS).
void scale_matrix(float* c, int64_t m, int64_t n, int64_t ldc, float beta, cudaStream_t s);

// --- activation.cu (n elements; y may alias x, dx may alias dy) ----------------
void activation_forward(Activation act, const float* x, float* y, int64_t n, cudaStream_t s);
// dx = dy * f'(x); tanh uses y = tanh(x), the others x. Overwrites dx.
void activation_backward(Activation act, const float* x, const float* y, const float* dy, float* dx,
                         int64_t n, cudaStream_t s);

// --- bias.cu ------------------------------------------------------------------
void add_bias_rows(float* y, const float* b, int64_t rows, int64_t features, cudaStream_t s);
void bias_grad_rows(const float* dy, float* db, int64_t rows, int64_t features, cudaStream_t s);  // accumulates
void add_bias_channels(float* y, const float* b, int64_t n, int64_t c, int64_t hw, cudaStream_t s);
void bias_grad_channels(const float* dy, float* db, int64_t n, int64_t c, int64_t hw,
                        cudaStream_t s);  // accumulates

// --- im2col.cu ----------------------------------------------------------------
// Throws std::invalid_argument naming `op` unless g is a valid window (input at
// least 1x1, kernel and stride >= 1, padding >= 0, kernel fits the padded input).
void check_window(const char* op, const Window2d& g);
// cols (c*kh*kw, n*oh*ow) from x (n, c, h, w).
void im2col(const float* x, float* cols, const Window2d& g, cudaStream_t s);
// dx (n, c, h, w) = sum of the cols entries that im2col would read from each pixel. Overwrites.
void col2im(const float* cols, float* dx, const Window2d& g, cudaStream_t s);

// --- transpose.cu -------------------------------------------------------------
// dst (b, a, r) = src (a, b, r). src and dst must not overlap.
void swap_axes01(const float* src, float* dst, int64_t a, int64_t b, int64_t r, cudaStream_t s);

// --- pool.cu (NCHW; y, argmax (n, c, oh, ow)) ------------------------------------
void maxpool_forward(const float* x, float* y, float* argmax, const Window2d& g, cudaStream_t s);
void maxpool_backward(const float* dy, const float* argmax, float* dx, const Window2d& g,
                      cudaStream_t s);  // overwrites dx
void avgpool_forward(const float* x, float* y, const Window2d& g, cudaStream_t s);
void avgpool_backward(const float* dy, float* dx, const Window2d& g, cudaStream_t s);  // overwrites dx

// --- layernorm.cu (x, y, dy, dx (rows, cols); gamma, beta (cols); mean, rstd (rows)) ---
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps, cudaStream_t s);
// dx overwritten; dgamma, dbeta accumulate.
void layernorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                        const float* dy, float* dx, float* dgamma, float* dbeta, int64_t rows,
                        int64_t cols, cudaStream_t s);

// --- loss.cu (per-row values; logits (rows, classes), labels/loss/correct (rows)) ----
// dlogits may be null (evaluation: no gradient). A label outside [0, classes) gives a
// NaN loss for its row (the host checks labels before upload).
void softmax_xent(const float* logits, const float* labels, float* loss, float* dlogits, int64_t rows,
                  int64_t classes, float grad_scale, cudaStream_t s);
// pred, target, dpred (rows, cols); dpred may be null.
void mse(const float* pred, const float* target, float* loss, float* dpred, int64_t rows, int64_t cols,
         float grad_scale, cudaStream_t s);
void argmax_match(const float* logits, const float* labels, float* correct, int64_t rows, int64_t classes,
                  cudaStream_t s);

// --- transformer.cu -------------------------------------------------------------
// ids (rows) hold token indices as floats, checked on the host first (an id that
// is not one gives a NaN row forward and is skipped backward).
// y (rows, width) row r = table (vocab, width) row ids[r].
void embedding_forward(const float* ids, const float* table, float* y, int64_t rows, int64_t vocab, int64_t width,
                       cudaStream_t s);
// dtable row ids[r] += dy (rows, width) row r; accumulates, deterministic (no atomics).
void embedding_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t vocab,
                        int64_t width, cudaStream_t s);
// n (t, t) matrices: probs = row softmax of scale * scores over keys j <= i, 0 above the diagonal.
void causal_softmax_forward(const float* scores, float* probs, int64_t n, int64_t t, float scale, cudaStream_t s);
// dscores = scale * probs * (dprobs - rowsum(probs dprobs)), 0 above the diagonal. Overwrites.
void causal_softmax_backward(const float* probs, const float* dprobs, float* dscores, int64_t n, int64_t t,
                             float scale, cudaStream_t s);

// --- optimizer.cu (n parameters, in place) ---------------------------------------
// momentum_buf may be null when s.momentum == 0.
void sgd_step(float* params, const float* grads, float* momentum_buf, int64_t n, const SgdStep& step,
              cudaStream_t s);
void adam_step(float* params, const float* grads, float* m, float* v, int64_t n, const AdamStep& step,
               cudaStream_t s);

// --- reduce.cu --------------------------------------------------------------------
// Blocks of partial sums sum_squares uses; `partials` must hold this many doubles.
constexpr int kSumSquaresPartials = 512;
// *result (device double) = sum of x[i]^2, accumulated in double, deterministic
// (fixed reduction order). `partials` is device scratch of kSumSquaresPartials doubles.
void sum_squares(const float* x, int64_t n, double* partials, double* result, cudaStream_t s);

}  // namespace cleave::cuda
