// memory_model.h: the one memory model of a pipeline stage — what layers
// [begin, end) of a model allocate on their device while they train.
//
// The planner places stages with it, the daemons accept or refuse a stage with
// it (pipeline_job.cpp, fed_client.cpp, split_*.cpp) and the coordinator
// reports it; all of them get the same number for the same stage on the same
// kind of device. With P the stage's parameters, mb = ceil(B / M) samples per
// micro-batch, f micro-batches in flight (max_in_flight, core/pipeline/schedule.h)
// and the per-sample byte counts of the ModelProfile (profile.h):
//
//   params       4 * P                      the partition's parameter block
//   grads        4 * P                      its gradient block
//   optimizer    4 * P * optimizer_state_count  (core/optim/optimizer.h)
//   activations  f * mb * (sum of the layers' stash_bytes + the stage's output
//                          [+ the output again on the last stage: the loss
//                          gradient each micro-batch keeps until its backward])
//   workspace    max(max over the layers of (mb * (input + output) + ws(mb)),
//                    [last stage] mb * loss_bytes_per_sample)
//   links        kStageLinkSends * mb * widest [* 2 when recomputing]: the
//                tensors a stage link may still be sending while the stage
//                computes the next micro-batch (core/runtime/daemon/
//                link_pump.h): an input gradient, and, recomputing, an output
//                (without recomputation it belongs to a micro-batch in flight,
//                whose stash counts it); widest is the largest activation at
//                the stage's layers' inputs and its output
//
// With recomputation (Partition::set_recompute) a micro-batch in flight keeps
// only the stage's input [and, on the last stage, its loss gradient] and the
// one being back-propagated rebuilds its activations first:
//
//   activations  mb * ((f - 1) * (in [+ output on the last stage])
//                      + sum of the layers' stash_bytes + output [+ output])
//
// (that micro-batch's full stash holds its own input), workspace as above,
// where `in` is the largest input of the stage's layers: at least the stage's
// input, and so a stage never needs less memory for holding more layers, which
// the planner's exact search relies on. It never exceeds the model without
// recomputation.
//
// where ws(mb) is what the layer's ops take while they run for mb samples on the
// device's backend (Layer::workspace_bytes: the GPU backends' conv2d lowering
// holds the micro-batch's columns, the CPU one sample's per thread and some
// partial sums), or, when the backend is not known, mb * workspace_bytes, a
// per-sample bound for every backend.
//
// It is an upper bound of what the stage allocates (tests/planner/
// test_memory_model.cpp measures real stages on the CPU backend): while layer l
// runs backward for one micro-batch, that micro-batch holds at most its stash
// (the layers above l have freed theirs, which pays for the stage's output
// gradient held through the backward) plus dy (l's output), dx (l's input)
// and l's temporaries; a forward holds at most its stash and the layer's
// temporaries; the last stage's loss holds the targets and per-row values. The
// other micro-batches in flight hold their stashes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/pipeline/schedule.h"
#include "core/planner/profile.h"

namespace cleave {

// Tensors a stage link may hold at once while it sends them (LinkPump::Limits::sends).
inline constexpr int kStageLinkSends = 1;

struct ModelSpec;
struct OptimizerConfig;

// Whether stages recompute their activations in backward (`--recompute`):
// none, all, or auto — where a stage would not fit its device otherwise.
enum class Recompute { none, all, when_needed };
// Parses "none" | "all" | "auto"; throws std::invalid_argument naming the choices.
Recompute parse_recompute(const std::string& name);
const char* recompute_name(Recompute r);  // "none", "all", "auto"
// Whether a stage recomputes under `policy` on a device with `available` bytes,
// given what it needs without recomputing: never, always, or when that does
// not fit (auto). The planner and the coordinator's fixed splits both ask this.
bool stage_recomputes(Recompute policy, size_t plain_bytes, int64_t available);
// Whether recomputing lowers a stage's memory under `schedule`. Under zb1 a
// micro-batch keeps, from its B to its W, the input and output gradient of
// every layer whose backward splits: most of what recomputing frees. The
// model therefore counts a recomputing zb1 stage as keeping its activations
// (an upper bound; the stage still recomputes, and its forward is paid for),
// so `--recompute auto` never recomputes under zb1 to make a stage fit.
bool recompute_saves_memory(ScheduleKind schedule);

// A stage's memory, in bytes, by what holds it (see the file comment).
struct StageMemory {
  size_t params = 0, grads = 0, optimizer = 0;
  size_t activations = 0;  // what the micro-batches in flight keep for backward (and, recomputing, the rebuilt one)
  bool recompute = false;  // the stage recomputes its activations in backward
  size_t workspace = 0;    // one micro-batch's working set: dy, dx, a layer's or the loss's temporaries
  size_t links = 0;        // outputs and input gradients on their way to the neighbouring stages
  size_t weight_state() const { return params + grads + optimizer; }
  size_t total() const { return weight_state() + activations + workspace + links; }
  // "12.0 MiB (weights 4.0 MiB, gradients 4.0 MiB, optimizer state 0.0 MiB,
  // activations 3.0 MiB, workspace 1.0 MiB[, link queues 0.5 MiB])"; recomputing,
  // "activations 3.0 MiB recomputed in backward"
  std::string describe() const;
};

// "12.5 MiB"
std::string format_mib(size_t bytes);

// The model over one ModelProfile, with prefix sums so that every stage costs
// O(1) (the planner's search asks for many), for one micro-batch size and one
// kind of device.
class MemoryModel {
 public:
  MemoryModel() = default;  // a model of no layers
  // `profile` trained with micro-batches of `microbatch_size` samples on a device
  // of `backend` (std::nullopt: any device). Throws std::invalid_argument for
  // negative byte counts in the profile or a negative micro-batch size.
  MemoryModel(const ModelProfile& profile, int64_t microbatch_size, std::optional<Backend> backend);

  int num_layers() const { return n_; }
  int64_t microbatch_size() const { return mb_; }
  // Layers [begin, end) (0 <= begin < end <= num_layers()) with `in_flight`
  // micro-batches kept for backward at once, recomputing their activations or
  // not. Throws std::invalid_argument for an empty or out-of-range interval.
  // `recompute_frees`: recompute_saves_memory(the schedule); a recomputing
  // stage is otherwise counted as one that keeps its activations.
  StageMemory stage(int begin, int end, int in_flight, bool recompute = false, bool recompute_frees = true) const;
  // Weights + gradients + optimizer state of layers [begin, end), which may be
  // empty here (0 <= begin <= end <= num_layers()); stage(...).weight_state().
  int64_t weight_state_bytes(int begin, int end) const {
    return prefix_params_[end] - prefix_params_[begin] + prefix_grads_[end] - prefix_grads_[begin] +
           prefix_state_[end] - prefix_state_[begin];
  }

 private:
  int n_ = 0;
  int64_t mb_ = 0;
  int64_t loss_bytes_ = 0;  // of a micro-batch, on the last stage
  std::vector<int64_t> prefix_params_, prefix_grads_, prefix_state_, prefix_stash_;
  std::vector<int64_t> out_;                       // out_act_bytes per layer
  std::vector<std::vector<int64_t>> working_max_;  // sparse table of each layer's working bytes for a micro-batch
  std::vector<std::vector<int64_t>> input_max_;    // sparse table of each layer's input bytes per sample
};

// Samples in the largest micro-batch of a batch of `batch` split into
// `microbatches`: ceil(batch / microbatches).
int64_t largest_microbatch(int64_t batch, int microbatches);

// Layers [begin, end) of `spec` trained with `optimizer` on batches of `batch`
// samples in `microbatches` micro-batches, `in_flight` of them kept at once, on
// a device of `backend` (std::nullopt: any device), recomputing or not:
// MemoryModel(profile_model(spec, optimizer), largest_microbatch(batch,
// microbatches), backend).stage(...). Throws std::invalid_argument for an
// unknown optimizer kind or a bad interval.
StageMemory stage_memory(const ModelSpec& spec, int begin, int end, const OptimizerConfig& optimizer, int64_t batch,
                         int microbatches, int in_flight, std::optional<Backend> backend, bool recompute = false,
                         bool recompute_frees = true);

// Every stage of a pipeline cutting `spec` at `cuts` (p + 1 increasing
// entries from 0 to the number of layers) under `schedule`: stage s keeps
// max_in_flight(schedule, s, p, microbatches) micro-batches and runs on a device
// of backends[s] (backends empty: unknown devices), recomputing where
// recompute[s] (recompute empty: nowhere). These are the numbers the daemons
// check before building their stages, and what the coordinator reports as
// stages[s].estimated_memory_bytes (total()). Throws std::invalid_argument for
// malformed cuts or a backends or recompute list of another length.
std::vector<StageMemory> pipeline_memory(const ModelSpec& spec, const std::vector<int>& cuts,
                                         const OptimizerConfig& optimizer, int64_t batch, int microbatches,
                                         ScheduleKind schedule, const std::vector<std::optional<Backend>>& backends,
                                         const std::vector<bool>& recompute = {});

}  // namespace cleave
