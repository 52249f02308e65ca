// memory_model.cpp: see memory_model.h.
#include "core/planner/memory_model.h"

#include <algorithm>
#include <bit>
#include <stdexcept>

#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"
#include "device/device.h"

namespace cleave {

namespace {


size_t bytes(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

std::string format_mib(size_t bytes) { return mib_text(bytes) + " MiB"; }

std::string StageMemory::describe() const {
  return format_mib(total()) + " (weights " + format_mib(params) + ", gradients " + format_mib(grads) + ", optimizer state " +
         format_mib(optimizer) + ", activations " + format_mib(activations) + ", workspace " + format_mib(workspace) + ")";
}

MemoryModel::MemoryModel(const ModelProfile& profile, int64_t microbatch_size, std::optional<Backend> backend)
    : n_(profile.num_layers()), mb_(microbatch_size), loss_bytes_(microbatch_size * profile.loss_bytes_per_sample) {
  if (profile.input_bytes_per_sample < 0 || profile.loss_bytes_per_sample < 0)
    throw std::invalid_argument("memory model: negative input or loss bytes in the profile of '" + profile.name + "'");
  if (microbatch_size < 0) throw std::invalid_argument("memory model: negative micro-batch size");
  prefix_params_.assign(n_ + 1, 0);
  prefix_grads_.assign(n_ + 1, 0);
  prefix_state_.assign(n_ + 1, 0);
  prefix_stash_.assign(n_ + 1, 0);
  out_.resize(n_);
  std::vector<int64_t> work(n_);
  for (int i = 0; i < n_; ++i) {
    const LayerProfile& l = profile.layers[i];
    if (l.param_bytes < 0 || l.grad_bytes < 0 || l.optimizer_state_bytes < 0 || l.out_act_bytes < 0 ||
        l.stash_bytes < 0 || l.workspace_bytes < 0)
      throw std::invalid_argument("memory model: layer " + std::to_string(i) + " (" + l.type +
                                  ") has negative bytes in its profile");
    prefix_params_[i + 1] = prefix_params_[i] + l.param_bytes;
    prefix_grads_[i + 1] = prefix_grads_[i] + l.grad_bytes;
    prefix_state_[i + 1] = prefix_state_[i] + l.optimizer_state_bytes;
    prefix_stash_[i + 1] = prefix_stash_[i] + l.stash_bytes;
    out_[i] = l.out_act_bytes;
    // While layer i runs for one micro-batch: its input (or, in backward, the
    // gradient it writes there), its output (or the gradient arriving for it)
    // and its ops' temporaries.
    const int64_t temporaries =
        backend && l.workspace_for ? l.workspace_for(mb_, *backend) : mb_ * l.workspace_bytes;
    work[i] = mb_ * (profile.in_act_bytes(i) + l.out_act_bytes) + temporaries;
  }
  working_max_.push_back(std::move(work));
  for (int span = 1; 2 * span <= n_; span *= 2) {
    const std::vector<int64_t>& prev = working_max_.back();
    std::vector<int64_t> next(n_ - 2 * span + 1);
    for (size_t i = 0; i < next.size(); ++i) next[i] = std::max(prev[i], prev[i + span]);
    working_max_.push_back(std::move(next));
  }
}

StageMemory MemoryModel::stage(int begin, int end, int in_flight) const {
  if (begin < 0 || end > n_ || begin >= end)
    throw std::invalid_argument("memory model: stage [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") is empty or outside the model's " + std::to_string(n_) + " layers");
  const bool last = end == n_;
  const int level = std::bit_width(static_cast<unsigned>(end - begin)) - 1;
  int64_t work = std::max(working_max_[level][begin], working_max_[level][end - (1 << level)]);
  int64_t stash = prefix_stash_[end] - prefix_stash_[begin] + out_[end - 1];
  if (last) {
    stash += out_[end - 1];  // the loss gradient, from the forward to the backward
    work = std::max(work, loss_bytes_);
  }
  StageMemory m;
  m.params = bytes(prefix_params_[end] - prefix_params_[begin]);
  m.grads = bytes(prefix_grads_[end] - prefix_grads_[begin]);
  m.optimizer = bytes(prefix_state_[end] - prefix_state_[begin]);
  m.activations = bytes(static_cast<int64_t>(in_flight) * mb_ * stash);
  m.workspace = bytes(work);
  return m;
}

int64_t largest_microbatch(int64_t batch, int microbatches) {
  if (batch < 1 || microbatches < 1)
    throw std::invalid_argument("memory model: batch (" + std::to_string(batch) + ") and micro-batches (" +
                                std::to_string(microbatches) + ") must be >= 1");
  return (batch + microbatches - 1) / microbatches;
}

StageMemory stage_memory(const ModelSpec& spec, int begin, int end, const OptimizerConfig& optimizer, int64_t batch,
                         int microbatches, int in_flight, std::optional<Backend> backend) {
  const MemoryModel model(profile_model(spec, optimizer.kind, optimizer.momentum),
                          largest_microbatch(batch, microbatches), backend);
  return model.stage(begin, end, in_flight);
}

std::vector<StageMemory> pipeline_memory(const ModelSpec& spec, const std::vector<int>& cuts,
                                         const OptimizerConfig& optimizer, int64_t batch, int microbatches,
                                         ScheduleKind schedule, const std::vector<std::optional<Backend>>& backends) {
  const int p = static_cast<int>(cuts.size()) - 1;
  if (p < 1 || cuts.front() != 0 || cuts.back() != spec.num_layers() || !std::is_sorted(cuts.begin(), cuts.end()) ||
      std::adjacent_find(cuts.begin(), cuts.end()) != cuts.end())
    throw std::invalid_argument("memory model: the cuts must rise strictly from 0 to the model's " +
                                std::to_string(spec.num_layers()) + " layers");
  if (!backends.empty() && static_cast<int>(backends.size()) != p)
    throw std::invalid_argument("memory model: " + std::to_string(backends.size()) + " backends for " +
                                std::to_string(p) + " stages");
  const ModelProfile profile = profile_model(spec, optimizer.kind, optimizer.momentum);
  const int64_t mb = largest_microbatch(batch, microbatches);
  std::vector<StageMemory> out;
  for (int s = 0; s < p; ++s) {
    const MemoryModel model(profile, mb, backends.empty() ? std::nullopt : backends[s]);
    out.push_back(model.stage(cuts[s], cuts[s + 1], max_in_flight(schedule, s, p, microbatches)));
  }
  return out;
}

}  // namespace cleave
