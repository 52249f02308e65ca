// train_step.cpp: one training step in one process; see train_step.h.
#include "core/train/train_step.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/train/train_config.h"
#include "core/util/rng.h"

namespace cleave {

DropoutKey DropoutKey::in_round(uint64_t run_seed, uint64_t round, uint64_t local_step) {
  DropoutKey key(run_seed, local_step);
  key.round = round;
  return key;
}

uint64_t DropoutKey::microbatch_seed(int microbatch) const {
  const auto mb = static_cast<uint64_t>(microbatch);
  return round ? derive_seed(seed, *round, step, mb) : derive_seed(seed, step, mb);
}

MicrobatchResult train_microbatch(Partition& model, const Tensor& x, const Tensor& targets, int microbatch,
                                  uint64_t dropout_seed, float grad_scale, bool need_dx) {
  if (model.end() != model.spec().num_layers())
    throw std::invalid_argument("train_microbatch: layers [" + std::to_string(model.begin()) + ", " +
                                std::to_string(model.end()) + ") do not end the model (" +
                                std::to_string(model.spec().num_layers()) + " layers), so there is no loss to take");
  Device& dev = model.device();
  MicrobatchResult out;
  Tensor y = model.forward(x, microbatch, /*training=*/true, dropout_seed);
  Tensor dy(dev, y.shape());
  out.loss = compute_loss(dev, model.spec().loss, y, targets, dy, grad_scale);
  out.dx = model.backward(dy, microbatch, need_dx);
  return out;
}

StepResult accumulate_gradients(Partition& model, const Batch& batch, int microbatches, const DropoutKey& dropout) {
  if (batch.size < 1) throw std::invalid_argument("train step: the batch is empty");
  if (microbatches < 1)
    throw std::invalid_argument("train step: micro-batches must be >= 1, got " + std::to_string(microbatches));
  const Shape in = model.input_shape();
  const Shape target = target_shape(model.spec().loss, model.output_shape());  // per sample
  const int64_t in_floats = numel(in);
  const int64_t target_floats = numel(target);
  if (static_cast<int64_t>(batch.x.size()) != batch.size * in_floats ||
      static_cast<int64_t>(batch.y.size()) != batch.size * target_floats)
    throw std::invalid_argument("train step: a batch of " + std::to_string(batch.size) + " holds " +
                                std::to_string(batch.x.size()) + " input and " + std::to_string(batch.y.size()) +
                                " target values; the model takes " + shape_str(in) + " per sample and " +
                                std::to_string(target_floats) + " target value(s)");
  Device& dev = model.device();
  const int m = static_cast<int>(std::min<int64_t>(microbatches, batch.size));
  const float scale = 1.0f / static_cast<float>(batch.size);
  StepResult out;
  for (int mb = 0; mb < m; ++mb) {
    const int64_t lo = microbatch_offset(batch.size, m, mb), hi = microbatch_offset(batch.size, m, mb + 1);
    Tensor x(dev, batched(hi - lo, in));
    x.from_host(batch.x.data() + lo * in_floats);
    Tensor t(dev, batched(hi - lo, target));
    t.from_host(batch.y.data() + lo * target_floats);
    const LossResult r =
        train_microbatch(model, x, t, mb, dropout.microbatch_seed(mb), scale, /*need_dx=*/false).loss;
    out.loss_sum += r.loss_sum;
    out.correct += r.correct;
  }
  out.samples = batch.size;
  return out;
}

void apply_gradients(Partition& model, Optimizer& optimizer) {
  optimizer.step(model.params(), model.grads());
  model.zero_grad();
}

StepResult train_step(Partition& model, Optimizer& optimizer, const Batch& batch, int microbatches,
                      const DropoutKey& dropout) {
  const StepResult r = accumulate_gradients(model, batch, microbatches, dropout);
  apply_gradients(model, optimizer);
  return r;
}

}  // namespace cleave
