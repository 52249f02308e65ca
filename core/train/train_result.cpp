// train_result.cpp: see train_result.h.
#include "core/train/train_result.h"

#include <algorithm>

namespace cleave {

nlohmann::json training_result(const TrainConfig& cfg, const TrainSummary& s) {
  nlohmann::json out;
  out["mode"] = s.mode;
  out["model"] = s.spec.name;
  out["model_path"] = cfg.model_path;
  out["dataset"] = s.train.name;
  out["train_samples"] = s.train.size();
  out["test_samples"] = s.test.size();
  out["epochs"] = cfg.epochs;
  out["batch"] = cfg.batch;
  out["microbatches"] = cfg.microbatches;
  out["seed"] = cfg.seed;
  out["start_step"] = s.start_step;
  out["steps"] = s.steps;
  out["losses"] = s.losses;
  out["test_accuracy"] = s.eval.accuracy;
  out["test_loss"] = s.eval.loss;
  out["samples_per_sec"] = s.samples / std::max(1e-9, s.train_seconds);
  out["wall_seconds"] = s.wall_seconds;
  out["optimizer"] = s.optimizer.to_json();
  out["parameters"] = s.parameters;
  return out;
}

}  // namespace cleave
