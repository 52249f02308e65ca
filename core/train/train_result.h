// train_result.h: the result JSON every training run writes (`cleave train`
// local and across daemons): the keys both have, in one place. Each run adds
// what is particular to it (epoch_stats, device; schedule, plan, stages, ...).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/data/dataset.h"
#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"
#include "core/train/evaluate.h"
#include "core/train/train_config.h"

namespace cleave {

struct TrainSummary {
  const char* mode;  // "local", "pipeline"
  const ModelSpec& spec;
  const Dataset& train;
  const Dataset& test;
  int64_t start_step = 0;
  int64_t steps = 0;
  nlohmann::json losses;  // one per step
  EvalResult eval;
  double train_seconds = 0, wall_seconds = 0;
  int64_t samples = 0;  // trained on
  const OptimizerConfig& optimizer;
  int64_t parameters = 0;
  nlohmann::json val_losses = nlohmann::json::array();  // --text: validation loss after each epoch
};

// The keys above; a --text run adds text, windows_per_epoch, val_loss
// (eval.loss: nats per byte), val_bits_per_byte (val_loss / ln 2) and
// val_losses (s.val_losses).
nlohmann::json training_result(const TrainConfig& cfg, const TrainSummary& s);

// The final evaluation on stderr when cfg.progress: test accuracy and loss, or
// for --text the validation loss in nats and bits per byte.
void print_evaluation(const TrainConfig& cfg, const EvalResult& ev);

}  // namespace cleave
