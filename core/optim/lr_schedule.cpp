// lr_schedule.cpp: learning_rate() as documented in lr_schedule.h.
#include "core/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/optim/optimizer.h"

namespace cleave {

float learning_rate(const OptimizerConfig& c, int64_t step) {
  step = std::max<int64_t>(step, 0);
  const double lr = c.lr;
  if (c.warmup_steps > 0 && step < c.warmup_steps) {
    return static_cast<float>(lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps));
  }
  const int64_t s = step - std::max<int64_t>(c.warmup_steps, 0);
  if (c.schedule == "step") {
    const int64_t size = std::max<int64_t>(c.step_size, 1);
    return static_cast<float>(lr * std::pow(static_cast<double>(c.gamma), static_cast<double>(s / size)));
  }
  if (c.schedule == "cosine") {
    const int64_t span = c.total_steps - std::max<int64_t>(c.warmup_steps, 0);
    const double p = span > 0 ? std::min(1.0, static_cast<double>(s) / static_cast<double>(span)) : 1.0;
    const double min_lr = c.min_lr;
    return static_cast<float>(min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * p)));
  }
  return static_cast<float>(lr);  // constant
}

}  // namespace cleave
