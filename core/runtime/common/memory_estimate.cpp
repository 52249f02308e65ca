// memory_estimate.cpp: see memory_estimate.h.
#include "core/runtime/common/memory_estimate.h"

#include <algorithm>
#include <cstdio>

#include "core/nn/layer.h"

namespace cleave {

std::string format_mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string StageMemory::describe() const {
  return format_mib(total()) + " (weights " + format_mib(params) + ", gradients " + format_mib(grads) +
         ", optimizer state " + format_mib(optimizer) + ", activations " + format_mib(activations) + ")";
}

StageMemory estimate_stage_memory(const ModelSpec& spec, int begin, int end, const OptimizerConfig& optimizer,
                                  int64_t batch, int in_flight, int microbatches) {
  StageMemory m;
  int64_t params = 0, stash_per_sample = 0, widest = 0, workspace = 0;
  for (int i = begin; i < end; ++i) {
    auto layer = make_layer(spec.layers[i], spec.shapes[i]);
    params += layer->param_count();
    stash_per_sample += numel(spec.shapes[i]) + layer->saved_floats_per_sample(spec.shapes[i]);
    widest = std::max({widest, numel(spec.shapes[i]), numel(spec.shapes[i + 1])});
    workspace = std::max(workspace, layer->workspace_floats_per_sample(spec.shapes[i]));
  }
  stash_per_sample += numel(spec.shapes[end]);
  const int64_t mb_samples = (batch + microbatches - 1) / microbatches;
  int states = 0;
  if (optimizer.kind == "adam" || optimizer.kind == "adamw") states = 2;
  else if (optimizer.momentum > 0) states = 1;
  m.params = static_cast<size_t>(params) * sizeof(float);
  m.grads = m.params;
  m.optimizer = m.params * static_cast<size_t>(states);
  // Stashed micro-batches plus the working tensors of one micro-batch
  // (incoming gradient, outgoing gradient, temporaries ~ 3 widest layers, and
  // the largest layer workspace, e.g. a convolution's columns).
  m.activations =
      static_cast<size_t>((stash_per_sample * in_flight + 3 * widest + workspace) * mb_samples) * sizeof(float);
  return m;
}

}  // namespace cleave
