// bench_fed: time per federated round and bytes per round against the number
// of clients (issue 7). For each client count it starts that many real cleaved
// client daemons on loopback (CURVE keys, allow-list), each holding a small IID
// shard of the same size, runs FedAvg for a few rounds and reports the mean
// round time and the bytes sent down (global weights to the sampled clients)
// and up (their updates) per round, measured on the coordinator's endpoint.
//
// Usage: bench_fed [--clients 2,4,8] [--model models/mlp.json] [--rounds 3]
//                  [--samples-per-client 512] [--json bench-fed.json]
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "device/cpu/process_env.h"
#include "bench/common/local_daemons.h"
#include "core/io/json_file.h"
#include "core/runtime/coordinator/fed_coordinator.h"
#include "transport/log.h"

using namespace cleave;

namespace {

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int v = std::stoi(item);
    if (v < 1 || v > 64) throw std::invalid_argument("client counts must be in [1, 64], got " + item);
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument("--clients needs at least one count");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  CLI::App app{"bench_fed: federated round time and bytes per round vs clients"};
  std::string clients_text = "2,4,8", model = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json", json_path;
  int rounds = 3;
  int64_t per_client = 512;
  app.add_option("--clients", clients_text, "Client counts to run")->capture_default_str();
  app.add_option("--model", model, "Model JSON")->capture_default_str();
  app.add_option("--rounds", rounds, "Rounds per run")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--samples-per-client", per_client, "Training samples each client holds")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "Write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    transport::set_log_level(transport::LogLevel::kWarning);
    const std::vector<int> counts = parse_list(clients_text);
    const std::string cleaved = std::string(CLEAVE_BUILD_DIR) + "/apps/cleaved/cleaved";
    nlohmann::json results = nlohmann::json::array();
    std::printf("%-8s %-8s %-14s %-16s %-16s %-10s\n", "clients", "rounds", "s/round", "MB down/round",
                "MB up/round", "accuracy");
    for (int n : counts) {
      std::vector<std::string> names;
      for (int i = 0; i < n; ++i) names.push_back("client" + std::to_string(i));
      bench::LocalDaemons daemons(names, cleaved);
      TrainConfig cfg = bench::bench_run_config(model);
      cfg.threads = 1;
      FedOptions o;
      o.clients = n;
      o.rounds = rounds;
      o.min_clients = n;
      daemons.connect(o);
      o.on_listening = [&](const std::string& ep) {
        for (int i = 0; i < n; ++i)
          daemons.start(names[static_cast<size_t>(i)], ep, bench::LocalDaemons::data_client_flags(i, n, per_client * n));
      };
      const nlohmann::json r = train_federated(cfg, o);
      daemons.stop();
      double secs = 0, down = 0, up = 0;
      for (const auto& rd : r["rounds"]) {
        secs += rd["seconds"].get<double>();
        down += rd["bytes_down"].get<double>();
        up += rd["bytes_up"].get<double>();
      }
      const double k = static_cast<double>(r["rounds"].size());
      nlohmann::json row = {{"clients", n},
                            {"rounds", r["rounds"].size()},
                            {"seconds_per_round", secs / k},
                            {"bytes_down_per_round", down / k},
                            {"bytes_up_per_round", up / k},
                            {"parameters", r["parameters"]},
                            {"samples_per_client", per_client},
                            {"test_accuracy", r["test_accuracy"]}};
      results.push_back(row);
      std::printf("%-8d %-8d %-14.3f %-16.2f %-16.2f %-10.4f\n", n, rounds, secs / k, down / k / 1e6, up / k / 1e6,
                  r["test_accuracy"].get<double>());
      std::fflush(stdout);
    }
    nlohmann::json doc = {{"benchmark", "fed"}, {"model", model}, {"results", results}};
    write_json_file(json_path, doc);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fed: error: %s\n", e.what());
    return 1;
  }
}
