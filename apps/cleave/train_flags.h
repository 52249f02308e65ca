// train_flags.h: the training flags shared by `cleave train`, `cleave demo`,
// `cleave fed` and `cleave split` (model, data, optimizer, schedule, seed...),
// registered once so every command spells them the same way.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/train/train_config.h"

namespace cleave {

struct TrainFlags {
  TrainConfig config;
  std::string microbatches = "1";  // --microbatches as given: a count (into config.microbatches) or "auto"
  bool microbatches_auto = false;  // "auto": the planner chooses config.microbatches (pipeline training)
  std::string json_path;
  bool no_progress = false;
  CLI::Option* weight_decay = nullptr;
  CLI::Option* dataset = nullptr;
  CLI::Option* text = nullptr;
};

// Adds --model, --dataset, --text, --dataset-dir, --epochs, --batch, --optimizer, --lr,
// --momentum, --nesterov, --weight-decay, --beta1, --beta2, --eps, --lr-schedule,
// --lr-step-size, --lr-gamma, --warmup-steps, --min-lr, --seed, --limit-train,
// --limit-test, --max-steps, --microbatches, --backend, --threads, --json,
// --no-progress to `cmd`.
void add_train_flags(CLI::App& cmd, TrainFlags& flags);
// --microbatches' value: "auto" gives nullopt (the planner chooses), a whole
// number >= 1 that count. Throws std::invalid_argument saying what is wrong.
std::optional<int> parse_microbatches(const std::string& text);
// The CLI11 check of --microbatches (parse_microbatches), shared by train and plan.
CLI::Validator microbatches_check();
// The CLI11 check of --schedule: the schedule vocabulary's names (gpipe, 1f1b,
// zb1; core/pipeline/schedule.h), shared by train, plan, profile and demo.
CLI::Validator schedule_check();

// Applies defaults that depend on other flags (AdamW's weight decay), reads
// --microbatches into config.microbatches / microbatches_auto and validates (--text and --dataset exclude each other); throws UsageError.
void finish_train_flags(TrainFlags& flags);
// Throws UsageError (exit 2) when `flag`'s `path` cannot be written; "" is fine.
void require_writable(const char* flag, const std::string& path);
// Writes a command's result `doc` to `path` (core/io/json_file.h: pretty,
// atomic); "" does nothing. Throws CliError naming the file.
void write_result_json(const std::string& path, const nlohmann::json& doc);

}  // namespace cleave
