// train_step.h: one training step of a model's last partition, in one process.
//
// The step that the one-process loops share: the local trainer, a federated
// client's local epochs, and split learning's parts where they do the same.
// A batch is cut into micro-batches (microbatch_offset); each runs forward,
// loss and backward, the loss scaled by 1/batch so that the micro-batch
// gradients add up in the partition's gradient block to the gradient of the
// batch's mean loss. Then one optimizer step and zero_grad. Micro-batch mb
// draws its dropout masks from DropoutKey::microbatch_seed(mb), from which each
// layer derives its own (Partition::forward): the masks depend on (seed, step,
// micro-batch, layer) only, as in a pipelined run (Stage::run).
//
// The step is split in two halves for the loops that do something between
// them (FedProx adds its proximal term to the gradients) or that own only one
// of them (a split-learning part gets its gradient across the cut):
//   train_step = accumulate_gradients, then apply_gradients.
#pragma once

#include <cstdint>
#include <optional>

#include "core/data/loader.h"
#include "core/model/partition.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"

namespace cleave {

// Which dropout masks a step draws.
struct DropoutKey {
  DropoutKey() = default;
  DropoutKey(uint64_t run_seed, uint64_t step_index) : seed(run_seed), step(step_index) {}
  // Local step `local_step` of federated round `round`.
  static DropoutKey in_round(uint64_t run_seed, uint64_t round, uint64_t local_step);

  uint64_t seed = 0;              // the run's seed
  uint64_t step = 0;              // the step (within the round, when there is one)
  std::optional<uint64_t> round;  // the federated round the step belongs to, if any
  // derive_seed(seed, step, mb), or derive_seed(seed, round, step, mb) in a round.
  uint64_t microbatch_seed(int microbatch) const;
};

// What one step saw. Sums, so steps add up: loss = loss_sum / samples.
struct StepResult {
  double loss_sum = 0;  // per-sample loss summed over the batch (loss.h), before the 1/batch scaling
  int64_t correct = 0;  // samples whose argmax equals the label (cross-entropy only, else 0)
  int64_t samples = 0;  // the batch size
};

struct MicrobatchResult {
  LossResult loss;
  Tensor dx;  // (rows, model.input_shape()...) when need_dx, else undefined
};

// Forward, loss and backward of one micro-batch through `model`, which must end
// the model (its output is the loss input). x is (rows, model.input_shape()...)
// on model.device(); targets are (rows) class labels or (rows, output...). The
// backward pass propagates d(grad_scale * loss_sum)/d(output) and adds the
// parameter gradients to model.grads(). `microbatch` names the activation slot.
// Throws std::invalid_argument when the partition does not end the model, and
// whatever compute_loss throws for mismatched targets.
MicrobatchResult train_microbatch(Partition& model, const Tensor& x, const Tensor& targets, int microbatch,
                                  uint64_t dropout_seed, float grad_scale, bool need_dx);

// The forward/loss/backward half of a step: every micro-batch of `batch`
// (batch.x (size, model.input_shape()...), batch.y (size) labels or
// (size, output...)), in order, with grad_scale 1/batch.size, accumulating into
// model.grads() (which the caller has zeroed). `microbatches` is capped at the
// batch size. Leaves no activations in flight. Throws std::invalid_argument for
// an empty batch, microbatches < 1, or host arrays that do not match the shapes.
StepResult accumulate_gradients(Partition& model, const Batch& batch, int microbatches, const DropoutKey& dropout);

// The update half: optimizer.step(params, grads), then model.zero_grad().
void apply_gradients(Partition& model, Optimizer& optimizer);

// One whole step: accumulate_gradients, then apply_gradients.
StepResult train_step(Partition& model, Optimizer& optimizer, const Batch& batch, int microbatches,
                      const DropoutKey& dropout);

}  // namespace cleave
