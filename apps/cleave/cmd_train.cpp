// cmd_train.cpp: `cleave train` — local training (--local) or a coordinator
// driving a pipeline of cleaved daemons.
#include <cstdio>
#include <memory>

#include "apps/cleave/commands.h"
#include "apps/cleave/coordinator_flags.h"
#include "apps/cleave/run_record.h"
#include "apps/cleave/train_flags.h"
#include "apps/flag_checks.h"
#include "core/planner/memory_model.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"

namespace cleave {

void add_train_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("train", "Train a model: in this process (--local) or across cleaved daemons");
  auto flags = std::make_shared<TrainFlags>();
  auto local = std::make_shared<bool>(false);
  cmd->add_flag("--local", *local, "Train in this process, on this machine's device");
  add_train_flags(*cmd, *flags);
  cmd->add_option("--save", flags->config.save_path, "Write a checkpoint (weights + optimizer state) here, atomically");
  cmd->add_option("--save-every", flags->config.save_every, "Also checkpoint every N steps")
      ->check(flag_checks::positive());
  cmd->add_option("--load", flags->config.load_path, "Resume from a checkpoint written by --save");
  cmd->add_option("--init", flags->config.init_path, "Start from weights in a safetensors file (PyTorch layout)");
  auto cluster = std::make_shared<ClusterOptions>();
  cmd->add_option("--devices", cluster->devices, "Pipeline: number of cleaved daemons to wait for")->capture_default_str()
      ->check(flag_checks::positive());
  add_coordinator_flags(*cmd, *cluster, "device", "Pipeline: ");
  cmd->add_option("--schedule", cluster->schedule, "Pipeline: gpipe | 1f1b | zb1 (zero bubble)")
      ->capture_default_str()->check(schedule_check());
  cmd->add_option("--encoding", cluster->encoding, "Pipeline: activations/gradients on peer links: f32 | f16 | int8")
      ->capture_default_str()->check(CLI::IsMember({"f32", "f16", "int8"}));
  cmd->add_option("--trace", cluster->trace_path, "Pipeline: write a Chrome trace (Perfetto / chrome://tracing) here");
  cmd->add_option("--peer-timeout", cluster->peer_timeout_ms, "Pipeline: a device silent this many ms is declared dead")
      ->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--recompute", cluster->recompute,
                  "Pipeline: none | all (every stage keeps only its inputs and recomputes activations in backward) | "
                  "auto (only stages that would not fit otherwise)")
      ->capture_default_str()->check(flag_checks::parsed_by(parse_recompute, "none|all|auto"));
  cmd->add_option("--planner", cluster->planner,
                  "Pipeline: auto (profile devices and links, plan stages) | balance (even split over all devices)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "balance"}));
  auto resume = std::make_shared<std::string>();
  cmd->add_option("--checkpoint-dir", cluster->checkpoint_dir,
                  "Pipeline: keep the newest two checkpoints here, to recover from a lost device and to --resume "
                  "(default: SAVE.checkpoints beside --save, else a temporary directory)");
  cmd->add_option("--checkpoint-every", cluster->checkpoint_every,
                  "Pipeline: steps between checkpoints (default: one per epoch)")->check(flag_checks::positive());
  cmd->add_option("--max-recoveries", cluster->max_recoveries,
                  "Pipeline: lost devices the run re-plans around before it stops")->capture_default_str()
      ->check(flag_checks::non_negative());
  cmd->add_option("--resume", *resume,
                  "Pipeline: restart a stopped run from the newest valid checkpoint in this --checkpoint-dir, "
                  "with the flags it recorded there (flags given now replace them)");
  cmd->callback([cmd, flags, local, cluster, resume]() {
    finish_train_flags(*flags);
    require_writable("--trace", cluster->trace_path);
    nlohmann::json result;
    if (*local) {
      for (const char* f : {"--checkpoint-dir", "--checkpoint-every", "--max-recoveries", "--resume", "--recompute"})
        if (cmd->count(f) > 0) throw UsageError(std::string(f) + " is for pipeline training: drop --local");
      if (flags->microbatches_auto)
        throw UsageError("--microbatches auto lets the pipeline planner choose: with --local give a number (e.g. "
                         "--microbatches 1)");
      result = train_local(flags->config);
    } else {
      if (flags->microbatches_auto && cluster->planner != "auto")
        throw UsageError("--microbatches auto needs --planner auto (the planner chooses the count from the measured "
                         "devices): drop --planner " + cluster->planner + " or give a number");
      cluster->microbatches_auto = flags->microbatches_auto;
      prepare_coordinator(*cluster, "pipeline training", "; for one process pass --local");
      if (!resume->empty()) {
        if (!flags->config.load_path.empty() || !flags->config.init_path.empty())
          throw UsageError("--resume starts from the run's newest checkpoint: drop --load and --init");
        cluster->checkpoint_dir = *resume;
        cluster->resume = true;
      }
      resolve_checkpoint_dir(*cluster, flags->config);
      record_run_command(cluster->checkpoint_dir, *cmd);
      result = train_pipeline(flags->config, *cluster);
    }
    write_result_json(flags->json_path, result);
    if (result.contains("val_loss"))
      std::printf("val_loss %.4f  val_bits_per_byte %.4f  samples/s %.1f  wall %.1f s\n",
                  result["val_loss"].get<double>(), result["val_bits_per_byte"].get<double>(),
                  result["samples_per_sec"].get<double>(), result["wall_seconds"].get<double>());
    else
      std::printf("test_accuracy %.4f  samples/s %.1f  wall %.1f s\n", result["test_accuracy"].get<double>(),
                  result["samples_per_sec"].get<double>(), result["wall_seconds"].get<double>());
  });
}

}  // namespace cleave
