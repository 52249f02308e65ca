// memory_estimate.h: what a stage will allocate, checked before it is built so
// that an assignment that cannot fit is refused with sizes, not with a crash
// mid-run. The numbers are the planner's memory model (core/planner/memory_model.h),
// so a daemon accepts exactly the stages the planner sized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"
#include "core/planner/memory_model.h"

namespace cleave {

// Layers [begin, end) of `spec` trained with `optimizer` on batches of `batch`
// split into `microbatches`, with `in_flight` micro-batches stashed at once, on a
// device of `backend`: stage_memory(spec, begin, end, optimizer, batch,
// microbatches, in_flight, backend).
StageMemory estimate_stage_memory(const ModelSpec& spec, int begin, int end, const OptimizerConfig& optimizer,
                                  int64_t batch, int in_flight, int microbatches, Backend backend);

// "12.5 MiB"
std::string format_mib(size_t bytes);

}  // namespace cleave
