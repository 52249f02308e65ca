// train_config.h: everything a training run is configured by, shared by local
// training (`cleave train --local`) and pipelined training across daemons, so
// both produce the same batches, the same losses and the same JSON.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/optim/optimizer.h"

namespace cleave {

struct TrainConfig {
  std::string model_path;                 // models/*.json
  std::string dataset = "fashion-mnist";  // name, CSV path or IDX directory
  std::string dataset_dir;                // overrides where fashion-mnist is found
  std::string text_path;                  // --text: train a language model on this file's bytes (replaces dataset)
  int epochs = 1;
  int64_t batch = 64;
  uint64_t seed = 1;
  int64_t limit_train = -1;  // first N training samples (-1 = all); --text: windows per epoch
  int64_t limit_test = -1;   // first N test samples (-1 = all); --text: validation windows
  int64_t max_steps = -1;    // stop after this many optimizer steps in total (-1 = no limit)
  int microbatches = 1;      // gradient accumulation / pipeline micro-batches per batch
  OptimizerConfig optimizer;
  std::string backend = "cpu";
  int threads = 0;           // CPU threads (0 = all cores)
  std::string save_path;     // checkpoint written at the end (and every save_every steps)
  int64_t save_every = 0;
  std::string load_path;     // checkpoint to resume from
  std::string init_path;     // safetensors weights to start from
  bool progress = true;

  nlohmann::json to_json() const;
};

// Splits a batch of `batch` samples into `microbatches` near-equal parts:
// part i covers [offset(i), offset(i+1)). Throws std::invalid_argument when
// microbatches < 1 or > batch, or index is outside [0, microbatches].
int64_t microbatch_offset(int64_t batch, int microbatches, int index);

}  // namespace cleave
