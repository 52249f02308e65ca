// train_checkpoint.cpp: see train_checkpoint.h.
#include "core/train/train_checkpoint.h"

#include <stdexcept>

#include "core/io/checkpoint.h"
#include "core/io/safetensors.h"
#include "core/io/state_dict.h"

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

namespace {

constexpr const char* kTrainingKind = "cleave-training-state";
constexpr const char* kFedKind = "cleave-fed-state";

std::vector<float> take_params(Checkpoint& ck, const std::string& path) {
  for (auto& [name, data] : ck.blocks)
    if (name == "params") return std::move(data);
  throw std::runtime_error(path + ": checkpoint has no 'params' block");
}

}  // namespace

void save_fed_state(const std::string& path, const FedState& s) {
  Checkpoint ck;
  ck.meta = {{"kind", kFedKind}, {"model", s.model}, {"run", s.run}, {"rounds_done", s.rounds_done}, {"seed", s.seed}};
  ck.blocks.emplace_back("params", s.params);
  save_checkpoint(path, ck);
}

FedState load_fed_state(const std::string& path) {
  Checkpoint ck = load_checkpoint(path);
  const std::string kind = ck.meta.value("kind", "");
  if (kind == kTrainingKind)
    throw std::runtime_error(path + ": a training checkpoint, not a federated one: to start federated rounds from "
                             "its weights, export them (cleave export --checkpoint " + path +
                             " --out W.safetensors) and pass --init W.safetensors");
  if (kind != kFedKind)
    throw std::runtime_error(path + ": not a cleave federated checkpoint (kind '" + kind + "')");
  FedState s;
  try {
    s.model = ck.meta.at("model");
    s.run = ck.meta.value("run", nlohmann::json::object());
    s.rounds_done = ck.meta.at("rounds_done").get<int64_t>();
    s.seed = ck.meta.at("seed").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": checkpoint metadata incomplete: " + e.what());
  }
  if (s.rounds_done < 0) throw std::runtime_error(path + ": rounds_done is negative");
  s.params = take_params(ck, path);
  return s;
}

CheckpointWeights load_checkpoint_weights(const std::string& path) {
  Checkpoint ck = load_checkpoint(path);
  const std::string kind = ck.meta.value("kind", "");
  if (kind != kTrainingKind && kind != kFedKind)
    throw std::runtime_error(path + ": not a cleave training or federated checkpoint (kind '" + kind + "')");
  if (!ck.meta.contains("model")) throw std::runtime_error(path + ": checkpoint metadata has no model");
  return {ck.meta.at("model"), take_params(ck, path)};
}

TrainingState load_training_state(const std::string& path) {
  Checkpoint ck = load_checkpoint(path);
  if (ck.meta.value("kind", "") == kFedKind)
    throw std::runtime_error(path + ": a federated checkpoint (global weights after " +
                             ck.meta.value("rounds_done", nlohmann::json(0)).dump() +
                             " rounds, no optimizer state): resume it with cleave fed --load, or export it (cleave "
                             "export) and start training from its weights with --init");
  if (ck.meta.value("kind", "") != kTrainingKind)
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
  check_saved_model(s.model, s.params.size(), spec, param_count, path);
}

TrainingState load_resume_state(const std::string& path, const ModelSpec& spec, int64_t param_count, int64_t batch) {
  TrainingState st = load_training_state(path);
  check_state_matches(st, spec, param_count, path);
  if (st.batch_size != batch)
    throw std::runtime_error(path + ": checkpoint was trained with --batch " + std::to_string(st.batch_size) +
                             "; resume with the same batch size");
  return st;
}

std::vector<float> load_init_weights(const ModelSpec& spec, const std::string& path) {
  try {
    return load_state_dict(spec, read_safetensors(path));
  } catch (const std::invalid_argument& e) {  // key or shape mismatch: say which file
    throw std::runtime_error(path + ": " + e.what());
  }
}

void check_saved_model(const nlohmann::json& saved_model, size_t saved_params, const ModelSpec& spec,
                       int64_t param_count, const std::string& path) {
  if (saved_model.value("layers", nlohmann::json::array()) != spec.to_json().value("layers", nlohmann::json::array()))
    throw std::runtime_error(path + ": checkpoint was saved for a different model (layers differ from " +
                             spec.source + ")");
  if (static_cast<int64_t>(saved_params) != param_count)
    throw std::runtime_error(path + ": checkpoint holds " + std::to_string(saved_params) +
                             " parameters but the model has " + std::to_string(param_count));
}

}  // namespace cleave
