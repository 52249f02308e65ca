// lr_schedule.h: the learning rate of each optimizer step.
//
// learning_rate(config, step), step = 0-based index of the optimizer step,
// W = warmup_steps, lr = config.lr:
//   warm-up (every schedule), step < W:  lr * (step + 1) / W
//   then, with s = step - W (steps since the end of warm-up):
//   constant:  lr
//   step:      lr * gamma^floor(s / step_size)
//   cosine:    min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * p)),
//              p = min(1, s / (total_steps - W))   (stays at min_lr after total_steps)
// With W = 0 these are PyTorch's StepLR and CosineAnnealingLR(T_max = total_steps,
// eta_min = min_lr) evaluated at `step`; with W > 0 the warm-up is
// LinearLR(start_factor = 1/W, total_iters = W - 1) followed by the schedule
// restarted at 0 (SequentialLR), except that cosine stays at min_lr at the end.
#pragma once

#include <cstdint>

namespace cleave {

struct OptimizerConfig;

// The learning rate for 0-based optimizer step `step` (step >= 0) under `config`
// (assumed valid; see OptimizerConfig::validate). Negative steps are treated as 0.
float learning_rate(const OptimizerConfig& config, int64_t step);

}  // namespace cleave
