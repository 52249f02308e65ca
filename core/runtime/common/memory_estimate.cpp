// memory_estimate.cpp: see memory_estimate.h.
#include "core/runtime/common/memory_estimate.h"

#include <cstdio>

namespace cleave {

std::string format_mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

StageMemory estimate_stage_memory(const ModelSpec& spec, int begin, int end, const OptimizerConfig& optimizer,
                                  int64_t batch, int in_flight, int microbatches, Backend backend) {
  return stage_memory(spec, begin, end, optimizer, batch, microbatches, in_flight, backend);
}

}  // namespace cleave
