// test_run.h: the run every integration test starts from.
#pragma once

#include <cstdint>
#include <string>

#include "core/train/train_config.h"

namespace cleave::testing {

// `model` (a file under the source tree, e.g. "models/mlp.json") at `batch`
// and `seed`, Adam at 1e-3, one thread, no progress lines. Each test sets what
// its run adds (epochs, limits, micro-batches).
inline TrainConfig test_run(const std::string& model, int64_t batch, uint64_t seed) {
  TrainConfig c;
  c.model_path = std::string(CLEAVE_SOURCE_DIR) + "/" + model;
  c.batch = batch;
  c.seed = seed;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 1e-3f;
  c.threads = 1;
  c.progress = false;
  return c;
}

}  // namespace cleave::testing
