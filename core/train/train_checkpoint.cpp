// train_checkpoint.cpp: see train_checkpoint.h.
#include "core/train/train_checkpoint.h"

#include <stdexcept>

#include "core/io/checkpoint.h"

namespace cleave {

void save_training_state(const std::string& path, const TrainingState& s) {
  Checkpoint ck;
  ck.meta = {{"kind", "cleave-training-state"},
             {"model", s.model},
             {"optimizer", s.optimizer},
             {"optimizer_state", s.optimizer_state},
             {"position", {{"epoch", s.position.epoch}, {"batch", s.position.batch}, {"step", s.position.step}}},
             {"seed", s.seed},
             {"batch_size", s.batch_size}};
  ck.blocks.emplace_back("params", s.params);
  for (size_t i = 0; i < s.optimizer_blocks.size(); ++i)
    ck.blocks.emplace_back("optim." + std::to_string(i), s.optimizer_blocks[i]);
  save_checkpoint(path, ck);
}

TrainingState load_training_state(const std::string& path) {
  Checkpoint ck = load_checkpoint(path);
  if (ck.meta.value("kind", "") != "cleave-training-state")
    throw std::runtime_error(path + ": not a cleave training checkpoint (kind '" + ck.meta.value("kind", "") + "')");
  TrainingState s;
  try {
    s.model = ck.meta.at("model");
    s.optimizer = ck.meta.at("optimizer");
    s.optimizer_state = ck.meta.at("optimizer_state");
    const auto& pos = ck.meta.at("position");
    s.position = {pos.at("epoch").get<int64_t>(), pos.at("batch").get<int64_t>(), pos.at("step").get<int64_t>()};
    s.seed = ck.meta.at("seed").get<uint64_t>();
    s.batch_size = ck.meta.at("batch_size").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": checkpoint metadata incomplete: " + e.what());
  }
  bool have_params = false;
  for (auto& [name, data] : ck.blocks) {
    if (name == "params") {
      s.params = std::move(data);
      have_params = true;
    } else if (name.rfind("optim.", 0) == 0) {
      s.optimizer_blocks.push_back(std::move(data));
    }
  }
  if (!have_params) throw std::runtime_error(path + ": checkpoint has no 'params' block");
  return s;
}

void check_state_matches(const TrainingState& s, const ModelSpec& spec, int64_t param_count,
                         const std::string& path) {
  if (s.model.value("layers", nlohmann::json::array()) != spec.to_json().value("layers", nlohmann::json::array()))
    throw std::runtime_error(path + ": checkpoint was saved for a different model (layers differ from " +
                             spec.source + ")");
  if (static_cast<int64_t>(s.params.size()) != param_count)
    throw std::runtime_error(path + ": checkpoint holds " + std::to_string(s.params.size()) +
                             " parameters but the model has " + std::to_string(param_count));
}

}  // namespace cleave
