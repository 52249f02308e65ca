// cuda_device.h: the CUDA backend — device memory, cuBLAS GEMM, kernels from
// kernels/cuda/.
//
// CudaDevice owns one GPU (DeviceOptions::ordinal), one CUDA stream and one
// cuBLAS handle bound to that stream: every op is queued on the stream in call
// order and returns at once; download() and synchronize() wait for it. Buffers
// are cudaMalloc'ed device pointers (host_accessible() is false); a Tensor is a
// (device pointer, element offset) pair. Allocations are tracked so that
// DeviceOptions::memory_limit is honoured with OutOfMemory, as on the CPU, and
// buffers may outlive the device. Every failed CUDA or cuBLAS call throws
// cleave::CudaError naming the call and source line (see kernels/cuda/cuda_check.h);
// bad shapes throw std::invalid_argument before anything is queued.
//
// Numerics follow the CPU backend op by op (erf GELU, max-subtracted softmax with
// a double normaliser, two-pass layer norm, PyTorch's SGD and Adam); reductions
// use a fixed order, so results are deterministic run to run. GEMM uses cuBLAS's
// default (non-TF32) float math.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "device/device.h"

// Opaque CUDA types, so that including this header needs no CUDA headers.
struct CUstream_st;
struct cublasContext;

namespace cleave {

class CudaDevice final : public Device {
 public:
  // Opens GPU opts.ordinal. Throws std::runtime_error when it cannot be used (no
  // driver, no such GPU, cuBLAS fails to start). Prefer make_cuda_device, which
  // first checks that any GPU is present and says so clearly.
  explicit CudaDevice(const DeviceOptions& opts = {});
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  Backend backend() const override { return Backend::cuda; }
  std::string name() const override { return name_; }  // "cuda:0 (NVIDIA H200, sm_90, 139.8 GiB)"
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
  // relu uses x, or y when x is undefined; gelu needs x; tanh needs y.
  void activation_backward(Activation act, const Tensor& x, const Tensor& y, const Tensor& dy,
                           const Tensor& dx) override;

  void add_bias_rows(const Tensor& y, const Tensor& b, int64_t rows, int64_t features) override;
  void bias_grad_rows(const Tensor& dy, const Tensor& db, int64_t rows, int64_t features) override;
  void add_bias_channels(const Tensor& y, const Tensor& b, int64_t n, int64_t c, int64_t hw) override;
  void bias_grad_channels(const Tensor& dy, const Tensor& db, int64_t n, int64_t c, int64_t hw) override;

  void im2col(const Tensor& x, const Tensor& cols, const Window2d& g) override;
  void col2im(const Tensor& cols, const Tensor& dx, const Window2d& g) override;
  void swap_axes01(const Tensor& src, const Tensor& dst, int64_t a, int64_t b, int64_t r) override;

  // argmax entries must be those maxpool_forward wrote for the same window geometry.
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

  // dlogits / dpred may be undefined (evaluation only). Labels live on the device and
  // are not checked here (the caller checks them before upload); a row whose label is
  // not a class index gets a NaN loss.
  void softmax_xent(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                    int64_t rows, int64_t classes, float grad_scale) override;
  void mse(const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred, int64_t rows,
           int64_t cols, float grad_scale) override;
  void argmax_match(const Tensor& logits, const Tensor& labels, const Tensor& correct, int64_t rows,
                    int64_t classes) override;

  // momentum_buf may be undefined when s.momentum == 0.
  void sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
                const SgdStep& s) override;
  void adam_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                 const AdamStep& s) override;
  // Waits for the stream (the sum is read back).
  float sum_squares(const Tensor& t) override;

  // The GPT's ops. Token ids are read back and checked on the host first (a
  // blocking copy of `rows` floats); embedding_backward is deterministic (one
  // thread per column walks the rows in order, like the CPU: no atomics).
  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y, int64_t rows, int64_t vocab,
                         int64_t width) override;
  void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, int64_t rows, int64_t vocab,
                          int64_t width) override;
  void causal_softmax_forward(const Tensor& scores, const Tensor& probs, int64_t n, int64_t t, float scale) override;
  void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores, int64_t n, int64_t t,
                               float scale) override;

  int ordinal() const { return ordinal_; }
  size_t bytes_in_use() const override { return in_use_->load(); }

 private:
  // Makes this device's GPU current on the calling thread (ops may come from any thread).
  void bind() const;
  // Frees the stream, cuBLAS handle and scratch memory; ignores errors (destructor, failed constructor).
  void destroy() noexcept;

  int ordinal_ = 0;
  size_t limit_ = 0;
  std::string name_;
  CUstream_st* stream_ = nullptr;
  cublasContext* cublas_ = nullptr;
  double* scratch_ = nullptr;  // sum_squares partials + result
  std::shared_ptr<std::atomic<size_t>> in_use_;
};

}  // namespace cleave
