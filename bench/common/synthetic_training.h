// synthetic_training.h: the training-step loop the benchmarks time — the
// local trainer's step (core/train/train_step.h: forward, loss scaled by
// 1/batch, backward, Adam lr 1e-3, zero_grad) over a few fixed batches of
// seeded random inputs and labels, kept on the device, so no data loading or
// upload allocation is timed.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/optim/optimizer.h"
#include "core/train/train_step.h"
#include "core/util/rng.h"
#include "device/device.h"

namespace cleave::bench {

class SyntheticTraining {
 public:
  // The whole of `spec` on `device` (which must outlive this), batches of `batch`.
  SyntheticTraining(Device& device, const ModelSpec& spec, int64_t batch, uint64_t seed)
      : device_(device), spec_(spec), batch_(batch), seed_(seed) {
    model_ = std::make_unique<Partition>(device_, spec_, 0, spec_.num_layers());
    model_->init(seed);
    model_->zero_grad();
    OptimizerConfig oc;
    oc.kind = "adam";
    oc.lr = 1e-3f;
    opt_ = std::make_unique<Optimizer>(device_, oc, model_->param_count());
    const int64_t in = numel(spec_.input);
    const int64_t classes = numel(spec_.output());
    Rng rng(derive_seed(seed, 7));
    for (int b = 0; b < kBatches; ++b) {
      xs_[b].resize(static_cast<size_t>(batch * in));
      ys_[b].resize(static_cast<size_t>(batch));
      for (float& v : xs_[b]) v = rng.uniform();
      for (float& v : ys_[b]) v = static_cast<float>(rng.below(static_cast<uint64_t>(classes)));
    }
    Shape xs = spec_.input;
    xs.insert(xs.begin(), batch);
    x_ = Tensor(device_, xs);
    t_ = Tensor(device_, {batch});
  }

  Device& device() { return device_; }

  // One training step; returns the mean loss of the batch.
  double step() {
    const int b = static_cast<int>(step_ % kBatches);
    x_.from_host(xs_[b].data());
    t_.from_host(ys_[b].data());
    const uint64_t dropout_seed = DropoutKey(seed_, static_cast<uint64_t>(step_)).microbatch_seed(0);
    const double loss =
        train_microbatch(*model_, x_, t_, 0, dropout_seed, 1.0f / static_cast<float>(batch_), /*need_dx=*/false)
            .loss.loss_sum /
        static_cast<double>(batch_);
    apply_gradients(*model_, *opt_);
    ++step_;
    return loss;
  }

  // Wall seconds of `steps` steps, ending with a synchronize; throws when the loss is not finite.
  double time(int64_t steps) {
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int64_t i = 0; i < steps; ++i) loss = step();
    device_.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!std::isfinite(loss)) throw std::runtime_error("cleave training diverged (loss " + std::to_string(loss) + ")");
    last_loss_ = loss;
    return s;
  }
  double last_loss() const { return last_loss_; }

 private:
  static constexpr int kBatches = 4;
  Device& device_;
  ModelSpec spec_;
  int64_t batch_;
  uint64_t seed_;
  std::unique_ptr<Partition> model_;
  std::unique_ptr<Optimizer> opt_;
  std::vector<float> xs_[kBatches], ys_[kBatches];
  Tensor x_, t_;
  int64_t step_ = 0;
  double last_loss_ = 0;
};

}  // namespace cleave::bench
