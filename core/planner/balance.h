// balance.h: the planner's simplest rule, `--planner balance`: every device
// gets a stage, layers split so the most expensive stage is as cheap as
// possible, with no profiling.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/model_spec.h"

namespace cleave {

// Contiguous split of `costs` into `parts` ranges minimising the largest range
// sum (each range non-empty). Returns the `parts + 1` boundaries.
std::vector<int> balance_ranges(const std::vector<double>& costs, int parts);

// Stage boundaries for `parts` equal devices: layer costs are the training
// FLOPs of a batch (3x forward) plus the optimizer's per-parameter work.
std::vector<int> balanced_bounds(const ModelSpec& spec, int64_t batch, int parts);

}  // namespace cleave
