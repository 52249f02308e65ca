// evaluate.h: test-set accuracy and loss of a model held in one partition.
#pragma once

#include <cstdint>

#include "core/data/dataset.h"
#include "core/model/partition.h"

namespace cleave {

struct EvalResult {
  double loss = 0;      // mean loss per sample
  double accuracy = 0;  // fraction of correct predictions (cross-entropy models)
  int64_t samples = 0;
};

// Runs `model` (which must hold the whole model) over `data` in batches of
// `batch`, without keeping activations for backward. Throws
// std::invalid_argument for batch <= 0.
EvalResult evaluate(Partition& model, const Dataset& data, int64_t batch);

}  // namespace cleave
