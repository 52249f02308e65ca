// memory_estimate.h: what a stage will allocate, checked before it is built so
// that an assignment that cannot fit is refused with sizes, not with a crash
// mid-run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"

namespace cleave {

struct StageMemory {
  size_t params = 0, grads = 0, optimizer = 0;
  size_t activations = 0;  // stashed micro-batches in flight + one working set
  size_t total() const { return params + grads + optimizer + activations; }
  // "12.0 MiB (weights 4.0 MiB, gradients 4.0 MiB, optimizer state 0.0 MiB, activations 4.0 MiB)"
  std::string describe() const;
};

// Layers [begin, end) of `spec` trained with `optimizer` on batches of `batch`
// split into `microbatches`, with `in_flight` micro-batches stashed at once.
StageMemory estimate_stage_memory(const ModelSpec& spec, int begin, int end, const OptimizerConfig& optimizer,
                                  int64_t batch, int in_flight, int microbatches);

// "12.5 MiB"
std::string format_mib(size_t bytes);

}  // namespace cleave
