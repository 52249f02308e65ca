// profiling_device.cpp: ProfilingDevice, op-by-op forwarding with wall-time totals.
#include "bench/core/profiling_device.h"

#include <stdexcept>

namespace cleave::bench {

ProfilingDevice::ProfilingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {
  if (!inner_) throw std::invalid_argument("ProfilingDevice: no device to wrap");
  if (!inner_->host_accessible())
    throw std::invalid_argument("ProfilingDevice: device '" + inner_->name() + "' is not host-accessible");
}

Tensor ProfilingDevice::in(const Tensor& t) const {
  if (!t.defined()) return Tensor();
  return Tensor::wrap_host(*inner_, t.host_data(), t.shape());
}

std::shared_ptr<Buffer> ProfilingDevice::allocate(size_t bytes) {
  std::shared_ptr<Buffer> b = timed("allocate", [&] { return inner_->allocate(bytes); });
  b->device = this;  // layers reach the device through their tensors
  return b;
}

void ProfilingDevice::upload(const Tensor& dst, const float* src) {
  timed("upload", [&] { inner_->upload(in(dst), src); });
}
void ProfilingDevice::download(const Tensor& src, float* dst) {
  timed("download", [&] { inner_->download(in(src), dst); });
}
void ProfilingDevice::copy(const Tensor& src, const Tensor& dst) {
  timed("copy", [&] { inner_->copy(in(src), in(dst)); });
}
void ProfilingDevice::fill(const Tensor& t, float value) {
  timed("fill", [&] { inner_->fill(in(t), value); });
}

void ProfilingDevice::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const Tensor& a, int64_t lda, const Tensor& b, int64_t ldb, float beta, const Tensor& c,
                           int64_t ldc) {
  const std::string key = std::string("gemm ") + (trans_a ? "T" : "N") + (trans_b ? "T" : "N") + " " +
                          std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  timed(key, [&] { inner_->gemm(trans_a, trans_b, m, n, k, alpha, in(a), lda, in(b), ldb, beta, in(c), ldc); });
}

void ProfilingDevice::axpy(float alpha, const Tensor& x, const Tensor& y) {
  timed("axpy", [&] { inner_->axpy(alpha, in(x), in(y)); });
}
void ProfilingDevice::scale(const Tensor& x, float alpha) {
  timed("scale", [&] { inner_->scale(in(x), alpha); });
}
void ProfilingDevice::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  timed("mul", [&] { inner_->mul(in(a), in(b), in(out)); });
}
void ProfilingDevice::activation_forward(Activation act, const Tensor& x, const Tensor& y) {
  timed("activation_forward", [&] { inner_->activation_forward(act, in(x), in(y)); });
}
void ProfilingDevice::activation_backward(Activation act, const Tensor& x, const Tensor& y, const Tensor& dy,
                                          const Tensor& dx) {
  timed("activation_backward", [&] { inner_->activation_backward(act, in(x), in(y), in(dy), in(dx)); });
}

void ProfilingDevice::add_bias_rows(const Tensor& y, const Tensor& b, int64_t rows, int64_t features) {
  timed("add_bias_rows", [&] { inner_->add_bias_rows(in(y), in(b), rows, features); });
}
void ProfilingDevice::bias_grad_rows(const Tensor& dy, const Tensor& db, int64_t rows, int64_t features) {
  timed("bias_grad_rows", [&] { inner_->bias_grad_rows(in(dy), in(db), rows, features); });
}
void ProfilingDevice::add_bias_channels(const Tensor& y, const Tensor& b, int64_t n, int64_t c, int64_t hw) {
  timed("add_bias_channels", [&] { inner_->add_bias_channels(in(y), in(b), n, c, hw); });
}
void ProfilingDevice::bias_grad_channels(const Tensor& dy, const Tensor& db, int64_t n, int64_t c, int64_t hw) {
  timed("bias_grad_channels", [&] { inner_->bias_grad_channels(in(dy), in(db), n, c, hw); });
}

void ProfilingDevice::im2col(const Tensor& x, const Tensor& cols, const Window2d& g) {
  timed("im2col", [&] { inner_->im2col(in(x), in(cols), g); });
}
void ProfilingDevice::col2im(const Tensor& cols, const Tensor& dx, const Window2d& g) {
  timed("col2im", [&] { inner_->col2im(in(cols), in(dx), g); });
}
void ProfilingDevice::swap_axes01(const Tensor& src, const Tensor& dst, int64_t a, int64_t b, int64_t r) {
  timed("swap_axes01", [&] { inner_->swap_axes01(in(src), in(dst), a, b, r); });
}

// "conv2d_forward 32->64 14x14 k3x3": convolutions keyed by their shape, like GEMMs.
namespace {
std::string conv_key(const char* op, const Window2d& g, int64_t oc) {
  return std::string(op) + " " + std::to_string(g.c) + "->" + std::to_string(oc) + " " + std::to_string(g.h) + "x" +
         std::to_string(g.w) + " k" + std::to_string(g.kh) + "x" + std::to_string(g.kw);
}
}  // namespace

void ProfilingDevice::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                                     const Window2d& g, int64_t oc) {
  timed(conv_key("conv2d_forward", g, oc), [&] { inner_->conv2d_forward(in(x), in(w), in(b), in(y), g, oc); });
}
void ProfilingDevice::conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw,
                                      const Tensor& db, const Tensor& dx, const Window2d& g, int64_t oc) {
  timed(conv_key("conv2d_backward", g, oc),
        [&] { inner_->conv2d_backward(in(x), in(w), in(dy), in(dw), in(db), in(dx), g, oc); });
}

void ProfilingDevice::maxpool_forward(const Tensor& x, const Tensor& y, const Tensor& argmax, const Window2d& g) {
  timed("maxpool_forward", [&] { inner_->maxpool_forward(in(x), in(y), in(argmax), g); });
}
void ProfilingDevice::maxpool_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx,
                                       const Window2d& g) {
  timed("maxpool_backward", [&] { inner_->maxpool_backward(in(dy), in(argmax), in(dx), g); });
}
void ProfilingDevice::avgpool_forward(const Tensor& x, const Tensor& y, const Window2d& g) {
  timed("avgpool_forward", [&] { inner_->avgpool_forward(in(x), in(y), g); });
}
void ProfilingDevice::avgpool_backward(const Tensor& dy, const Tensor& dx, const Window2d& g) {
  timed("avgpool_backward", [&] { inner_->avgpool_backward(in(dy), in(dx), g); });
}

void ProfilingDevice::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                        const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols,
                                        float eps) {
  timed("layernorm_forward", [&] {
    inner_->layernorm_forward(in(x), in(gamma), in(beta), in(y), in(mean), in(rstd), rows, cols, eps);
  });
}
void ProfilingDevice::layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                         const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                                         const Tensor& dgamma, const Tensor& dbeta, int64_t rows, int64_t cols) {
  timed("layernorm_backward", [&] {
    inner_->layernorm_backward(in(x), in(gamma), in(mean), in(rstd), in(dy), in(dx), in(dgamma), in(dbeta), rows,
                               cols);
  });
}

void ProfilingDevice::softmax_xent(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                                   const Tensor& dlogits, int64_t rows, int64_t classes, float grad_scale) {
  timed("softmax_xent", [&] {
    inner_->softmax_xent(in(logits), in(labels), in(loss), in(dlogits), rows, classes, grad_scale);
  });
}
void ProfilingDevice::mse(const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred,
                          int64_t rows, int64_t cols, float grad_scale) {
  timed("mse", [&] { inner_->mse(in(pred), in(target), in(loss), in(dpred), rows, cols, grad_scale); });
}
void ProfilingDevice::argmax_match(const Tensor& logits, const Tensor& labels, const Tensor& correct, int64_t rows,
                                   int64_t classes) {
  timed("argmax_match", [&] { inner_->argmax_match(in(logits), in(labels), in(correct), rows, classes); });
}

void ProfilingDevice::sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
                               const SgdStep& s) {
  timed("sgd_step", [&] { inner_->sgd_step(in(params), in(grads), in(momentum_buf), s); });
}
void ProfilingDevice::adam_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                                const AdamStep& s) {
  timed("adam_step", [&] { inner_->adam_step(in(params), in(grads), in(m), in(v), s); });
}
float ProfilingDevice::sum_squares(const Tensor& t) {
  return timed("sum_squares", [&] { return inner_->sum_squares(in(t)); });
}

}  // namespace cleave::bench
