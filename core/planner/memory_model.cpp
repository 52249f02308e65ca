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

// A sparse table over `values`: level j holds the maxima of 2^j consecutive entries.
std::vector<std::vector<int64_t>> range_max_table(std::vector<int64_t> values) {
  std::vector<std::vector<int64_t>> table;
  const size_t n = values.size();
  table.push_back(std::move(values));
  for (size_t span = 1; 2 * span <= n; span *= 2) {
    const std::vector<int64_t>& prev = table.back();
    std::vector<int64_t> next(n - 2 * span + 1);
    for (size_t i = 0; i < next.size(); ++i) next[i] = std::max(prev[i], prev[i + span]);
    table.push_back(std::move(next));
  }
  return table;
}

// The largest of entries [begin, end) (begin < end) of the table's values, in O(1).
int64_t range_max(const std::vector<std::vector<int64_t>>& table, int begin, int end) {
  const int level = std::bit_width(static_cast<unsigned>(end - begin)) - 1;
  return std::max(table[level][begin], table[level][end - (1 << level)]);
}

}  // namespace

std::string format_mib(size_t bytes) { return mib_text(bytes) + " MiB"; }

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::none;
  if (name == "all") return Recompute::all;
  if (name == "auto") return Recompute::when_needed;
  throw std::invalid_argument("'" + name +
                              "' is not a recompute mode: use none (keep every activation), all (every stage recomputes its activations in "
                              "backward) or auto (only the stages that would not fit otherwise)");
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::all: return "all";
    case Recompute::when_needed: return "auto";
  }
  return "none";
}

bool stage_recomputes(Recompute policy, size_t plain_bytes, int64_t available) {
  switch (policy) {
    case Recompute::none: return false;
    case Recompute::all: return true;
    case Recompute::when_needed: return static_cast<int64_t>(plain_bytes) > available;
  }
  return false;
}

std::string StageMemory::describe() const {
  return format_mib(total()) + " (weights " + format_mib(params) + ", gradients " + format_mib(grads) + ", optimizer state " +
         format_mib(optimizer) + ", activations " + format_mib(activations) + (recompute ? " recomputed in backward" : "") +
         ", workspace " + format_mib(workspace) + (links ? ", link queues " + format_mib(links) : "") + ")";
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
  std::vector<int64_t> work(n_), input(n_);
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
    input[i] = profile.in_act_bytes(i);
    out_[i] = l.out_act_bytes;
    // While layer i runs for one micro-batch: its input (or, in backward, the
    // gradient it writes there), its output (or the gradient arriving for it)
    // and its ops' temporaries.
    const int64_t temporaries =
        backend && l.workspace_for ? l.workspace_for(mb_, *backend) : mb_ * l.workspace_bytes;
    work[i] = mb_ * (profile.in_act_bytes(i) + l.out_act_bytes) + temporaries;
  }
  working_max_ = range_max_table(std::move(work));
  input_max_ = range_max_table(std::move(input));
}

bool recompute_saves_memory(ScheduleKind schedule) { return schedule != ScheduleKind::zb1; }

StageMemory MemoryModel::stage(int begin, int end, int in_flight, bool recompute, bool recompute_frees) const {
  if (begin < 0 || end > n_ || begin >= end)
    throw std::invalid_argument("memory model: stage [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") is empty or outside the model's " + std::to_string(n_) + " layers");
  const bool last = end == n_;
  int64_t work = range_max(working_max_, begin, end);
  int64_t stash = prefix_stash_[end] - prefix_stash_[begin] + out_[end - 1];
  int64_t kept = range_max(input_max_, begin, end);  // recomputing: what a micro-batch keeps (bounded)
  if (last) {
    stash += out_[end - 1];  // the loss gradient, from the forward to the backward
    kept += out_[end - 1];
    work = std::max(work, loss_bytes_);
  }
  // Recomputing, the micro-batch in backward holds its full stash, the others their inputs.
  const int64_t per_sample =
      recompute && recompute_frees ? std::max(in_flight - 1, 0) * kept + stash : in_flight * stash;
  StageMemory m;
  m.params = bytes(prefix_params_[end] - prefix_params_[begin]);
  m.grads = bytes(prefix_grads_[end] - prefix_grads_[begin]);
  m.optimizer = bytes(prefix_state_[end] - prefix_state_[begin]);
  m.activations = bytes(mb_ * per_sample);
  m.recompute = recompute;
  m.workspace = bytes(work);
  // Tensors on their way to a neighbour (LinkPump): the input gradient of a
  // micro-batch whose backward is done, and, recomputing, an output (a
  // micro-batch in flight keeps only its input; otherwise its stash counts its
  // output). Each is bounded by the stage's widest activation, counted on
  // every stage, so that more layers never need less. A recomputing stage
  // holds at every moment a part of what the same stage holds without
  // recomputing, so it is never counted above that.
  const int64_t widest = std::max(range_max(input_max_, begin, end), out_[end - 1]);
  const bool rebuilt = recompute && recompute_frees;
  int64_t links = kStageLinkSends * mb_ * widest * (rebuilt ? 2 : 1);
  if (rebuilt) links = std::min(links, mb_ * (in_flight * stash + kStageLinkSends * widest) - mb_ * per_sample);
  m.links = bytes(links);
  return m;
}

int64_t largest_microbatch(int64_t batch, int microbatches) {
  if (batch < 1 || microbatches < 1)
    throw std::invalid_argument("memory model: batch (" + std::to_string(batch) + ") and micro-batches (" +
                                std::to_string(microbatches) + ") must be >= 1");
  return (batch + microbatches - 1) / microbatches;
}

StageMemory stage_memory(const ModelSpec& spec, int begin, int end, const OptimizerConfig& optimizer, int64_t batch,
                         int microbatches, int in_flight, std::optional<Backend> backend, bool recompute,
                         bool recompute_frees) {
  const MemoryModel model(profile_model(spec, optimizer.kind, optimizer.momentum),
                          largest_microbatch(batch, microbatches), backend);
  return model.stage(begin, end, in_flight, recompute, recompute_frees);
}

std::vector<StageMemory> pipeline_memory(const ModelSpec& spec, const std::vector<int>& cuts,
                                         const OptimizerConfig& optimizer, int64_t batch, int microbatches,
                                         ScheduleKind schedule, const std::vector<std::optional<Backend>>& backends,
                                         const std::vector<bool>& recompute) {
  const int p = static_cast<int>(cuts.size()) - 1;
  if (p < 1 || cuts.front() != 0 || cuts.back() != spec.num_layers() || !std::is_sorted(cuts.begin(), cuts.end()) ||
      std::adjacent_find(cuts.begin(), cuts.end()) != cuts.end())
    throw std::invalid_argument("memory model: the cuts must rise strictly from 0 to the model's " +
                                std::to_string(spec.num_layers()) + " layers");
  if (!backends.empty() && static_cast<int>(backends.size()) != p)
    throw std::invalid_argument("memory model: " + std::to_string(backends.size()) + " backends for " +
                                std::to_string(p) + " stages");
  if (!recompute.empty() && static_cast<int>(recompute.size()) != p)
    throw std::invalid_argument("memory model: " + std::to_string(recompute.size()) + " recompute choices for " +
                                std::to_string(p) + " stages");
  const ModelProfile profile = profile_model(spec, optimizer.kind, optimizer.momentum);
  const int64_t mb = largest_microbatch(batch, microbatches);
  std::vector<StageMemory> out;
  for (int s = 0; s < p; ++s) {
    const MemoryModel model(profile, mb, backends.empty() ? std::nullopt : backends[s]);
    out.push_back(model.stage(cuts[s], cuts[s + 1], max_in_flight(schedule, s, p, microbatches),
                              !recompute.empty() && recompute[s], recompute_saves_memory(schedule)));
  }
  return out;
}

}  // namespace cleave
