// optimizer.h: SGD, Adam and AdamW over one contiguous parameter block.
//
// An Optimizer owns the state of one parameter block (a partition's params):
// the SGD momentum buffer, or Adam's first and second moments. Each step() is
// one call to Device::sgd_step / Device::adam_step over the whole block, with
// the learning rate of that step taken from the schedule (lr_schedule.h).
// Semantics are PyTorch's (torch.optim.SGD / Adam / AdamW, default flags).
//
// Memory: the state is allocated on the device at construction and zero-filled,
// so it counts toward the device's memory from the start (and an OutOfMemory
// surfaces before the first step, not in the middle of training):
//   sgd with momentum == 0: nothing; sgd with momentum: param_count floats;
//   adam / adamw: 2 * param_count floats.
//
// Checkpoints: state() gives the device tensors to download, state_meta() the
// JSON to store beside them, load_state() restores both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/optim/lr_schedule.h"
#include "device/device.h"

namespace cleave {

// Everything that defines an optimizer and its learning-rate schedule.
// Fields that do not apply to `kind` are ignored (momentum, dampening and
// nesterov for adam/adamw; beta1, beta2, eps for sgd).
// Note: PyTorch's AdamW defaults to weight_decay = 0.01; here weight_decay is
// exactly what the user passes (default 0) and the command line supplies 0.01
// for adamw.
struct OptimizerConfig {
  std::string kind = "adam";  // sgd | adam | adamw
  float lr = 1e-3f, momentum = 0, dampening = 0, weight_decay = 0, beta1 = 0.9f, beta2 = 0.999f,
        eps = 1e-8f;
  bool nesterov = false;
  std::string schedule = "constant";  // constant | step | cosine
  int64_t step_size = 1000;           // step: decay every step_size steps
  float gamma = 0.1f;                 // step: decay factor
  int64_t warmup_steps = 0;           // linear warm-up (every schedule)
  int64_t total_steps = 0;            // cosine: length of warm-up + decay
  float min_lr = 0;                   // cosine: final learning rate

  // All fields, by name.
  nlohmann::json to_json() const;
  // Reads the fields present in `j` (others keep their defaults) and validates.
  // Throws std::invalid_argument for an unknown field, a wrong type or an invalid value.
  static OptimizerConfig from_json(const nlohmann::json& j);
  // Throws std::invalid_argument naming the first invalid setting.
  void validate() const;
};

// Optimizer kinds and schedules this build knows (for messages and --help).
std::vector<std::string> optimizer_kinds();
std::vector<std::string> lr_schedules();

// How many buffers of the parameter block's size an optimizer of `kind` keeps:
// 0 for sgd without momentum, 1 for sgd with momentum, 2 for adam / adamw. The
// one place this count is written: the Optimizer allocates that many, the
// planner's profiles and the stage memory model (core/planner/memory_model.h)
// count them. Throws std::invalid_argument for another kind.
int optimizer_state_count(const std::string& kind, double momentum);
int optimizer_state_count(const OptimizerConfig& config);
// The state an optimizer of `config` keeps per parameter, by PyTorch's names
// (optimizer_state_count(config) of them): {} for sgd without momentum,
// {momentum_buffer}, or {exp_avg, exp_avg_sq}.
std::vector<std::string> optimizer_state_names(const OptimizerConfig& config);
// The checkpoint meta of such an optimizer over `param_count` parameters after
// `steps_taken` steps: {"kind", "steps_taken", "param_count", "buffers", "config"}.
nlohmann::json optimizer_state_meta(const OptimizerConfig& config, int64_t steps_taken, int64_t param_count);
// Checks saved state against an optimizer of `config` over `param_count`
// parameters (kind, buffers, sizes; `blocks` in optimizer_state_names order) and
// returns its steps_taken. Throws std::invalid_argument saying what differs.
int64_t check_optimizer_state(const OptimizerConfig& config, int64_t param_count, const nlohmann::json& meta,
                              const std::vector<std::vector<float>>& blocks);

class Optimizer {
 public:
  // Validates `config` (std::invalid_argument) and allocates the state for a block of
  // `param_count` floats on `device` (OutOfMemory when it does not fit).
  Optimizer(Device& device, OptimizerConfig config, int64_t param_count);
  // Owns its state buffers: movable, not copyable.
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One optimizer step: params (param_count) updated in place from grads (param_count),
  // both on this optimizer's device. Throws std::invalid_argument on a size or device mismatch.
  void step(const Tensor& params, const Tensor& grads);

  const OptimizerConfig& config() const { return config_; }
  int64_t param_count() const { return param_count_; }
  // Number of step() calls so far (restored by load_state).
  int64_t steps_taken() const { return steps_; }
  // Learning rate the next step() will use: learning_rate(config(), steps_taken()).
  float current_lr() const;
  // Device tensors of the state, each (param_count): {} for sgd without momentum,
  // {momentum_buffer} for sgd with momentum, {exp_avg, exp_avg_sq} for adam/adamw.
  std::vector<Tensor> state() const;
  // Names of the tensors in state(), in the same order (PyTorch's state keys).
  std::vector<std::string> state_names() const;
  // {"kind", "steps_taken", "param_count", "buffers": [names], "config": {...}}.
  nlohmann::json state_meta() const;
  // Restores steps_taken and the state tensors from a checkpoint: `blocks` in
  // state_names() order, each param_count floats. Throws std::invalid_argument when the
  // kind, the buffers or the sizes do not match this optimizer (the state is unchanged then).
  void load_state(const nlohmann::json& meta, const std::vector<std::vector<float>>& blocks);

 private:
  Device* device_;
  OptimizerConfig config_;
  int64_t param_count_;
  int64_t steps_ = 0;
  std::vector<Tensor> state_;
};

}  // namespace cleave
