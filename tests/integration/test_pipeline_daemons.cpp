// test_pipeline_daemons.cpp: issue 4's must-shows with real cleaved processes
// over CURVE: pipelined training equals one-process training (every schedule,
// and with every stage recomputing its activations, issue 17),
// a daemon that dies makes the coordinator stop with a clear error naming the
// device and step, and an assignment that does not fit is refused with sizes.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/data/dataset.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"
#include "integration/daemon_cluster.h"
#include "integration/test_run.h"
#include "skip.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

namespace {

TrainConfig small_config(const std::string& model, int64_t limit_train, int64_t limit_test) {
  TrainConfig c = cleave::testing::test_run(model, 32, 3);
  c.epochs = 1;
  c.limit_train = limit_train;
  c.limit_test = limit_test;
  c.microbatches = 4;
  return c;
}

// Each step's loss of `got` within `rel` of `want`'s, relatively.
void check_losses(const nlohmann::json& got, const nlohmann::json& want, double rel, size_t steps) {
  REQUIRE(want["losses"].size() == steps);
  REQUIRE(got["losses"].size() == steps);
  for (size_t i = 0; i < steps; ++i) {
    const double x = want["losses"][i].get<double>(), y = got["losses"][i].get<double>();
    INFO("step " << i << ": reference " << x << " pipeline " << y);
    CHECK(std::abs(x - y) <= rel * std::abs(x));
  }
}

// `cfg` across 3 daemons split evenly (--planner balance) under `schedule`,
// --recompute `recompute`, writing a trace when `trace` (a file name in the
// cluster's directory) is given.
nlohmann::json train_on_three(const TrainConfig& cfg, const std::string& schedule, const std::string& recompute,
                              const std::string& trace = "") {
  DaemonCluster cluster(3);
  ClusterOptions cl = cluster.options(3);
  cl.schedule = schedule;
  cl.recompute = recompute;
  cl.shutdown_daemons = true;
  if (!trace.empty()) cl.trace_path = cluster.dir() + "/" + trace;
  cl.on_listening = [&](const std::string& ep) { cluster.start_all(ep); };
  nlohmann::json out = train_pipeline(cfg, cl);
  if (!trace.empty()) {
    std::ifstream tf(cl.trace_path);
    out["trace_events"] = nlohmann::json::parse(tf)["traceEvents"];
  }
  return out;
}

}  // namespace

TEST_CASE("3 daemons reproduce local training (gpipe, 1f1b and zb1)", "[integration][pipeline]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TrainConfig cfg = small_config("models/cnn.json", 640, 300);
  nlohmann::json local = train_local(cfg);
  for (const char* schedule : {"gpipe", "1f1b", "zb1"}) {
    DYNAMIC_SECTION("schedule " << schedule) {
      nlohmann::json piped = train_on_three(cfg, schedule, "none", "trace.json");
      check_losses(piped, local, 1e-4, 20);
      CHECK(std::abs(local["test_accuracy"].get<double>() - piped["test_accuracy"].get<double>()) <= 0.002);
      CHECK(piped["mode"] == "pipeline");
      CHECK(piped["devices"].size() == 3);
      CHECK(piped["plan"].size() == 3);
      CHECK(piped["plan"][0]["layers"][0] == 0);
      CHECK(piped["plan"][2]["layers"][1] == 10);
      // The steady batch time is the median of the 19 gaps between the 20
      // steps' ends, which lie within the training time: at most twice their mean.
      const double median_step = piped["median_step_seconds"].get<double>();
      CHECK(median_step > 0);
      CHECK(median_step <= 2 * piped["train_seconds"].get<double>() / 19);
      // The trace has a track per stage with forward/backward/send/receive/optimizer slices;
      // under zb1 the backward is its two halves, B and W.
      std::set<std::string> names;
      std::set<int> tids;
      for (const auto& e : piped["trace_events"]) {
        names.insert(e["name"].get<std::string>());
        if (e["ph"] == "X") tids.insert(e["tid"].get<int>());
      }
      const bool zb1 = std::string(schedule) == "zb1";
      for (const char* n : {"forward", "send", "receive", "optimizer", "idle"}) CHECK(names.count(n) == 1);
      CHECK(names.count("backward") == (zb1 ? 0u : 1u));
      CHECK(names.count("B") == (zb1 ? 1u : 0u));
      CHECK(names.count("W") == (zb1 ? 1u : 0u));
      CHECK(tids.size() == 3);
    }
  }
}

// Issue 17: every stage keeping only its inputs and recomputing its
// activations in backward trains exactly as keeping them (1e-6) and so as one
// process (1e-4); the run's JSON says which stages recompute.
TEST_CASE("3 daemons with --recompute all reproduce local training (gpipe, 1f1b and zb1)", "[integration][pipeline]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TrainConfig cfg = small_config("models/cnn.json", 320, 100);
  const nlohmann::json local = train_local(cfg);
  for (const char* schedule : {"gpipe", "1f1b", "zb1"}) {
    DYNAMIC_SECTION("schedule " << schedule) {
      const nlohmann::json kept = train_on_three(cfg, schedule, "none");
      const nlohmann::json recomputed = train_on_three(cfg, schedule, "all");
      check_losses(recomputed, kept, 1e-6, 10);
      check_losses(recomputed, local, 1e-4, 10);
      CHECK(recomputed["recompute"] == "all");
      CHECK(kept["recompute"] == "none");
      REQUIRE(recomputed["stages"].size() == 3);
      for (size_t s = 0; s < 3; ++s) {
        const auto& st = recomputed["stages"][s];
        INFO(st.dump());
        CHECK(st["recompute"] == true);
        CHECK(kept["stages"][s]["recompute"] == false);
        // The estimate bounds what the daemon held, and it is the daemon's own.
        CHECK(st["daemon_estimated_memory_bytes"] == st["estimated_memory_bytes"]);
        CHECK(st["peak_memory_bytes"].get<int64_t>() <= st["estimated_memory_bytes"].get<int64_t>());
        // Recomputing needs no more than keeping (less for the middle and last stages'
        // activations; under zb1 the same, memory_model.h: recompute_saves_memory).
        CHECK(st["estimated_memory_bytes"].get<int64_t>() <= kept["stages"][s]["estimated_memory_bytes"].get<int64_t>());
      }
    }
  }
}

// The floor under recovery (test_pipeline_recovery.cpp): with no recovery
// allowed, a lost device ends the run at once, saying which and when.
TEST_CASE("with --max-recoveries 0 a daemon that dies mid-run stops the coordinator with the device and step",
          "[integration][pipeline]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TrainConfig cfg = small_config("models/cnn.json", 20000, 100);
  DaemonCluster cluster(3);
  ClusterOptions cl = cluster.options(3);
  cl.max_recoveries = 0;
  pid_t victim = 0;
  std::chrono::steady_clock::time_point killed_at;
  std::thread killer;
  cl.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep);
    victim = cluster.start(2, ep);
    cluster.start(3, ep);
    killer = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::seconds(4));
      killed_at = std::chrono::steady_clock::now();
      kill(victim, SIGKILL);
    });
  };
  std::string message;
  try {
    train_pipeline(cfg, cl);
  } catch (const std::exception& e) {
    message = e.what();
  }
  const auto stopped_at = std::chrono::steady_clock::now();
  killer.join();
  INFO(message);
  CHECK_THAT(message, Catch::Contains("dev2") && Catch::Contains("step") && Catch::Contains("--max-recoveries"));
  // Noticed through the disconnect or at the latest the peer timeout (5 s),
  // plus room for a loaded machine: not a hang.
  CHECK(std::chrono::duration<double>(stopped_at - killed_at).count() < cl.peer_timeout_ms / 1000.0 + 10.0);
}

TEST_CASE("an assignment that does not fit is refused with sizes and the daemon serves on", "[integration][pipeline]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TrainConfig cfg = small_config("models/mlp.json", 256, 100);
  DaemonCluster cluster(2);
  ClusterOptions cl = cluster.options(2);
  pid_t small = 0;
  cl.on_listening = [&](const std::string& ep) {
    small = cluster.start(1, ep, {"--memory-limit", "2M"});
    cluster.start(2, ep);
  };
  std::string message;
  try {
    train_pipeline(cfg, cl);
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("dev1") && Catch::Contains("MiB") && Catch::Contains("--memory-limit"));
  // The refusing daemon is still up, waiting for its next job.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int status = 0;
  CHECK(waitpid(small, &status, WNOHANG) == 0);  // 0: not exited (a zombie would be reaped here)
}

TEST_CASE("a device whose key is not on the allow-list never joins", "[integration][pipeline]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TrainConfig cfg = small_config("models/cnn.json", 64, 64);
  DaemonCluster cluster(2);
  std::filesystem::remove(cluster.allow() + "/dev2.pub");
  ClusterOptions cl = cluster.options(2);
  cl.register_timeout_ms = 4000;
  cl.on_listening = [&](const std::string& ep) { cluster.start_all(ep); };
  std::string message;
  try {
    train_pipeline(cfg, cl);
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("only 1 of 2 devices registered") && Catch::Contains("dev1"));
}
