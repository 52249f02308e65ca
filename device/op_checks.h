// op_checks.h: the argument checks every backend runs before a Device op.
//
// One function per op of device/device.h, taking the device that runs the op and
// the op's own arguments. Each checks dimensions (non-negative, within the BLAS
// integer range where GEMM needs it), windows, that every tensor the op will touch
// is defined, lives on `dev` and is large enough (or exactly the size, for
// elementwise ops), and throws std::invalid_argument on the first problem with a
// message "<backend> <op>: <what is wrong>", e.g.
//   "opencl mul: b (3) has 3 elements, expected 8".
// The checks read no tensor data (nothing is synchronised); they are the same for
// CPU, OpenCL and CUDA, so a bad call fails alike everywhere. A backend's op body
// is then only its own work.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "device/device.h"
#include "device/tensor.h"

namespace cleave {

// The exception an op throws for a bad argument: "<backend> <op>: <what>".
std::invalid_argument op_error(const Device& dev, const char* op, const std::string& what);

// --- memory ------------------------------------------------------------------------
void check_upload(const Device& dev, const Tensor& dst, const float* src);  // src may be null when dst is empty
void check_download(const Device& dev, const Tensor& src, const float* dst);  // dst may be null when src is empty
void check_copy(const Device& dev, const Tensor& src, const Tensor& dst);  // same numel
void check_fill(const Device& dev, const Tensor& t);

// --- dense linear algebra ----------------------------------------------------------
// Checks only the tensors the op reads: none when m or n is 0, C alone when k is 0.
void check_gemm(const Device& dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a,
                int64_t lda, const Tensor& b, int64_t ldb, const Tensor& c, int64_t ldc);

// --- elementwise -------------------------------------------------------------------
void check_axpy(const Device& dev, const Tensor& x, const Tensor& y);
void check_scale(const Device& dev, const Tensor& x);
void check_mul(const Device& dev, const Tensor& a, const Tensor& b, const Tensor& out);
void check_activation_forward(const Device& dev, Activation act, const Tensor& x, const Tensor& y);
// relu needs x or (when x is undefined) y, gelu needs x, tanh needs y.
void check_activation_backward(const Device& dev, Activation act, const Tensor& x, const Tensor& y,
                               const Tensor& dy, const Tensor& dx);

// --- bias --------------------------------------------------------------------------
void check_add_bias_rows(const Device& dev, const Tensor& y, const Tensor& b, int64_t rows, int64_t features);
void check_bias_grad_rows(const Device& dev, const Tensor& dy, const Tensor& db, int64_t rows, int64_t features);
void check_add_bias_channels(const Device& dev, const Tensor& y, const Tensor& b, int64_t n, int64_t c,
                             int64_t hw);
void check_bias_grad_channels(const Device& dev, const Tensor& dy, const Tensor& db, int64_t n, int64_t c,
                              int64_t hw);

// --- convolution helpers -----------------------------------------------------------
void check_im2col(const Device& dev, const Tensor& x, const Tensor& cols, const Window2d& g);
void check_col2im(const Device& dev, const Tensor& cols, const Tensor& dx, const Window2d& g);
// b, db and dx may be undefined; oc must be > 0.
void check_conv2d_forward(const Device& dev, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                          const Window2d& g, int64_t oc);
void check_conv2d_backward(const Device& dev, const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw,
                           const Tensor& db, const Tensor& dx, const Window2d& g, int64_t oc);
// src and dst must not overlap, except as the very same elements when a or b is 1
// (the identity): then this returns false and the op has nothing to do.
[[nodiscard]] bool check_swap_axes01(const Device& dev, const Tensor& src, const Tensor& dst, int64_t a, int64_t b,
                                     int64_t r);

// --- pooling -----------------------------------------------------------------------
void check_maxpool_forward(const Device& dev, const Tensor& x, const Tensor& y, const Tensor& argmax,
                           const Window2d& g);
void check_maxpool_backward(const Device& dev, const Tensor& dy, const Tensor& argmax, const Tensor& dx,
                            const Window2d& g);
void check_avgpool_forward(const Device& dev, const Tensor& x, const Tensor& y, const Window2d& g);
void check_avgpool_backward(const Device& dev, const Tensor& dy, const Tensor& dx, const Window2d& g);

// --- layer norm --------------------------------------------------------------------
// embedding_forward (rows_t = y) and embedding_backward (rows_t = dy, table = dtable).
void check_embedding(const Device& dev, const char* op, const Tensor& ids, const Tensor& table, const Tensor& rows_t,
                     int64_t rows, int64_t vocab, int64_t width);
// causal_softmax_forward (scores, probs, undefined) and _backward (probs, dprobs, dscores).
void check_causal_softmax(const Device& dev, const char* op, const Tensor& a, const Tensor& b, const Tensor& c,
                          int64_t n, int64_t t);
void check_layernorm_forward(const Device& dev, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols);
void check_layernorm_backward(const Device& dev, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor& dgamma,
                              const Tensor& dbeta, int64_t rows, int64_t cols);

// --- losses (dlogits / dpred are checked only when defined) ----------------------------
void check_softmax_xent(const Device& dev, const Tensor& logits, const Tensor& labels, const Tensor& loss,
                        const Tensor& dlogits, int64_t rows, int64_t classes);
void check_mse(const Device& dev, const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred,
               int64_t rows, int64_t cols);
void check_argmax_match(const Device& dev, const Tensor& logits, const Tensor& labels, const Tensor& correct,
                        int64_t rows, int64_t classes);

// --- optimizers (momentum_buf is checked only when s.momentum != 0) --------------------
void check_sgd_step(const Device& dev, const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
                    const SgdStep& s);
void check_adam_step(const Device& dev, const Tensor& params, const Tensor& grads, const Tensor& m,
                     const Tensor& v, const AdamStep& s);
void check_sum_squares(const Device& dev, const Tensor& t);

}  // namespace cleave
