// train_result.cpp: see train_result.h.
#include "core/train/train_result.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
  if (!cfg.text_path.empty()) {  // test_accuracy / test_loss above are the same validation windows
    out["text"] = cfg.text_path;
    out["windows_per_epoch"] = s.train.epoch_samples >= 0 ? std::min(s.train.size(), s.train.epoch_samples)
                                                          : s.train.size();
    out["val_loss"] = s.eval.loss;
    out["val_bits_per_byte"] = s.eval.loss / std::log(2.0);
    out["val_losses"] = s.val_losses;
  }
  return out;
}

void print_evaluation(const TrainConfig& cfg, const EvalResult& ev) {
  if (!cfg.progress) return;
  if (cfg.text_path.empty())
    std::fprintf(stderr, "test accuracy %.4f  test loss %.4f  (%lld samples)\n", ev.accuracy, ev.loss,
                 static_cast<long long>(ev.samples));
  else
    std::fprintf(stderr, "validation loss %.4f nats/byte  %.4f bits/byte  (%lld windows)\n", ev.loss,
                 ev.loss / std::log(2.0), static_cast<long long>(ev.samples));
}

}  // namespace cleave
