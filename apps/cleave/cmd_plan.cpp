// cmd_plan.cpp: `cleave plan` — plan a pipeline offline from a model file and a
// device / link description file (docs/planner.md); prints the table and
// optionally writes the plan as JSON.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "apps/cleave/commands.h"
#include "apps/cleave/train_flags.h"
#include "apps/flag_checks.h"
#include "core/model/model_spec.h"
#include "core/planner/devices_file.h"
#include "core/planner/plan_report.h"
#include "core/planner/planner.h"
#include "core/planner/profile.h"

namespace cleave {

namespace {

// `cleave train --devices N` takes a count, `cleave plan --devices` a file: a
// bare number with no such file is the other command's flag, said so (exit 2)
// instead of "2: cannot open devices file".
CLI::Validator devices_file_not_count() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        double n = 0;
        if (!flag_checks::read_number(in, n) || std::filesystem::exists(in)) return {};
        return "expected a devices file, got the count " + in +
               " (`cleave plan` plans for the devices a file describes: write one with `cleave profile --devices " +
               in + " --json devices.json`, or see docs/planner.md for its format)";
      },
      "FILE", "devices file");
}

}  // namespace

void add_plan_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("plan", "Plan which device runs which layers, offline, from a devices file");
  struct PlanFlags {
    std::string model, devices, json_path;
    std::string schedule = "1f1b", optimizer = "adam", encoding = "f32", recompute = "none";
    std::string microbatches = "4";  // a count or "auto"
    int max_stages = 0;
    int64_t batch = 64;
    double momentum = 0;
  };
  auto f = std::make_shared<PlanFlags>();
  cmd->add_option("--model", f->model, "Model JSON file")->required();
  cmd->add_option("--devices", f->devices, "Devices file: {\"devices\": [...], \"links\": [...], \"default_link\": {...}}")
      ->required()
      ->check(devices_file_not_count());
  cmd->add_option("--schedule", f->schedule, "gpipe | 1f1b | zb1")->capture_default_str()
      ->check(schedule_check());
  cmd->add_option("--microbatches", f->microbatches,
                  "Micro-batches per batch, or auto: the planner chooses the count with the fastest predicted batch "
                  "that fits")
      ->capture_default_str()
      ->check(microbatches_check());
  cmd->add_option("--batch", f->batch, "Samples per optimizer step")->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--optimizer", f->optimizer, "adam | sgd | adamw (sets the optimizer-state memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adam", "sgd", "adamw"}));
  cmd->add_option("--momentum", f->momentum, "SGD momentum (non-zero adds one state buffer)")->capture_default_str();
  cmd->add_option("--encoding", f->encoding, "f32 | f16 | int8: activations and gradients on links")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "int8"}));
  cmd->add_option("--recompute", f->recompute,
                  "none | all | auto: stages keep only their inputs and recompute activations in backward (auto: "
                  "only where a stage would not fit otherwise)")
      ->capture_default_str()
      ->check(flag_checks::parsed_by(parse_recompute, "none|all|auto"));
  cmd->add_option("--max-stages", f->max_stages, "At most this many stages (0: up to one per device)")
      ->capture_default_str()
      ->check(flag_checks::non_negative());
  cmd->add_option("--json", f->json_path, "Write the plan (with the per-layer profile) as JSON to this file");
  cmd->callback([f]() {
    const ModelSpec spec = ModelSpec::load(f->model);
    const Cluster cluster = load_cluster(f->devices);
    const ModelProfile profile = profile_model(spec, f->optimizer, f->momentum);
    PlanOptions options;
    options.schedule = parse_schedule(f->schedule);
    const std::optional<int> m = parse_microbatches(f->microbatches);  // checked by microbatches_check
    options.microbatches_auto = !m;
    options.microbatches = m.value_or(1);
    options.batch = f->batch;
    options.encoding = transport::parse_encoding(f->encoding);
    options.max_stages = f->max_stages;
    options.recompute = parse_recompute(f->recompute);
    Plan result;
    try {
      result = plan_microbatches(profile, cluster, options);
    } catch (const PlanError& e) {
      throw CliError(f->model + " on " + f->devices + ": " + e.what());
    }
    std::fputs(format_plan_table(result, profile).c_str(), stdout);
    if (!f->json_path.empty()) {
      std::ofstream out(f->json_path);
      nlohmann::json doc = to_json(result, profile);
      doc["model_file"] = f->model;
      doc["devices_file"] = f->devices;
      doc["devices"] = cluster_to_json(cluster);
      out << doc.dump(2) << "\n";
      if (!out) throw CliError("cannot write " + f->json_path);
      std::printf("plan written to %s\n", f->json_path.c_str());
    }
  });
}

}  // namespace cleave
