// profiling_device.h: a Device that forwards every op to a host-accessible device
// (the CPU backend) and adds up the wall time each op takes.
//
// bench_train_step --profile wraps the CPU device in one to show where a training
// step's time goes, op by op (GEMMs keyed by their shape). Buffers are allocated
// by the inner device but report this wrapper as their device, so layers (which
// call x.device()) keep coming back through it; each op re-wraps its tensors as
// non-owning views on the inner device before forwarding. Only host-accessible
// inner devices can be wrapped. Timing adds ~1 us per op of bookkeeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "device/device.h"

namespace cleave::bench {

struct OpTime {
  double seconds = 0;
  int64_t calls = 0;
};

class ProfilingDevice final : public Device {
 public:
  // Takes ownership of `inner`; throws std::invalid_argument unless it is host-accessible.
  explicit ProfilingDevice(std::unique_ptr<Device> inner);

  // Time per op name ("gemm NT 128x1024x1024" for GEMMs), since the last reset().
  const std::map<std::string, OpTime>& times() const { return times_; }
  void reset() { times_.clear(); }

  Backend backend() const override { return inner_->backend(); }
  std::string name() const override { return "profiled " + inner_->name(); }
  MemoryInfo memory() const override { return inner_->memory(); }
  bool host_accessible() const override { return true; }
  std::shared_ptr<Buffer> allocate(size_t bytes) override;
  void upload(const Tensor& dst, const float* src) override;
  void download(const Tensor& src, float* dst) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& t, float value) override;
  void synchronize() override { inner_->synchronize(); }
  void release_cached_memory() override { inner_->release_cached_memory(); }

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
                         const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols, float eps) override;
  void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                          const Tensor& dy, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                          int64_t rows, int64_t cols) override;
  void softmax_xent(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                    int64_t rows, int64_t classes, float grad_scale) override;
  void mse(const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred, int64_t rows,
           int64_t cols, float grad_scale) override;
  void argmax_match(const Tensor& logits, const Tensor& labels, const Tensor& correct, int64_t rows,
                    int64_t classes) override;
  void sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf, const SgdStep& s) override;
  void adam_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                 const AdamStep& s) override;
  float sum_squares(const Tensor& t) override;

 private:
  // A non-owning view of t on the inner device (undefined stays undefined).
  Tensor in(const Tensor& t) const;
  // Runs f() and charges its wall time to `op`.
  template <class F>
  auto timed(const std::string& op, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    struct Charge {
      OpTime& slot;
      std::chrono::steady_clock::time_point t0;
      ~Charge() {
        slot.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++slot.calls;
      }
    } charge{times_[op], t0};
    return f();
  }

  std::unique_ptr<Device> inner_;
  std::map<std::string, OpTime> times_;
};

}  // namespace cleave::bench
