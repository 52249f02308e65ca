// stage_state.cpp: see stage_state.h.
#include "core/runtime/common/stage_state.h"

#include <memory>
#include <stdexcept>
#include <string>

#include "core/nn/layer.h"
#include "core/optim/optimizer.h"

namespace cleave {

using transport::Message;
using transport::Payload;
using transport::WeightsMsg;

Message stage_state_message(const StageState& state, uint64_t request_id) {
  auto values = std::make_shared<std::vector<float>>(state.params);
  for (const auto& b : state.buffers) values->insert(values->end(), b.begin(), b.end());
  WeightsMsg w;
  w.stage = state.stage;
  w.round = state.steps_taken;
  w.sample_count = 0;
  w.num_elements = static_cast<int64_t>(values->size());
  Message m;
  m.request_id = request_id;
  m.body = w;
  m.payloads.push_back(Payload::of_floats(values));
  return m;
}

StageState read_stage_state(const Message& message, int64_t param_count, size_t buffer_count) {
  const auto* w = std::get_if<WeightsMsg>(&message.body);
  if (w == nullptr) throw std::invalid_argument("a stage state must be a weights message");
  if (w->round < 0) throw std::invalid_argument("a stage state's step count is negative (" + std::to_string(w->round) + ")");
  std::vector<float> values = transport::weights_values(message);
  const auto n = static_cast<int64_t>(values.size());
  const int64_t full = param_count * static_cast<int64_t>(1 + buffer_count);
  if (n != param_count && n != full)
    throw std::invalid_argument("stage " + std::to_string(w->stage) + "'s state holds " + std::to_string(n) +
                                " floats; a stage of " + std::to_string(param_count) + " parameters takes " +
                                std::to_string(param_count) + " (weights) or " + std::to_string(full) +
                                " (weights and " + std::to_string(buffer_count) + " optimizer buffers)");
  StageState s;
  s.stage = w->stage;
  s.steps_taken = w->round;
  s.params.assign(values.begin(), values.begin() + param_count);
  if (n == full && buffer_count > 0)
    for (size_t b = 0; b < buffer_count; ++b)
      s.buffers.emplace_back(values.begin() + param_count * static_cast<int64_t>(1 + b),
                             values.begin() + param_count * static_cast<int64_t>(2 + b));
  return s;
}

StageState capture_stage_state(Stage& stage, bool with_optimizer) {
  StageState s;
  s.stage = stage.index();
  s.steps_taken = stage.optimizer().steps_taken();
  s.params = stage.partition().params().to_host();
  if (with_optimizer)
    for (const Tensor& t : stage.optimizer().state()) s.buffers.push_back(t.to_host());
  return s;
}

void restore_stage_state(Stage& stage, const StageState& state) {
  Partition& part = stage.partition();
  if (state.stage != stage.index())
    throw std::invalid_argument("a state for stage " + std::to_string(state.stage) + " was sent to stage " +
                                std::to_string(stage.index()));
  if (static_cast<int64_t>(state.params.size()) != part.param_count())
    throw std::invalid_argument("the state holds " + std::to_string(state.params.size()) + " parameters, stage " +
                                std::to_string(stage.index()) + " has " + std::to_string(part.param_count()));
  Optimizer& opt = stage.optimizer();
  if (!state.buffers.empty()) {
    // Validates before anything changes (load_state leaves the optimizer as it was on error).
    opt.load_state(optimizer_state_meta(opt.config(), state.steps_taken, opt.param_count()), state.buffers);
  }
  part.params().from_host(state.params);
}

std::vector<int64_t> stage_param_counts(const ModelSpec& spec, const std::vector<int>& bounds) {
  std::vector<int64_t> counts;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    int64_t n = 0;
    for (int i = bounds[s]; i < bounds[s + 1]; ++i) n += make_layer(spec.layers[i], spec.shapes[i])->param_count();
    counts.push_back(n);
  }
  return counts;
}

namespace {

// [offset, offset + count) of `block` for each stage.
std::vector<std::vector<float>> cut(const std::vector<float>& block, const std::vector<int64_t>& counts) {
  std::vector<std::vector<float>> out;
  int64_t offset = 0;
  for (int64_t n : counts) {
    out.emplace_back(block.begin() + offset, block.begin() + offset + n);
    offset += n;
  }
  return out;
}

}  // namespace

StartingPoint read_starting_point(const TrainConfig& cfg, const ModelSpec& spec, const OptimizerConfig& optimizer,
                                  const std::vector<int>& bounds) {
  StartingPoint start;
  const std::vector<int64_t> counts = stage_param_counts(spec, bounds);
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  const auto stages = static_cast<int>(counts.size());
  if (!cfg.load_path.empty()) {
    TrainingState st = load_resume_state(cfg.load_path, spec, total, cfg.batch);
    int64_t steps = 0;
    try {
      steps = check_optimizer_state(optimizer, total, st.optimizer_state, st.optimizer_blocks);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(cfg.load_path + ": " + e.what());
    }
    start.position = st.position;
    const auto params = cut(st.params, counts);
    std::vector<std::vector<std::vector<float>>> buffers;  // [buffer][stage]
    for (const auto& block : st.optimizer_blocks) buffers.push_back(cut(block, counts));
    for (int s = 0; s < stages; ++s) {
      StageState state{s, steps, params[static_cast<size_t>(s)], {}};
      for (const auto& b : buffers) state.buffers.push_back(b[static_cast<size_t>(s)]);
      start.stages.push_back(std::move(state));
    }
  } else if (!cfg.init_path.empty()) {
    const auto params = cut(load_init_weights(spec, cfg.init_path), counts);
    for (int s = 0; s < stages; ++s) start.stages.push_back(StageState{s, 0, params[static_cast<size_t>(s)], {}});
  }
  return start;
}

TrainingState assemble_training_state(const TrainConfig& cfg, const ModelSpec& spec, const OptimizerConfig& optimizer,
                                      const TrainPosition& position, const std::vector<StageState>& stages) {
  TrainingState st;
  st.model = spec.to_json();
  st.optimizer = optimizer.to_json();
  st.position = position;
  st.seed = cfg.seed;
  st.batch_size = cfg.batch;
  const size_t buffers = optimizer_state_names(optimizer).size();
  st.optimizer_blocks.resize(buffers);
  for (const StageState& s : stages) {
    if (s.buffers.size() != buffers)
      throw std::runtime_error("stage " + std::to_string(s.stage) + " sent " + std::to_string(s.buffers.size()) +
                               " optimizer buffers, expected " + std::to_string(buffers));
    if (s.steps_taken != stages.front().steps_taken)
      throw std::runtime_error("stage " + std::to_string(s.stage) + " took " + std::to_string(s.steps_taken) +
                               " optimizer steps but stage 0 took " + std::to_string(stages.front().steps_taken));
    st.params.insert(st.params.end(), s.params.begin(), s.params.end());
    for (size_t b = 0; b < buffers; ++b)
      st.optimizer_blocks[b].insert(st.optimizer_blocks[b].end(), s.buffers[b].begin(), s.buffers[b].end());
  }
  st.optimizer_state = optimizer_state_meta(optimizer, stages.empty() ? 0 : stages.front().steps_taken,
                                            static_cast<int64_t>(st.params.size()));
  return st;
}

}  // namespace cleave
