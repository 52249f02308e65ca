// cmd_fed.cpp: `cleave fed` — federated averaging across cleaved client
// daemons that each train on their own data (core/runtime/coordinator/fed_coordinator.h).
#include <cstdio>
#include <memory>

#include "apps/cleave/commands.h"
#include "apps/cleave/coordinator_flags.h"
#include "apps/cleave/run_record.h"
#include "apps/cleave/train_flags.h"
#include "apps/flag_checks.h"
#include "core/runtime/coordinator/fed_coordinator.h"
#include "core/train/checkpoint_dir.h"

namespace cleave {
namespace {

// Where the rounds start and where their checkpoints go: --save, --load,
// --init, --checkpoint-dir and --resume (whose directory it returns).
std::shared_ptr<std::string> add_checkpoint_flags(CLI::App& cmd, TrainFlags& flags, FedOptions& o) {
  cmd.add_option("--save", flags.config.save_path,
                 "Write the global weights here after every round, atomically (a federated checkpoint)");
  cmd.add_option("--load", flags.config.load_path,
                 "Resume from a checkpoint written by cleave fed --save (--rounds counts its rounds too)");
  cmd.add_option("--init", flags.config.init_path, "Start from weights in a safetensors file (PyTorch layout)");
  cmd.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Write each round's global weights here (step-ROUNDS.ckpt, the newest two kept) and the command "
                 "line (default: beside --save, or a new directory under $TMPDIR)");
  auto resume_dir = std::make_shared<std::string>();
  cmd.add_option("--resume", *resume_dir,
                 "Continue a stopped run from the newest valid checkpoint in its --checkpoint-dir, with the flags "
                 "it recorded there (flags given now replace them)");
  return resume_dir;
}

// Where the run's round checkpoints go (--checkpoint-dir, --resume's
// directory, or beside --save / a fresh temporary one), created; records the
// command line there for --resume. The default directory beside --save is
// this run's own: checkpoints a previous run left there are removed.
// Returns true when the directory is a temporary one of this run's (removed
// once it succeeds: there is nothing to resume then).
bool prepare_checkpoint_dir(CLI::App& cmd, const TrainFlags& flags, FedOptions& o, const std::string& resume_dir) {
  if (!resume_dir.empty())
    for (const char* name : {"--load", "--init"})
      if (cmd.get_option(name)->count() > 0)
        throw UsageError("--resume " + resume_dir + " continues from its newest checkpoint: give no " + name +
                         " with it (start a new run with " + name + " instead)");
  const bool given = cmd.get_option("--checkpoint-dir")->count() > 0;
  if (!resume_dir.empty()) {
    o.checkpoint_dir = resume_dir;  // --resume DIR wins over a --checkpoint-dir it recorded
    o.resume = true;
  } else if (!given) {
    o.checkpoint_dir = default_checkpoint_dir(flags.config.save_path, "cleave-fed");
  }
  try {
    const CheckpointDir dir(o.checkpoint_dir);
    if (!given && resume_dir.empty()) dir.remove_checkpoints();
  } catch (const std::exception& e) {
    throw UsageError(std::string(resume_dir.empty() ? "--checkpoint-dir " : "--resume ") + e.what());
  }
  record_run_command(o.checkpoint_dir, cmd);
  return !given && resume_dir.empty() && flags.config.save_path.empty();
}

void print_summary(const nlohmann::json& result) {
  std::printf("test_accuracy %.4f  rounds %zu  strategy %s  wall %.1f s", result["test_accuracy"].get<double>(),
              result["rounds"].size(), result["strategy"].get<std::string>().c_str(),
              result["wall_seconds"].get<double>());
  if (result.contains("epsilon"))
    std::printf("  epsilon %s (delta %g)%s", result["epsilon"].is_null() ? "inf" : std::to_string(result["epsilon"].get<double>()).c_str(),
                result["dp_delta"].get<double>(),
                result["stopped_reason"] == "dp_target_epsilon" ? ", stopped at --dp-target-epsilon" : "");
  std::printf("\n");
}

}  // namespace

void add_fed_command(CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "fed", "Federated averaging: cleaved clients train on their own data; only weights travel");
  auto flags = std::make_shared<TrainFlags>();
  add_train_flags(*cmd, *flags);
  auto o = std::make_shared<FedOptions>();
  cmd->add_option("--clients", o->clients, "Federated clients (cleaved --dataset ... --shard i/N) to wait for")
      ->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--rounds", o->rounds, "Federated rounds")->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--local-epochs", o->local_epochs, "Passes over its shard each client makes per round")
      ->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--fraction", o->fraction, "Share of the live clients sampled each round (seeded)")
      ->capture_default_str()->check(flag_checks::within(0, 1));
  cmd->add_option("--min-clients", o->min_clients, "Acceptable updates a round needs (K)")->capture_default_str()
      ->check(flag_checks::positive());
  cmd->add_option("--round-timeout", o->round_timeout_s, "Seconds after which a round closes with the updates it has")
      ->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--strategy", o->strategy, "fedavg | fedprox | median | trimmed-mean | krum | multi-krum")
      ->capture_default_str()->check(CLI::IsMember({"fedavg", "fedprox", "median", "trimmed-mean", "krum", "multi-krum"}));
  auto* mu = cmd->add_option("--mu", o->mu, "FedProx proximal weight (with --strategy fedprox)")->capture_default_str()
      ->check(flag_checks::non_negative());
  cmd->add_option("--trim", o->trim_fraction, "trimmed-mean: share cut from each end per coordinate")
      ->capture_default_str()->check(flag_checks::within(0, 0.5, /*hi_open=*/true));
  auto* krum_f = cmd->add_option("--krum-f", o->krum_f, "krum, multi-krum: Byzantine clients assumed per round (needs 2f + 3 sampled)")
      ->capture_default_str()->check(flag_checks::non_negative());
  auto* krum_m = cmd->add_option("--krum-m", o->krum_m, "multi-krum: updates averaged (0: the sampled clients less --krum-f)")
      ->capture_default_str()->check(flag_checks::non_negative());
  cmd->add_option("--dp-clip", o->dp.clip,
                  "Differential privacy (DP-FedAvg): clip each client's update to this L2 norm C (0: off)")
      ->capture_default_str()->check(flag_checks::non_negative());
  cmd->add_option("--dp-noise-multiplier", o->dp.noise_multiplier,
                  "Differential privacy: Gaussian noise of standard deviation z*C on the sum of the clipped updates")
      ->capture_default_str()->check(flag_checks::non_negative());
  cmd->add_option("--dp-delta", o->dp.delta, "Differential privacy: the delta epsilon is reported for")
      ->capture_default_str()->check(flag_checks::within(0, 1, /*hi_open=*/true));
  cmd->add_option("--dp-target-epsilon", o->dp.target_epsilon,
                  "Differential privacy: stop before the round that would spend more than this epsilon (0: none)")
      ->capture_default_str()->check(flag_checks::non_negative());
  cmd->add_option("--max-client-samples", o->max_client_samples,
                  "Most samples one client's update may count per local epoch (0: only its registered shard size)")
      ->capture_default_str()->check(flag_checks::non_negative());
  cmd->add_option("--max-update-norm", o->max_update_norm,
                  "Clip every client update to this L2 distance from the global weights (0: off)")
      ->capture_default_str()->check(flag_checks::non_negative());
  cmd->add_flag("--secure-aggregation", o->secure_aggregation,
                "Secure aggregation (SecAgg): clients mask their updates pairwise so the coordinator learns only "
                "their sum (fedavg, fedprox; docs/privacy.md)");
  auto* t = cmd->add_option("--secagg-threshold", o->secagg_threshold,
                            "Secure aggregation: shares that recover a dropped client's mask (0: a majority of the "
                            "sampled clients, at least 2)")
      ->capture_default_str()->check(flag_checks::non_negative());
  auto* range = cmd->add_option("--secagg-range", o->secagg_range,
                                "Secure aggregation: each coordinate of an update is clamped to [-R, R] before "
                                "fixed-point encoding")
      ->capture_default_str()->check(flag_checks::positive());
  auto* bits = cmd->add_option("--secagg-bits", o->secagg_bits,
                               "Secure aggregation: fractional bits of the fixed-point encoding (error per "
                               "coordinate at most 2^-(bits+1))")
      ->capture_default_str()->check(CLI::Range(1, 40));
  add_coordinator_flags(*cmd, *o, "client");
  cmd->add_option("--peer-timeout", o->peer_timeout_ms, "A client silent this many ms is dropped")
      ->capture_default_str()->check(flag_checks::positive());
  cmd->add_flag("--shutdown-clients", o->shutdown_clients, "Tell the clients to exit at the end");
  auto resume_dir = add_checkpoint_flags(*cmd, *flags, *o);
  cmd->callback([cmd, flags, o, mu, krum_f, krum_m, t, range, bits, resume_dir]() {
    // Flags of `cleave train` that mean nothing here: the clients own the training data.
    for (const char* name : {"--epochs", "--limit-train", "--max-steps", "--microbatches", "--text"})
      if (cmd->get_option(name)->count() > 0)
        throw UsageError(std::string(name) + " does not apply to cleave fed: use --rounds/--local-epochs, and "
                       "give clients their data with cleaved --dataset/--shard/--limit-train");
    finish_train_flags(*flags);
    if (mu->count() > 0 && o->strategy != "fedprox")
      throw UsageError("--mu applies to --strategy fedprox only");
    if (krum_f->count() > 0 && o->strategy != "krum" && o->strategy != "multi-krum")
      throw UsageError("--krum-f applies to --strategy krum and multi-krum only");
    for (const CLI::Option* opt : {t, range, bits})
      if (opt->count() > 0 && !o->secure_aggregation)
        throw UsageError(opt->get_name() + " applies with --secure-aggregation only");
    if (krum_m->count() > 0 && o->strategy != "multi-krum")
      throw UsageError("--krum-m applies to --strategy multi-krum only (krum keeps one update)");
    try {
      o->validate();
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
    prepare_coordinator(*o, "cleave fed");
    o->checkpoint_dir_temporary = prepare_checkpoint_dir(*cmd, *flags, *o, *resume_dir);
    const nlohmann::json result = train_federated(flags->config, *o);
    write_result_json(flags->json_path, result);
    print_summary(result);
  });
}

}  // namespace cleave
