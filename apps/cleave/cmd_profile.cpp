// cmd_profile.cpp: `cleave profile` — measure live daemons (per-layer times for
// a model, memory, encrypted link speed, declared bandwidth limits) and write
// them in the devices-file format that `cleave plan --devices` reads.
#include <cstdio>
#include <memory>

#include "apps/cleave/commands.h"
#include "apps/cleave/train_flags.h"
#include "core/runtime/coordinator.h"
#include "core/runtime/processes.h"

namespace cleave {

void add_profile_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("profile", "Profile N cleaved daemons and their links; write a devices file for `cleave plan`");
  auto cfg = std::make_shared<TrainConfig>();
  auto cl = std::make_shared<ClusterOptions>();
  auto json_path = std::make_shared<std::string>();
  cmd->add_option("--model", cfg->model_path, "Model whose layers are timed on each device")->required();
  cmd->add_option("--devices", cl->devices, "Daemons to wait for")->capture_default_str();
  cmd->add_option("--key", cl->key_path, "The coordinator's secret key");
  cmd->add_option("--allow", cl->allow_path, "Directory of admitted device .pub files (or one key file)");
  cmd->add_option("--listen", cl->listen, "Where daemons dial in")->capture_default_str();
  cmd->add_option("--batch", cfg->batch, "Batch the profile is for")->capture_default_str();
  cmd->add_option("--microbatches", cfg->microbatches, "Micro-batches per batch (layers are timed at micro-batch size)")
      ->capture_default_str();
  cmd->add_option("--dataset-dir", cfg->dataset_dir, "Where Fashion-MNIST lives");
  cmd->add_option("--register-timeout", cl->register_timeout_ms, "ms to wait for the devices")->capture_default_str();
  cmd->add_option("--json", *json_path, "Write the devices file here (default: print it)");
  cmd->add_flag("--insecure", cl->insecure, "Plain TCP without CURVE (logs a warning)");
  cmd->callback([cfg, cl, json_path]() {
    if (!cl->insecure && (cl->key_path.empty() || cl->allow_path.empty()))
      throw CliError("cleave profile needs --key and --allow (or --insecure)");
    cfg->limit_train = 1;
    cfg->limit_test = 1;
    cl->profile_only = true;
    install_interrupt_handler();
    cl->interrupted = interrupted;
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
