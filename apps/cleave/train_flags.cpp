// train_flags.cpp: see train_flags.h.
#include "apps/cleave/train_flags.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/cleave/commands.h"
#include "apps/flag_checks.h"
#include "core/io/atomic_file.h"
#include "core/io/json_file.h"
#include "core/pipeline/schedule.h"

namespace cleave {

void add_train_flags(CLI::App& cmd, TrainFlags& f) {
  TrainConfig& c = f.config;
  OptimizerConfig& o = c.optimizer;
  cmd.add_option("--model", c.model_path, "Model JSON file (e.g. models/cnn.json)")->required();
  f.dataset = cmd.add_option("--dataset", c.dataset, "fashion-mnist, a CSV file, or a directory of IDX files")
                  ->capture_default_str();
  f.text = cmd.add_option("--text", c.text_path,
                          "Train a byte-level language model (models/gpt-tiny.json) on this file's bytes: the first "
                          "90% train, the last 10% validate");
  cmd.add_option("--dataset-dir", c.dataset_dir,
                 "Where Fashion-MNIST lives (default: $CLEAVE_DATA_DIR or /usr/share/datasets/fashion-mnist)");
  cmd.add_option("--epochs", c.epochs, "Passes over the training set")->capture_default_str()->check(flag_checks::positive());
  cmd.add_option("--batch", c.batch, "Samples per optimizer step")->capture_default_str()->check(flag_checks::positive());
  cmd.add_option("--optimizer", o.kind, "sgd | adam | adamw")->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  cmd.add_option("--lr", o.lr, "Learning rate")->capture_default_str()->check(flag_checks::positive());
  cmd.add_option("--momentum", o.momentum, "SGD momentum (explicit; default 0)")->capture_default_str();
  cmd.add_flag("--nesterov", o.nesterov, "SGD with Nesterov momentum");
  f.weight_decay = cmd.add_option("--weight-decay", o.weight_decay,
                                  "L2 weight decay (AdamW: decoupled; default 0, AdamW 0.01)");
  cmd.add_option("--beta1", o.beta1, "Adam beta1")->capture_default_str();
  cmd.add_option("--beta2", o.beta2, "Adam beta2")->capture_default_str();
  cmd.add_option("--eps", o.eps, "Adam epsilon")->capture_default_str();
  cmd.add_option("--lr-schedule", o.schedule, "constant | step | cosine (cosine has linear warm-up)")
      ->capture_default_str()->check(CLI::IsMember({"constant", "step", "cosine"}));
  cmd.add_option("--lr-step-size", o.step_size, "step schedule: steps between decays")->capture_default_str();
  cmd.add_option("--lr-gamma", o.gamma, "step schedule: decay factor")->capture_default_str();
  cmd.add_option("--warmup-steps", o.warmup_steps, "cosine schedule: linear warm-up steps")->capture_default_str();
  cmd.add_option("--min-lr", o.min_lr, "cosine schedule: final learning rate")->capture_default_str();
  cmd.add_option("--seed", c.seed, "Seed for initialisation, shuffling and dropout")->capture_default_str();
  cmd.add_option("--limit-train", c.limit_train, "Train on the first N samples only (--text: N windows per epoch)")
      ->check(flag_checks::positive());
  cmd.add_option("--limit-test", c.limit_test, "Test on the first N samples only (--text: N validation windows)")
      ->check(flag_checks::positive());
  cmd.add_option("--max-steps", c.max_steps, "Stop after N optimizer steps in total")->check(flag_checks::non_negative());
  f.microbatches = std::to_string(c.microbatches);
  cmd.add_option("--microbatches", f.microbatches,
                 "Micro-batches per batch (gradients are accumulated), or auto: the planner chooses them from the "
                 "batch, the stages and the memory (pipeline training)")
      ->capture_default_str()->check(microbatches_check());
  cmd.add_option("--backend", c.backend, "auto | cpu | opencl | cuda")->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "opencl", "cuda"}));
  cmd.add_option("--threads", c.threads, "CPU threads (0 = all cores)")->capture_default_str()
      ->check(flag_checks::non_negative());
  cmd.add_option("--json", f.json_path, "Write the run's results as JSON to this file");
  cmd.add_flag("--no-progress", f.no_progress, "Do not draw the progress bar");
}

std::optional<int> parse_microbatches(const std::string& text) {
  if (text == "auto") return std::nullopt;
  double v = 0;
  if (!flag_checks::read_number(text, v))
    throw std::invalid_argument("expected a number of micro-batches or 'auto', got '" + text + "'");
  if (!(v > 0)) throw std::invalid_argument("must be positive, got " + text);
  if (v != std::floor(v) || v > std::numeric_limits<int>::max())
    throw std::invalid_argument("must be a whole number of micro-batches (or 'auto'), got " + text);
  return static_cast<int>(v);
}

CLI::Validator microbatches_check() { return flag_checks::parsed_by(parse_microbatches, "N|auto"); }

CLI::Validator schedule_check() {
  return CLI::IsMember(std::vector<std::string>{schedule_name(ScheduleKind::gpipe),
                                                schedule_name(ScheduleKind::one_f_one_b),
                                                schedule_name(ScheduleKind::zb1)});
}

void finish_train_flags(TrainFlags& f) {
  try {
    const std::optional<int> m = parse_microbatches(f.microbatches);
    f.microbatches_auto = !m;
    if (m) f.config.microbatches = *m;
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--microbatches: ") + e.what());
  }
  if (f.config.optimizer.kind == "adamw" && f.weight_decay->count() == 0) f.config.optimizer.weight_decay = 0.01f;
  f.config.progress = !f.no_progress;
  if (f.text->count() > 0 && f.dataset->count() > 0)
    throw UsageError("--text and --dataset both say what to train on: give one of them");
  if (f.text->count() > 0 && f.config.text_path.empty()) throw UsageError("--text needs a file name");
  try {
    f.config.optimizer.validate();
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  // Where the run will write, checked before any work is done: an unwritable
  // --save found after training would lose the whole run.
  require_writable("--save", f.config.save_path);
  require_writable("--json", f.json_path);
}

void require_writable(const char* flag, const std::string& path) {
  if (path.empty()) return;
  try {
    check_writable(path);
  } catch (const std::exception& e) {
    throw UsageError(std::string(flag) + " cannot be written: " + e.what() + ": give a path in a writable directory");
  }
}

void write_result_json(const std::string& path, const nlohmann::json& doc) {
  try {
    write_json_file(path, doc);
  } catch (const std::exception& e) {
    throw CliError(std::string("cannot write the result JSON: ") + e.what());
  }
}

}  // namespace cleave
