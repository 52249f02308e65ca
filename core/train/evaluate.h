// evaluate.h: test-set accuracy and loss of a model held in one partition.
#pragma once

#include <cstdint>
#include <functional>

#include "core/data/dataset.h"
#include "core/model/partition.h"

namespace cleave {

struct EvalResult {
  double loss = 0;      // mean loss per sample
  double accuracy = 0;  // fraction of correct predictions (cross-entropy models)
  int64_t samples = 0;
};

// Runs `model` (which must hold the whole model) over `data` in batches of
// `batch`, without keeping activations for backward; `between` (if set) runs
// after each batch (a pipeline coordinator keeps its daemons' links alive).
// Throws std::invalid_argument for batch <= 0 or targets of another size than
// the model's loss takes.
EvalResult evaluate(Partition& model, const Dataset& data, int64_t batch, const std::function<void()>& between = {});

}  // namespace cleave
