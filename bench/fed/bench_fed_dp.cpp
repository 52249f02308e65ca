// bench_fed_dp: accuracy against epsilon for DP-FedAvg (issue 18). For each
// noise multiplier (0 = no differential privacy: plain FedAvg, no clipping)
// it starts real cleaved client daemons on loopback (CURVE keys, allow-list),
// each holding an IID shard of Fashion-MNIST, runs federated rounds with
// --dp-clip C and that noise multiplier, and reports the final epsilon (RDP
// accountant, core/fed/accountant.h) and test accuracy. No PyTorch is
// involved: the comparison is between noise levels of the same run.
//
// Usage: bench_fed_dp [--noise 0,0.5,1,2] [--clients 8] [--rounds 5] [--clip 0.5]
//                     [--fraction 1] [--delta 1e-5] [--samples-per-client 1000]
//                     [--model models/mlp.json] [--json bench-fed-dp.json]
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/common/bench_args.h"
#include "bench/common/local_daemons.h"
#include "core/io/json_file.h"
#include "core/runtime/coordinator/fed_coordinator.h"
#include "device/cpu/process_env.h"
#include "transport/log.h"

using namespace cleave;

namespace {

std::vector<double> parse_noise(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const double v = std::stod(item);
    if (!(v >= 0) || !std::isfinite(v)) throw std::invalid_argument("noise multipliers must be >= 0, got " + item);
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument("--noise needs at least one value");
  return out;
}

using cleave::bench::load_average;

struct Settings {
  std::string model;
  int clients = 8, rounds = 5;
  double clip = 0.5, fraction = 1, delta = 1e-5;
  int64_t per_client = 1000;
};

nlohmann::json run_one(const Settings& s, double z) {
  std::vector<std::string> names;
  for (int i = 0; i < s.clients; ++i) names.push_back("client" + std::to_string(i));
  bench::LocalDaemons daemons(names, std::string(CLEAVE_BUILD_DIR) + "/apps/cleaved/cleaved");
  TrainConfig cfg = bench::bench_run_config(s.model);
  cfg.threads = 1;
  FedOptions o;
  o.clients = s.clients;
  o.rounds = s.rounds;
  o.fraction = s.fraction;
  if (z > 0) {
    o.dp.clip = s.clip;
    o.dp.noise_multiplier = z;
    o.dp.delta = s.delta;
  }
  daemons.connect(o);
  o.on_listening = [&](const std::string& ep) {
    for (int i = 0; i < s.clients; ++i)
      daemons.start(names[static_cast<size_t>(i)], ep,
                    bench::LocalDaemons::data_client_flags(i, s.clients, s.per_client * s.clients));
  };
  const double load_before = load_average();
  const nlohmann::json r = train_federated(cfg, o);
  daemons.stop();
  nlohmann::json accuracy_per_round = nlohmann::json::array();
  for (const auto& rd : r["rounds"]) accuracy_per_round.push_back(rd["accuracy"]);
  return {{"noise_multiplier", z},
          {"dp", z > 0},
          {"epsilon", z > 0 ? r["epsilon"] : nlohmann::json()},  // null: no privacy bound
          {"test_accuracy", r["test_accuracy"]},
          {"test_loss", r["test_loss"]},
          {"accuracy_per_round", accuracy_per_round},
          {"wall_seconds", r["wall_seconds"]},
          {"load_average_before", load_before},
          {"load_average_after", load_average()}};
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  CLI::App app{"bench_fed_dp: DP-FedAvg accuracy against epsilon for several noise multipliers"};
  Settings s;
  s.model = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  std::string noise_text = "0,0.5,1,2", json_path;
  app.add_option("--noise", noise_text, "Noise multipliers to run (0: plain FedAvg, no DP)")->capture_default_str();
  app.add_option("--clients", s.clients, "Clients")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rounds", s.rounds, "Rounds per run")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--clip", s.clip, "--dp-clip C")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--fraction", s.fraction, "Share of clients sampled per round")->capture_default_str();
  app.add_option("--delta", s.delta, "--dp-delta")->capture_default_str();
  app.add_option("--samples-per-client", s.per_client, "Training samples each client holds")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--model", s.model, "Model JSON")->capture_default_str();
  app.add_option("--json", json_path, "Write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    transport::set_log_level(transport::LogLevel::kWarning);
    const std::vector<double> noise = parse_noise(noise_text);
    nlohmann::json results = nlohmann::json::array();
    std::printf("%-18s %-12s %-10s %-10s %-8s\n", "noise multiplier", "epsilon", "accuracy", "loss", "load");
    for (double z : noise) {
      const nlohmann::json row = run_one(s, z);
      results.push_back(row);
      const std::string eps = row["epsilon"].is_null() ? "inf (no DP)" : std::to_string(row["epsilon"].get<double>());
      std::printf("%-18g %-12s %-10.4f %-10.4f %-8.2f\n", z, eps.c_str(), row["test_accuracy"].get<double>(),
                  row["test_loss"].get<double>(), row["load_average_after"].get<double>());
      std::fflush(stdout);
    }
    nlohmann::json doc = {{"benchmark", "fed_dp"}, {"model", s.model}, {"clients", s.clients},
                          {"rounds", s.rounds}, {"clip", s.clip}, {"fraction", s.fraction},
                          {"delta", s.delta}, {"samples_per_client", s.per_client}, {"results", results}};
    write_json_file(json_path, doc);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fed_dp: error: %s\n", e.what());
    return 1;
  }
}
