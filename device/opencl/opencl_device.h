// opencl_device.h: the OpenCL backend — CLBlast GEMM, every other op as a kernel
// from kernels/opencl/*.cl (embedded at build time, compiled once per process as
// one program and cached on disk as a device binary).
//
// Buffer::handle is a cl_mem; a Tensor is (cl_mem, element offset) and every
// kernel takes the offsets as arguments, so views need no sub-buffers. All work
// goes to one in-order command queue: ops return as soon as they are enqueued,
// download() and sum_squares() block, synchronize() is clFinish. Ops may be
// called from several threads (enqueueing is serialised by a mutex).
#pragma once

#include <memory>
#include <string>

#include "device/device.h"

namespace cleave {

// Where compiled OpenCL programs are cached: opts_dir when non-empty, else
// $XDG_CACHE_HOME/cleave/opencl (when absolute), else $HOME/.cache/cleave/opencl
// ("" when neither is set).
std::string opencl_cache_dir(const std::string& opts_dir);

class OpenclDevice final : public Device {
 public:
  // Opens OpenCL device number opts.ordinal among the candidates: GPU devices of
  // all platforms in platform order, followed (unless require_gpu) by every other
  // device. Throws std::runtime_error when there is no platform, no candidate, or
  // the ordinal is out of range; the message lists what was found.
  OpenclDevice(const DeviceOptions& opts, bool require_gpu);
  ~OpenclDevice() override;
  OpenclDevice(const OpenclDevice&) = delete;
  OpenclDevice& operator=(const OpenclDevice&) = delete;

  Backend backend() const override { return Backend::opencl; }
  std::string name() const override;  // "opencl (<device>, <platform>)"
  MemoryInfo memory() const override;
  bool host_accessible() const override { return false; }
  std::shared_ptr<Buffer> allocate(size_t bytes) override;
  void upload(const Tensor& dst, const float* src) override;
  void download(const Tensor& src, float* dst) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& t, float value) override;
  void synchronize() override;

  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Tensor& a,
            int64_t lda, const Tensor& b, int64_t ldb, float beta, const Tensor& c, int64_t ldc) override;

  void axpy(float alpha, const Tensor& x, const Tensor& y) override;
  void scale(const Tensor& x, float alpha) override;
  void mul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void activation_forward(Activation act, const Tensor& x, const Tensor& y) override;
  // relu may be given only y (x undefined); gelu and gelu_tanh need x, tanh needs y.
  void activation_backward(Activation act, const Tensor& x, const Tensor& y, const Tensor& dy,
                           const Tensor& dx) override;

  void add_bias_rows(const Tensor& y, const Tensor& b, int64_t rows, int64_t features) override;
  void bias_grad_rows(const Tensor& dy, const Tensor& db, int64_t rows, int64_t features) override;
  void add_bias_channels(const Tensor& y, const Tensor& b, int64_t n, int64_t c, int64_t hw) override;
  void bias_grad_channels(const Tensor& dy, const Tensor& db, int64_t n, int64_t c, int64_t hw) override;

  void im2col(const Tensor& x, const Tensor& cols, const Window2d& g) override;
  void col2im(const Tensor& cols, const Tensor& dx, const Window2d& g) override;
  void swap_axes01(const Tensor& src, const Tensor& dst, int64_t a, int64_t b, int64_t r) override;

  void maxpool_forward(const Tensor& x, const Tensor& y, const Tensor& argmax, const Window2d& g) override;
  void maxpool_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx, const Window2d& g) override;
  void avgpool_forward(const Tensor& x, const Tensor& y, const Window2d& g) override;
  void avgpool_backward(const Tensor& dy, const Tensor& dx, const Window2d& g) override;

  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                         const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols,
                         float eps) override;
  void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                          const Tensor& dy, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                          int64_t rows, int64_t cols) override;

  // dlogits / dpred may be undefined tensors (evaluation only: no gradient written).
  // A label that is not a class index yields a NaN loss for its row.
  void softmax_xent(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                    int64_t rows, int64_t classes, float grad_scale) override;
  void mse(const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred, int64_t rows,
           int64_t cols, float grad_scale) override;
  void argmax_match(const Tensor& logits, const Tensor& labels, const Tensor& correct, int64_t rows,
                    int64_t classes) override;

  // The GPT's ops. Token ids are read back and checked on the host first (a
  // blocking read of `rows` floats); embedding_backward is deterministic (no
  // atomics: one work-item per column walks the rows in order, like the CPU).
  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y, int64_t rows, int64_t vocab,
                         int64_t width) override;
  void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, int64_t rows, int64_t vocab,
                          int64_t width) override;
  void causal_softmax_forward(const Tensor& scores, const Tensor& probs, int64_t n, int64_t t, float scale) override;
  void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores, int64_t n, int64_t t,
                               float scale) override;

  // momentum_buf may be undefined when s.momentum == 0.
  void sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
                const SgdStep& s) override;
  void adam_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                 const AdamStep& s) override;
  float sum_squares(const Tensor& t) override;  // blocks

  // --- OpenCL specifics ---------------------------------------------------------
  // True when this device's kernel program was loaded from the on-disk cache
  // rather than compiled from source.
  bool program_from_cache() const;
  // Seconds spent creating and building the kernel program at construction.
  double program_build_seconds() const;
  // The cache file this device's program was read from or written to ("" when caching is off).
  std::string program_cache_file() const;
  // Bytes currently allocated through this device.
  size_t bytes_in_use() const override;
  bool is_gpu() const;

  struct State;  // OpenCL objects and kernels (opencl_device.cpp)

 private:
  std::unique_ptr<State> s_;
};

}  // namespace cleave
