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

}  // namespace cleave
