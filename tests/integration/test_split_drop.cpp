// test_split_drop.cpp: issue 15, split part, with real cleaved processes over
// CURVE: a split client SIGKILLed in the middle of epoch 1 of 3 is dropped
// from that epoch, not fatal: the run finishes, the JSON records the drop and
// the steps it missed, the SplitFed average of epoch 1 is over the two
// clients that finished it, and the client, started again, rejoins at epoch
// 2. A client that falls silent (SIGSTOP) is dropped after --peer-timeout
// and, woken, ends its job and rejoins; without SplitFed it restarts from the
// initial weights and no client-side weights ever leave a client. The server
// killed instead fails the run clearly within seconds.
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime/coordinator/split_coordinator.h"
#include "integration/daemon_cluster.h"
#include "integration/test_run.h"
#include "skip.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kClients = 3;
constexpr int64_t kLimitTrain = 2880;  // 960 samples per client: 15 batches of 64 per epoch
constexpr int64_t kLimitTest = 300;

// The MLP, 3 epochs, vanilla labels (the server reports each batch once the
// client has its gradient, so "steps" counts exactly the batches served).
TrainConfig drop_config() {
  TrainConfig c = cleave::testing::test_run("models/mlp.json", 64, 5);
  c.epochs = 3;
  c.limit_test = kLimitTest;
  return c;
}

// cleaved flags of client i (0-based) of kClients.
std::vector<std::string> client_flags(int i) {
  return {"--dataset", "fashion-mnist", "--shard", std::to_string(i) + "/" + std::to_string(kClients),
          "--seed", "11", "--limit-train", std::to_string(kLimitTrain)};
}

// dev1 is the server, dev2..dev4 the clients (indices 0..2 by name).
struct DropCluster {
  DaemonCluster cluster{kClients + 1};
  std::mutex mu;
  std::string endpoint;
  std::vector<pid_t> pids{std::vector<pid_t>(kClients + 2, 0)};  // by daemon number

  // `last_client_extra`: more cleaved flags for dev4.
  SplitOptions options(bool splitfed, std::vector<std::string> last_client_extra = {}) {
    SplitOptions o;
    o.clients = kClients;
    cluster.connect(o);
    o.epoch_timeout_s = 300;
    o.peer_timeout_ms = 3000;
    o.splitfed = splitfed;
    o.on_listening = [this, last_client_extra](const std::string& ep) {
      std::lock_guard lock(mu);
      endpoint = ep;
      pids[1] = cluster.start(1, ep);
      for (int i = 0; i < kClients; ++i) {
        std::vector<std::string> flags = client_flags(i);
        if (i == kClients - 1) flags.insert(flags.end(), last_client_extra.begin(), last_client_extra.end());
        // Two clients are slowed down (15 batches of 256 KiB activations at 1 MB/s: 4 s an epoch), so that the
        // last can be killed inside epoch 1 and, started again, register before epoch 2 begins.
        if (i >= 1) flags.insert(flags.end(), {"--bandwidth-limit", "1MB/s"});
        pids[static_cast<size_t>(i + 2)] = cluster.start(i + 2, ep, flags);
      }
    };
    return o;
  }

  // Waits until every client has built its part ("split client I: layers ..."
  // in its log): epoch 1 starts right after. False after 60 s, and
  // require_clients_came() then fails the case.
  bool wait_for_clients() {
    const auto t0 = Clock::now();
    for (int i = 0; i < kClients; ++i)
      while (cluster.log(i + 2).find("split client " + std::to_string(i)) == std::string::npos) {
        if (Clock::now() - t0 > std::chrono::seconds(60)) {
          clients_never_came = true;
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    return true;
  }

  // On the test's thread, once the thread that waited has joined: the case
  // fails, saying so, when the clients never built their parts (the thread
  // then did nothing to them).
  void require_clients_came() const {
    INFO("the split clients did not build their parts within 60 s; dev2's log:\n" << cluster.log(2));
    REQUIRE(!clients_never_came);
  }

  std::atomic<bool> clients_never_came{false};
};

std::set<std::string> keys_of(const nlohmann::json& obj) {
  std::set<std::string> out;
  for (auto it = obj.begin(); it != obj.end(); ++it) out.insert(it.key());
  return out;
}

}  // namespace

TEST_CASE("split learning: a client killed mid-epoch is dropped, left out of the SplitFed average, and rejoins at "
          "the next epoch", "[integration][split][slow]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DropCluster dc;
  SplitOptions o = dc.options(/*splitfed=*/true);
  std::atomic<bool> killed{false}, restarted{false}, run_over{false};
  std::thread killer([&] {
    // dev4's epoch 1 (15 throttled batches) takes several seconds: kill it part-way.
    // Early in it, so that its restart has most of the epoch to register in.
    if (!dc.wait_for_clients()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::lock_guard lock(dc.mu);
    kill(dc.pids[4], SIGKILL);
    killed = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    dc.pids[4] = dc.cluster.start(4, dc.endpoint, client_flags(2));  // the same client, unthrottled
    restarted = true;
    // A child started here gets SIGTERM when this thread ends (spawn's PR_SET_PDEATHSIG): outlive the run.
    while (!run_over) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  nlohmann::json r;
  try {
    r = train_split(drop_config(), o);
  } catch (...) {
    run_over = true;
    killer.join();
    throw;
  }
  run_over = true;
  killer.join();
  dc.require_clients_came();
  REQUIRE(killed);
  REQUIRE(restarted);
  INFO(r.dump(1).substr(0, 6000));
  REQUIRE(r["rounds"].size() == 3);
  const int64_t batches = kLimitTrain / kClients / 64;

  // Epoch 1: dev4 dropped with a reason, part-way through its shard.
  const nlohmann::json& e1 = r["rounds"][0];
  REQUIRE(e1["dropped"].size() == 1);
  const nlohmann::json& d = e1["dropped"][0];
  CHECK(d["client"] == "dev4");
  CHECK(d["phase"] == "epoch 1 training");
  CHECK(!d["reason"].get<std::string>().empty());
  const int64_t step = d["step"].get<int64_t>(), missed = d["missed_steps"].get<int64_t>();
  CHECK(step >= 0);
  CHECK(missed > 0);
  CHECK(step + missed == batches);
  // The epoch went on: the others' batches plus what dev4 got through, each served exactly once.
  CHECK(e1["steps"].get<int64_t>() == (kClients - 1) * batches + step);
  // SplitFed averaged only the two clients that finished the epoch, each over its whole shard.
  CHECK(keys_of(e1["splitfed_samples"]) == std::set<std::string>{"dev2", "dev3"});
  for (const auto& [name, samples] : e1["splitfed_samples"].items()) CHECK(samples == kLimitTrain / kClients);
  // Evaluation used the clients still there.
  CHECK(keys_of(e1["per_client"]) == std::set<std::string>{"dev2", "dev3"});
  CHECK(e1["rejoined"].empty());

  // Epoch 2: the restarted dev4 is back, from the averaged blocks, and trains its whole shard again.
  const nlohmann::json& e2 = r["rounds"][1];
  CHECK(e2["rejoined"] == nlohmann::json::array({"dev4"}));
  CHECK(e2["dropped"].empty());
  CHECK(e2["steps"].get<int64_t>() == kClients * batches);
  CHECK(keys_of(e2["splitfed_samples"]) == std::set<std::string>{"dev2", "dev3", "dev4"});
  CHECK(keys_of(e2["per_client"]) == std::set<std::string>{"dev2", "dev3", "dev4"});
  CHECK(r["rejoin_weights"] == "averaged");
  const nlohmann::json& e3 = r["rounds"][2];
  CHECK(e3["dropped"].empty());
  CHECK(e3["rejoined"].empty());
  CHECK(r["steps"].get<int64_t>() == e1["steps"].get<int64_t>() + 2 * kClients * batches);
  CHECK(r["test_accuracy"].get<double>() > 0.5);  // it still learns
}

TEST_CASE("split learning: a client that falls silent is dropped after --peer-timeout, and rejoins once awake",
          "[integration][split][slow]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DropCluster dc;
  // Its job ends when it wakes (the coordinator sent it Finish): it must serve a second one.
  SplitOptions o = dc.options(/*splitfed=*/false, {"--max-jobs", "2"});
  o.labels = "client";  // U-shaped: the client-side layers are front and tail
  o.peer_timeout_ms = 2000;
  std::atomic<bool> stopped{false};
  std::thread sleeper([&] {
    if (!dc.wait_for_clients()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    std::lock_guard lock(dc.mu);
    kill(dc.pids[4], SIGSTOP);
    stopped = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // past --peer-timeout: dropped by now
    kill(dc.pids[4], SIGCONT);
  });
  nlohmann::json r;
  try {
    r = train_split(drop_config(), o);
  } catch (...) {
    sleeper.join();
    throw;
  }
  sleeper.join();
  dc.require_clients_came();
  REQUIRE(stopped);
  INFO(r.dump(1).substr(0, 6000));
  REQUIRE(r["rounds"].size() == 3);
  const nlohmann::json& e1 = r["rounds"][0];
  REQUIRE(e1["dropped"].size() == 1);
  CHECK(e1["dropped"][0]["client"] == "dev4");
  CHECK(e1["dropped"][0]["reason"].get<std::string>().find("stopped responding") != std::string::npos);
  CHECK(e1["dropped"][0]["missed_steps"].get<int64_t>() > 0);
  CHECK(keys_of(e1["per_client"]) == std::set<std::string>{"dev2", "dev3"});
  CHECK(r["rounds"][1]["rejoined"] == nlohmann::json::array({"dev4"}));
  CHECK(keys_of(r["rounds"][1]["per_client"]) == std::set<std::string>{"dev2", "dev3", "dev4"});
  CHECK(r["rejoin_weights"] == "initial");
  // Without SplitFed no client ever sent the coordinator weights, the drop and rejoin included.
  for (const auto& [name, kinds] : r["messages_from_clients"].items()) {
    INFO(name);
    CHECK(!kinds.contains("weights"));
  }
}

TEST_CASE("split learning with 3 clients fails clearly within seconds when the server is killed",
          "[integration][split]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DropCluster dc;
  SplitOptions o = dc.options(/*splitfed=*/true);
  TrainConfig cfg = drop_config();
  cfg.epochs = 50;  // far longer than the test: only the server's loss ends it
  std::atomic<bool> killed{false};
  Clock::time_point t_kill{};
  std::thread killer([&] {
    if (!dc.wait_for_clients()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    std::lock_guard lock(dc.mu);
    t_kill = Clock::now();
    kill(dc.pids[1], SIGKILL);
    killed = true;
  });
  CHECK_THROWS_WITH(train_split(cfg, o), Catch::Contains("the server dev1") && Catch::Contains("epoch") &&
                                             Catch::Contains("cannot go on"));
  killer.join();
  dc.require_clients_came();
  REQUIRE(killed);
  // A disconnect is seen at once; silence would take --peer-timeout (3 s).
  CHECK(Clock::now() - t_kill < std::chrono::seconds(15));
}
