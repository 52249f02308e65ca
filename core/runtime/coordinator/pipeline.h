// pipeline.h: pipelined training across cleaved daemons (`cleave train`
// without --local, and `cleave demo`).
//
// The coordinator listens (CURVE + allow-list), waits for N daemons to register,
// splits the layers into N contiguous stages, assigns them, connects the stages
// to each other, then streams each batch: a step control to every stage, the
// micro-batches' inputs to the first stage and their labels to the last. The
// last stage reports the loss; at the end the coordinator gathers the weights,
// evaluates them on the test set and writes the same JSON as local training plus
// `devices` and `plan`.
//
// Devices come and go (docs/recovery.md): the coordinator checkpoints the
// whole model and optimizer state into a directory every --checkpoint-every
// steps (default: once per epoch). A device that dies, disconnects, falls
// silent or fails its step is a loss: the run pauses, re-plans over the
// devices still there plus any that registered since (spares), restores the
// newest checkpoint onto the new stages and replays from its step with the
// same data order, up to --max-recoveries times; the result's `recoveries`
// says what happened. Anything else (a refused assignment, a diverged loss,
// more losses than allowed, a model that no longer fits) stops the run with a
// message naming the device and the step, and how to --resume it; the daemons
// are told to drop the job.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/train/train_config.h"

namespace cleave {

struct ClusterOptions {
  int devices = 1;
  std::string key_path;                 // coordinator's secret key
  std::string allow_path;               // directory of admitted .pub files (or one file)
  std::string listen = "tcp://*:7000";
  std::string schedule = "gpipe";       // gpipe | 1f1b | zb1
  std::string encoding = "f32";         // activations/gradients between stages: f32 | f16 | int8
  std::string trace_path;               // Chrome trace output ("" = none)
  std::string planner = "auto";         // auto: profile + planner; balance: even split over all devices
  std::string recompute = "none";       // none | all | auto: stages that recompute activations in backward
  bool microbatches_auto = false;       // --microbatches auto: the planner chooses the config's microbatches
  bool insecure = false;
  int register_timeout_ms = 120000;     // waiting for N daemons
  int peer_timeout_ms = 5000;           // a daemon silent this long is declared dead
  bool shutdown_daemons = false;        // tell daemons to exit at the end (cleave demo)
  bool profile_only = false;            // `cleave profile`: register, profile, return the cluster JSON
  std::string checkpoint_dir;           // periodic checkpoints ("": resolve_checkpoint_dir picks one)
  bool checkpoint_dir_chosen = false;   // picked by resolve_checkpoint_dir: a new run empties it
  bool checkpoint_dir_temporary = false;  // a directory of our own: removed when the run succeeds
  int64_t checkpoint_every = 0;         // steps between checkpoints (0: one per epoch)
  int max_recoveries = 10;              // lost devices survived before the run stops
  bool resume = false;                  // start from the newest valid checkpoint in checkpoint_dir
  std::function<bool()> interrupted;    // polled; true stops the run (Ctrl-C)
  std::function<void(const std::string&)> on_listening;  // called with the bound endpoint
};

// Fills in `checkpoint_dir` when empty: SAVE.checkpoints beside --save, else
// a new temporary directory (checkpoint_dir_temporary). Idempotent.
void resolve_checkpoint_dir(ClusterOptions& cluster, const TrainConfig& config);

// Runs the job; returns the result JSON. Throws std::runtime_error with a clear
// message on failure.
nlohmann::json train_pipeline(const TrainConfig& config, const ClusterOptions& cluster);

}  // namespace cleave
