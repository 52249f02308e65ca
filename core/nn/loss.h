// loss.h: the training losses at the end of a model (cross-entropy, mean squared error).
//
// Conventions (both losses): `output` is (rows, ...) with rows = output.dim(0) and
// cols = output.numel() / rows. loss_sum is the per-row loss summed over rows, in
// double precision on the host:
//   cross_entropy: per-row loss = -log softmax(output row)[label]; targets (rows)
//                  hold class indices as floats, checked on the host. A sequence
//                  output (rows, positions, classes) takes targets (rows,
//                  positions), and a row's loss is the mean over its positions
//                  (a language model's nats per token); `correct` then counts
//                  correct positions / positions, rounded.
//   mse:           per-row loss = sum over cols of (output - target)^2; targets
//                  have the same shape as output.
// doutput receives the gradient of (grad_scale * loss_sum):
//   pass grad_scale = 1 / batch_size for the mean over a batch (micro-batches of
//   one batch then add up to the full-batch gradient); that matches PyTorch's
//   CrossEntropyLoss(reduction='mean'). For MSE it is the mean over samples of the
//   per-sample sum; PyTorch's MSELoss(reduction='mean') is grad_scale =
//   1 / (rows * cols) with loss value loss_sum / (rows * cols).
#pragma once

#include <cstdint>

#include "core/model/model_spec.h"
#include "device/device.h"

namespace cleave {

struct LossResult {
  double loss_sum = 0;  // per-row loss summed over rows (see above)
  int64_t correct = 0;  // rows whose argmax equals the label (cross-entropy only, else 0)
};

// Computes the loss of `output` against `targets` and writes d(grad_scale * loss_sum)
// / d(output) into `doutput` (same shape as output). Throws std::invalid_argument
// for mismatched shapes or a label that is not an integer in [0, classes).
LossResult compute_loss(Device& device, LossKind kind, const Tensor& output, const Tensor& targets,
                        const Tensor& doutput, float grad_scale);

// The per-sample shape of the targets for a per-sample output `output`: () for
// class labels, (positions) for a sequence under cross-entropy, `output` for mse.
Shape target_shape(LossKind kind, const Shape& output);

// The same loss and accuracy without a gradient (evaluation).
LossResult evaluate_loss(Device& device, LossKind kind, const Tensor& output, const Tensor& targets);

}  // namespace cleave
