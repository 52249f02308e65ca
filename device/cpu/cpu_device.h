// cpu_device.h: the CPU backend — host memory, OpenBLAS GEMM, OpenMP loops.
//
// CpuDevice is the ground truth every other backend is compared against. Its
// memory is plain 64-byte aligned host memory (host_accessible() is true), so
// upload/download are memcpy and every op runs synchronously on the caller's
// thread plus an OpenMP team of `threads` threads for large loops. Memory comes
// from a HostPool, which reuses released blocks; an optional memory limit makes
// allocate() throw OutOfMemory once the limit would be exceeded. Buffers may
// outlive the device (the pool is shared).
// OpenBLAS has one process-wide thread count: the most recently opened CpuDevice sets it,
// and the conv2d ops drop it to 1 while their OpenMP team runs (then put it back).
#pragma once

#include <memory>

#include "device/cpu/host_pool.h"
#include "device/device.h"

namespace cleave {

class CpuDevice final : public Device {
 public:
  // threads 0 = all cores; memory_limit 0 = physical RAM. Throws std::invalid_argument
  // for a negative thread count.
  explicit CpuDevice(const DeviceOptions& opts = {});

  Backend backend() const override { return Backend::cpu; }
  std::string name() const override;
  MemoryInfo memory() const override;
  bool host_accessible() const override { return true; }
  std::shared_ptr<Buffer> allocate(size_t bytes) override;
  void upload(const Tensor& dst, const float* src) override;
  void download(const Tensor& src, float* dst) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& t, float value) override;
  void synchronize() override {}
  void release_cached_memory() override { pool_->trim(); }
  size_t peak_bytes_in_use() const override { return pool_->peak_in_use(); }
  void reset_peak() override { pool_->reset_peak(); }

  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Tensor& a,
            int64_t lda, const Tensor& b, int64_t ldb, float beta, const Tensor& c, int64_t ldc) override;

  void axpy(float alpha, const Tensor& x, const Tensor& y) override;
  void scale(const Tensor& x, float alpha) override;
  void mul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void activation_forward(Activation act, const Tensor& x, const Tensor& y) override;
  void activation_backward(Activation act, const Tensor& x, const Tensor& y, const Tensor& dy,
                           const Tensor& dx) override;

  void add_bias_rows(const Tensor& y, const Tensor& b, int64_t rows, int64_t features) override;
  void bias_grad_rows(const Tensor& dy, const Tensor& db, int64_t rows, int64_t features) override;
  void add_bias_channels(const Tensor& y, const Tensor& b, int64_t n, int64_t c, int64_t hw) override;
  void bias_grad_channels(const Tensor& dy, const Tensor& db, int64_t n, int64_t c, int64_t hw) override;

  void im2col(const Tensor& x, const Tensor& cols, const Window2d& g) override;
  void col2im(const Tensor& cols, const Tensor& dx, const Window2d& g) override;
  void swap_axes01(const Tensor& src, const Tensor& dst, int64_t a, int64_t b, int64_t r) override;
  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Window2d& g,
                      int64_t oc) override;
  void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw, const Tensor& db,
                       const Tensor& dx, const Window2d& g, int64_t oc) override;

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
  float sum_squares(const Tensor& t) override;

  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y, int64_t rows, int64_t vocab,
                         int64_t width) override;
  void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, int64_t rows, int64_t vocab,
                          int64_t width) override;
  void causal_softmax_forward(const Tensor& scores, const Tensor& probs, int64_t n, int64_t t, float scale) override;
  void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores, int64_t n, int64_t t,
                               float scale) override;

  // Upper bounds, whatever the thread count, of the bytes of scratch these ops take
  // while they run (the memory model's workspace, device.h's *_workspace_bytes).
  static size_t conv2d_workspace_bytes(const Window2d& g, int64_t oc);
  static size_t bias_grad_rows_workspace_bytes(int64_t rows, int64_t features);
  static size_t layernorm_backward_workspace_bytes(int64_t rows, int64_t cols);

  int threads() const { return threads_; }
  size_t bytes_in_use() const override { return pool_->in_use(); }
  size_t bytes_cached() const { return pool_->cached(); }  // released blocks kept for reuse (host_pool.h)

 private:
  // Number of threads worth using for n items of `cost` elementary operations each.
  int team_size(int64_t n, int64_t cost) const;

  int threads_ = 1;
  size_t limit_ = 0;
  std::shared_ptr<HostPool> pool_;  // shared with the buffers, which may outlive the device
};

}  // namespace cleave
