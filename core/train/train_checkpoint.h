// train_checkpoint.h: what a training run saves and resumes from.
//
// A training checkpoint is a core/io checkpoint whose blocks are the parameter
// block ("params") and the optimizer state ("optim.0", "optim.1", ...), and whose
// JSON meta records the model, the optimizer and where in the data the run
// stopped, so that resuming replays exactly the batches an uninterrupted run
// would have seen.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"

namespace cleave {

struct TrainPosition {
  int64_t epoch = 0;  // epoch to continue in (0-based)
  int64_t batch = 0;  // next batch index within that epoch
  int64_t step = 0;   // optimizer steps taken so far
};

struct TrainingState {
  nlohmann::json model;       // ModelSpec::to_json()
  nlohmann::json optimizer;   // OptimizerConfig::to_json()
  nlohmann::json optimizer_state;
  TrainPosition position;
  uint64_t seed = 0;
  int64_t batch_size = 0;
  std::vector<float> params;
  std::vector<std::vector<float>> optimizer_blocks;
};

// Atomic write (see core/io/checkpoint.h).
void save_training_state(const std::string& path, const TrainingState& state);
// Throws std::runtime_error naming the file for unreadable, corrupt or foreign files.
TrainingState load_training_state(const std::string& path);

// Checks that a checkpoint belongs to `spec` (same layers, same parameter count);
// throws std::runtime_error saying what differs.
void check_state_matches(const TrainingState& state, const ModelSpec& spec, int64_t param_count,
                         const std::string& path);
// A checkpoint to resume `spec` (of `param_count` parameters) trained with batch
// `batch` from: load_training_state plus check_state_matches plus the batch size.
TrainingState load_resume_state(const std::string& path, const ModelSpec& spec, int64_t param_count, int64_t batch);
// The parameter block of `spec` from a safetensors file (--init); key or shape
// mismatches become std::runtime_error naming the file.
std::vector<float> load_init_weights(const ModelSpec& spec, const std::string& path);

// The same check for any checkpoint's saved model JSON and parameter count.
void check_saved_model(const nlohmann::json& saved_model, size_t saved_params, const ModelSpec& spec,
                       int64_t param_count, const std::string& path);

// What `cleave fed --save` writes after every round: the global weights after
// `rounds_done` rounds. Clients start every round with a fresh optimizer and
// seeded shuffles, so the weights and the round are all a resumed run needs.
struct FedState {
  nlohmann::json model;  // ModelSpec::to_json()
  nlohmann::json run;    // the federated settings, for the record (strategy, clients, ...)
  int64_t rounds_done = 0;
  uint64_t seed = 0;
  std::vector<float> params;
};

// Atomic write, like save_training_state.
void save_fed_state(const std::string& path, const FedState& state);
// Throws std::runtime_error naming the file for unreadable or corrupt files, and
// for a training checkpoint (saying how to start a federated run from its weights).
FedState load_fed_state(const std::string& path);

// The model and weights of either kind of checkpoint (for `cleave export`).
struct CheckpointWeights {
  nlohmann::json model;
  std::vector<float> params;
};
CheckpointWeights load_checkpoint_weights(const std::string& path);

}  // namespace cleave
