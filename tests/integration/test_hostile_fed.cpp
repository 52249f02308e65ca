// test_hostile_fed.cpp: issue 13, findings 3 and 5 (and the round numbering
// of finding 9), each against a real `cleave fed` / `cleave split`
// coordinator process, real cleaved clients and crafted clients
// (crafted_fed_client.h) on loopback:
//   - an update claiming 10^12 samples with -50x the global weights is
//     refused (more than its registration allows, or than
//     --max-client-samples), counted in "refused_messages", and the run's
//     accuracy matches the honest clients' alone;
//   - --max-update-norm clips a scaled update, counted per round;
//   - a trimmed mean that would trim nothing is refused before it listens;
//   - "shard": 7 and details nested 50,000 deep are refused registrations:
//     cleave fed and cleave split train with the honest clients, and the
//     --json output stays small;
//   - a model file nested 100,000 deep is a clear error for cleave train,
//     cleave plan and a daemon's assignment, not a crash.
#include <catch2/catch.hpp>

#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "apps/cli_util.h"
#include "core/runtime/common/wire.h"
#include "integration/crafted_fed_client.h"
#include "integration/daemon_cluster.h"
#include "skip.h"

using namespace cleave;
using namespace cleave::cli_test;
using cleave::testing::CraftedBehaviour;
using cleave::testing::CraftedFedClient;
using cleave::testing::DaemonCluster;

namespace {

// Small enough for a round in well under a second on one core.
const char* const kSmallMlp = R"({"name": "small", "input": [1, 28, 28], "loss": "cross_entropy", "layers": [
  {"type": "flatten"}, {"type": "linear", "out_features": 32}, {"type": "relu"}, {"type": "linear", "out_features": 10}]})";

constexpr int64_t kLimit = 1500;  // training samples split over 3 shards: 500 each

std::vector<std::string> shard_flags(int shard, int shards) {
  return {"--dataset", "fashion-mnist", "--shard", std::to_string(shard) + "/" + std::to_string(shards), "--seed", "11",
          "--limit-train", std::to_string(kLimit)};
}

std::string details(const std::string& extra) {
  return R"({"fed_client": true, "samples": 500, "partition": "iid", "dataset": "fashion-mnist")" + extra + "}";
}

struct Coordinator {
  std::string endpoint = "tcp://127.0.0.1:" + std::to_string(testing::free_loopback_port());
  std::string args;  // for messages
  std::future<RunResult> run;
  // Starts `cleave COMMAND` listening on `endpoint` with the cluster's keys.
  Coordinator(const DaemonCluster& cluster, const std::string& command) {
    args = command + " --key '" + cluster.coordinator_key() + "' --allow '" + cluster.allow() + "' --listen " +
           endpoint + " --seed 5 --batch 32 --threads 1 --no-progress";
    run = std::async(std::launch::async, [a = args] { return run_cleave(a); });
  }
};

// Waits until the crafted client has registered (so its registration comes before the honest ones).
void await_registered(const CraftedFedClient& c) {
  for (int i = 0; i < 300 && !c.registered(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(c.registered());
}

nlohmann::json run_fed(const std::string& model, const std::string& json_path, const std::string& extra,
                       int honest, const std::vector<CraftedBehaviour>& crafted, std::string* output = nullptr) {
  DaemonCluster cluster(honest + static_cast<int>(crafted.size()));
  Coordinator co(cluster, "fed --model '" + model + "' --json '" + json_path + "' --limit-test 500 " + extra);
  std::vector<std::unique_ptr<CraftedFedClient>> liars;
  for (size_t i = 0; i < crafted.size(); ++i) {
    liars.push_back(std::make_unique<CraftedFedClient>(cluster, honest + 1 + static_cast<int>(i), co.endpoint, crafted[i]));
    await_registered(*liars.back());
  }
  for (int i = 1; i <= honest; ++i) cluster.start(i, co.endpoint, shard_flags(i - 1, 3));
  const RunResult r = co.run.get();
  INFO("cleave " << co.args << "\n" << r.output << "\ndev1 log:\n" << cluster.log(1));
  REQUIRE(r.code == 0);
  if (output) *output = r.output;
  return read_json(json_path);
}

}  // namespace

TEST_CASE("fed: inflated sample counts are refused and a scaled update is clipped", "[integration][fed][hostile]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  const std::string model = dir.file("small.json");
  write_text(model, kSmallMlp);
  const std::string rounds = "--rounds 2 --min-clients 2 ";

  // The honest clients alone: what the run should look like.
  const nlohmann::json honest = run_fed(model, dir.file("honest.json"), rounds + "--clients 2", 2, {});
  const double honest_acc = honest["test_accuracy"].get<double>();
  CHECK(honest["refused_messages"].empty());

  // dev3 registers 500 samples and claims 10^12; dev4 registers 10^12 and meets --max-client-samples.
  const CraftedBehaviour liar{details(R"(, "shard": "2/3")"), 1'000'000'000'000, -50.f};
  const CraftedBehaviour big_liar{R"({"fed_client": true, "samples": 1000000000000, "shard": "2/3"})",
                                  1'000'000'000'000, -50.f};
  std::string log;
  const nlohmann::json attacked = run_fed(model, dir.file("attacked.json"),
                                          rounds + "--clients 4 --max-client-samples 600", 2, {liar, big_liar}, &log);
  INFO(attacked.dump(1));
  CHECK(attacked["refused_messages"]["sample_count_exceeds_registered"] == 2);  // dev3, both rounds
  CHECK(attacked["refused_messages"]["sample_count_exceeds_cap"] == 2);         // dev4, both rounds
  for (const auto& rd : attacked["rounds"]) {
    CHECK(rd["participating"] == nlohmann::json({"dev1", "dev2"}));
    CHECK(rd["rejected_count"] == 2);
  }
  CHECK_THAT(log, Catch::Contains("sample_count_exceeds_registered"));
  // Not derailed: the refused updates never reached the average (FedAvg of the same honest updates).
  CHECK(attacked["test_accuracy"].get<double>() >= honest_acc - 0.02);
  CHECK(attacked["test_accuracy"].get<double>() > 0.2);  // well above chance (0.10)

  // An honest-looking count with -50x the weights: --max-update-norm clips it, every round.
  const CraftedBehaviour scaled{details(R"(, "shard": "2/3")"), 500, -50.f};
  const nlohmann::json clipped =
      run_fed(model, dir.file("clipped.json"), rounds + "--clients 3 --max-update-norm 2", 2, {scaled});
  INFO(clipped.dump(1));
  CHECK(clipped["max_update_norm"] == 2.0);
  for (const auto& rd : clipped["rounds"]) {
    CHECK(rd["clipped_count"].get<int>() >= 1);
    CHECK_THAT(rd["clipped"].dump(), Catch::Contains("dev3"));
  }
  CHECK(clipped["clipped_updates"].get<int>() >= 2);
  CHECK(clipped["refused_messages"].empty());  // clipped, not refused
}

TEST_CASE("fed: a trimmed mean that would trim nothing is refused before it listens", "[integration][fed][hostile]") {
  // The finding: trim 0.1 with 3 clients is floor(0.3) = 0, silently a plain mean.
  const RunResult r = run_cleave("fed --model '" + kMlp + "' --insecure --strategy trimmed-mean --clients 3");
  INFO(r.output);
  require_exit(r, kExitUsage, {"trims nothing", "needs at least 10 clients", "3 clients need --trim 0.334"});
  const RunResult ok = run_cleave("fed --model '" + kMlp + "' --insecure --strategy trimmed-mean --clients 3 --trim 0.34 "
                                  "--register-timeout 200 --no-progress");
  INFO(ok.output);
  CHECK(ok.output.find("trims nothing") == std::string::npos);  // it got as far as waiting for clients
  CHECK_THAT(ok.output, Catch::Contains("federated clients registered within"));
}

TEST_CASE("fed: mistyped and deeply nested registration details are refused, the run goes on", "[integration][fed][hostile]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  const std::string model = dir.file("small.json");
  write_text(model, kSmallMlp);
  std::string deep = details(R"(, "shard": "2/3", "x": )");
  deep.pop_back();
  deep += std::string(50000, '[') + std::string(50000, ']') + "}";
  std::string log;
  const std::string json_path = dir.file("fed.json");
  const nlohmann::json r = run_fed(model, json_path, "--rounds 1 --clients 2", 2,
                                   {CraftedBehaviour{details(R"(, "shard": 7)")}, CraftedBehaviour{deep}}, &log);
  INFO(r.dump(1));
  CHECK(r["refused_messages"]["registration_details_invalid"] == 2);
  CHECK_THAT(log, Catch::Contains("client dev3: registration details: \"shard\" must be a string like \"1/3\", got a number"));
  CHECK_THAT(log, Catch::Contains("client dev4: registration details:"));
  CHECK(r["rounds"].size() == 1);
  CHECK(r["rounds"][0]["participating"] == nlohmann::json({"dev1", "dev2"}));
  CHECK(std::filesystem::file_size(json_path) < 256 * 1024);  // the finding: 5 GB
}

TEST_CASE("split: a registration with \"shard\": 7 is refused and the run trains with the honest client",
          "[integration][split][hostile]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  const std::string model = dir.file("small.json");
  write_text(model, kSmallMlp);
  DaemonCluster cluster(3);
  Coordinator co(cluster, "split --model '" + model + "' --clients 1 --epochs 1 --limit-test 200 --json '" +
                              dir.file("split.json") + "'");
  CraftedFedClient liar(cluster, 3, co.endpoint, CraftedBehaviour{details(R"(, "shard": 7)")});
  await_registered(liar);
  cluster.start(1, co.endpoint, shard_flags(0, 3));
  cluster.start(2, co.endpoint);  // the server: no data
  const RunResult r = co.run.get();
  INFO(r.output << "\ndev1 log:\n" << cluster.log(1));
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("dev3: registration details: \"shard\" must be a string like \"1/3\", got a number"));
  const nlohmann::json j = read_json(dir.file("split.json"));
  CHECK(j["refused_messages"]["registration_details_invalid"] == 1);
  CHECK(j["server"] == "dev2");
  CHECK(j["clients"] == 1);
}

TEST_CASE("a model file nested 100,000 deep is a clear error, not a crash", "[integration][hostile]") {
  TempDir dir;
  const std::string deep = dir.file("deep.json");
  const std::string text = "{\"input\": [1], \"layers\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  write_text(deep, text);
  const std::string devices = dir.file("devices.json");
  write_text(devices, R"({"devices": [{"name": "a", "memory": "1G", "gflops": 10}]})");
  for (const std::string& args : {"train --local --model '" + deep + "' --limit-train 64 --no-progress",
                                  "plan --model '" + deep + "' --devices '" + devices + "'"}) {
    const RunResult r = run_cleave(args);
    INFO("cleave " << args << "\n" << r.output);
    require_exit(r, kExitFailure, {deep, "nested more than 64 deep"});
  }
  // The same text as a daemon's assignment: refused with the same words.
  CHECK_THROWS_WITH(parse_model_text(text, "assigned model"),
                    Catch::StartsWith("assigned model: ") && Catch::Contains("nested more than 64 deep"));
}
