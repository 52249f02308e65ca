// cmd_split.cpp: `cleave split` — split learning across cleaved daemons: the
// clients keep their data (and, U-shaped, their labels), the server holds the
// middle of the model (core/runtime/coordinator/split_coordinator.h).
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "apps/cleave/commands.h"
#include "apps/cleave/coordinator_flags.h"
#include "apps/cleave/train_flags.h"
#include "apps/flag_checks.h"
#include "core/model/model_spec.h"
#include "core/runtime/common/split_layout.h"
#include "core/runtime/coordinator/split_coordinator.h"

namespace cleave {

namespace {

// Local DP on the cut layer (docs/privacy.md, "Local DP for split learning").
void add_activation_noise_flags(CLI::App& cmd, SplitOptions& o) {
  cmd.add_option("--activation-noise", o.activation_noise,
                 "Local DP on the cut layer: each client adds Gaussian noise of stddev SIGMA*C to its clipped "
                 "activations, in training and evaluation (0: off)")
      ->capture_default_str()->check(flag_checks::non_negative());
  cmd.add_option("--activation-clip", o.activation_clip,
                 "With --activation-noise: clip each sample's cut-layer activation to this L2 norm C first")
      ->capture_default_str()->check(flag_checks::positive());
}

// Throws UsageError for a flag given where it means nothing.
void refuse_misplaced_flags(const CLI::App& cmd) {
  // Flags of `cleave train` that mean nothing here: the clients own the data.
  for (const char* name : {"--limit-train", "--max-steps", "--microbatches", "--dataset", "--dataset-dir", "--text"})
    if (cmd.get_option(name)->count() > 0)
      throw UsageError(std::string(name) + " does not apply to cleave split: the clients own the data; give it "
                       "to them with cleaved --dataset/--dataset-dir/--shard/--limit-train");
  if (cmd.get_option("--activation-clip")->count() > 0 && cmd.get_option("--activation-noise")->count() == 0)
    throw UsageError("--activation-clip applies only with --activation-noise SIGMA (without noise nothing is clipped)");
}

}  // namespace

void add_split_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "split", "Split learning: clients hold the first layers and their data, a server daemon the rest");
  auto flags = std::make_shared<TrainFlags>();
  add_train_flags(*cmd, *flags);
  auto o = std::make_shared<SplitOptions>();
  cmd->add_option("--clients", o->clients, "Clients with data (cleaved --dataset ... --shard i/N) to wait for")
      ->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--labels", o->labels,
                  "server: the server computes the loss from labels the clients send; client: U-shaped, the "
                  "clients also hold the last layers and the loss, so labels never leave them")
      ->capture_default_str()->check(CLI::IsMember({"server", "client"}));
  cmd->add_flag("--splitfed", o->splitfed, "Average the clients' layers (FedAvg, weighted by samples) every epoch");
  cmd->add_option("--cut", o->cut, "Clients hold layers [0, CUT) (default: the first layer with parameters "
                                   "and the parameter-free layers after it)");
  cmd->add_option("--cut-back", o->cut_back, "--labels client: clients also hold layers [CUT_BACK, end) "
                                             "(default: the last layer with parameters)");
  cmd->add_option("--encoding", o->encoding, "Cut-layer activations and gradients: f32 | f16 | int8 (labels stay f32)")
      ->capture_default_str()->check(CLI::IsMember({"f32", "f16", "int8"}));
  cmd->add_option("--server", o->server, "Name of the server daemon (default: the first daemon without data)");
  cmd->add_option("--eval-batch", o->eval_batch, "Test samples per evaluation batch")->capture_default_str()
      ->check(flag_checks::positive());
  add_activation_noise_flags(*cmd, *o);
  add_coordinator_flags(*cmd, *o, "daemon");
  cmd->add_option("--peer-timeout", o->peer_timeout_ms, "A client silent this many ms is dropped from the epoch (the server: the run fails)")
      ->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--epoch-timeout", o->epoch_timeout_s, "Seconds an epoch (training + evaluation) may take")
      ->capture_default_str()->check(flag_checks::positive());
  cmd->add_flag("--shutdown-daemons", o->shutdown_daemons, "Tell the daemons to exit at the end");
  cmd->callback([cmd, flags, o]() {
    refuse_misplaced_flags(*cmd);
    finish_train_flags(*flags);
    try {
      o->validate();
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
    // A --cut / --cut-back the model cannot take is a bad flag: refused before
    // anything listens (an unreadable model file stays a run failure).
    if (cmd->get_option("--cut")->count() > 0 || cmd->get_option("--cut-back")->count() > 0) {
      const ModelSpec spec = ModelSpec::load(flags->config.model_path);
      try {
        (void)make_split_layout(spec, o->cut, o->cut_back, o->labels == "client");
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    }
    prepare_coordinator(*o, "cleave split");
    nlohmann::json result = train_split(flags->config, *o);
    write_result_json(flags->json_path, result);
    std::printf("test_accuracy %.4f  epochs %d  clients %zu  labels %s%s  wall %.1f s\n",
                result["test_accuracy"].get<double>(), flags->config.epochs, result["clients"].get<size_t>(),
                result["labels"].get<std::string>().c_str(), o->splitfed ? "  splitfed" : "",
                result["wall_seconds"].get<double>());
  });
}

}  // namespace cleave
