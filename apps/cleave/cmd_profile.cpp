// cmd_profile.cpp: `cleave profile` — measure live daemons (per-layer times for
// a model, memory, encrypted link speed, declared bandwidth limits) and write
// them in the devices-file format that `cleave plan --devices` reads.
#include <cstdio>
#include <memory>

#include "apps/cleave/commands.h"
#include "apps/cleave/coordinator_flags.h"
#include "apps/cleave/train_flags.h"
#include "apps/flag_checks.h"
#include "core/runtime/coordinator/pipeline.h"

namespace cleave {

void add_profile_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("profile", "Profile N cleaved daemons and their links; write a devices file for `cleave plan`");
  auto cfg = std::make_shared<TrainConfig>();
  auto cl = std::make_shared<ClusterOptions>();
  auto json_path = std::make_shared<std::string>();
  cmd->add_option("--model", cfg->model_path, "Model whose layers are timed on each device")->required();
  cmd->add_option("--devices", cl->devices, "Daemons to wait for")->capture_default_str()->check(flag_checks::positive());
  add_coordinator_flags(*cmd, *cl, "device");
  cmd->add_option("--batch", cfg->batch, "Batch the profile is for")->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--microbatches", cfg->microbatches, "Micro-batches per batch (layers are timed at micro-batch size)")
      ->capture_default_str()
      ->check(flag_checks::positive());
  cmd->add_option("--schedule", cl->schedule, "Schedule the layers are timed for: gpipe | 1f1b | zb1 (each backward "
                                             "timed as its input gradient, then its weight gradient)")
      ->capture_default_str()->check(schedule_check());
  cmd->add_option("--dataset-dir", cfg->dataset_dir, "Unused: a profile reads no data (kept for old scripts)");
  cmd->add_option("--json", *json_path, "Write the devices file here (default: print it)");
  cmd->callback([cfg, cl, json_path]() {
    prepare_coordinator(*cl, "cleave profile");
    cfg->limit_train = 1;
    cfg->limit_test = 1;
    cl->profile_only = true;
    nlohmann::json out = train_pipeline(*cfg, *cl);
    if (json_path->empty()) {
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      write_result_json(*json_path, out);
      std::printf("wrote %s: %zu devices\n", json_path->c_str(), out["devices"].size());
    }
  });
}

}  // namespace cleave
