// test_fed_privacy_run.h: one `cleave fed` run against real cleaved clients
// on loopback, for issue 18's integration tests (test_fed_byzantine.cpp,
// test_fed_privacy.cpp): N clients each holding shard i of N of the first
// --limit-train Fashion-MNIST samples, some of them started with extra
// cleaved flags (a --poison hook), the coordinator the real CLI.
#pragma once

#include <future>
#include <map>
#include <string>
#include <vector>

#include "apps/cli_util.h"
#include "integration/daemon_cluster.h"

namespace cleave::testing {

// Small enough for a round in well under a second on one core.
inline const char* const kPrivacyMlp = R"({"name": "small", "input": [1, 28, 28], "loss": "cross_entropy", "layers": [
  {"type": "flatten"}, {"type": "linear", "out_features": 32}, {"type": "relu"}, {"type": "linear", "out_features": 10}]})";

struct FedRun {
  int clients = 5;
  int64_t limit_train = 1500;                        // split over the clients
  std::string flags;                                  // cleave fed flags beyond the common ones
  std::map<int, std::vector<std::string>> client_extra;  // cleaved flags by device (1-based)
};

struct FedRunResult {
  cli_test::RunResult run;
  nlohmann::json json;  // empty when the run failed
};

// Runs `cleave fed --model MODEL --clients N ... FLAGS` with N cleaved clients; the JSON goes to `json_path`.
inline FedRunResult run_fed_clients(const std::string& model, const std::string& json_path, const FedRun& spec) {
  DaemonCluster cluster(spec.clients);
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_loopback_port());
  const std::string args = "fed --model '" + model + "' --json '" + json_path + "' --clients " +
                           std::to_string(spec.clients) + " --key '" + cluster.coordinator_key() + "' --allow '" +
                           cluster.allow() + "' --listen " + endpoint +
                           " --seed 5 --batch 32 --threads 1 --limit-test 500 --no-progress " + spec.flags;
  auto run = std::async(std::launch::async, [args] { return cli_test::run_cleave(args); });
  for (int i = 1; i <= spec.clients; ++i) {
    std::vector<std::string> f = {"--dataset", "fashion-mnist", "--shard",
                                  std::to_string(i - 1) + "/" + std::to_string(spec.clients), "--seed", "11",
                                  "--limit-train", std::to_string(spec.limit_train)};
    if (auto it = spec.client_extra.find(i); it != spec.client_extra.end())
      f.insert(f.end(), it->second.begin(), it->second.end());
    cluster.start(i, endpoint, f);
  }
  FedRunResult out;
  out.run = run.get();
  if (out.run.code == 0) out.json = cli_test::read_json(json_path);
  return out;
}

}  // namespace cleave::testing
