// test_pipeline_recovery.cpp: issue 15's chaos tests for `cleave train`
// across daemons. Real `cleave` and `cleaved` processes; a daemon is killed
// (SIGKILL) or frozen (SIGSTOP past --peer-timeout) in the middle of a run,
// or the coordinator itself is killed and restarted with --resume. Every run
// must end with the final weights (its --save file) of an uninterrupted run
// with the same seed, within 1e-5 relative: no micro-batch applied twice,
// none skipped.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/processes.h"
#include "core/train/train_checkpoint.h"
#include "child_process.h"
#include "integration/daemon_cluster.h"
#include "skip.h"

namespace {

using cleave::testing::count_of;
using cleave::testing::DaemonCluster;
using cleave::testing::read_text;
using cleave::testing::wait_exit;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string loopback() { return "tcp://127.0.0.1:" + std::to_string(cleave::testing::free_loopback_port()); }

// 2 epochs of 30 steps (MLP, 960 samples, batch 32, 2 micro-batches), Adam so
// that optimizer state has to survive too; `extra` flags appended.
pid_t start_coordinator(const DaemonCluster& cluster, const std::string& endpoint, int devices, const std::string& tag,
                        std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {std::string(CLEAVE_BINARY_DIR) + "/apps/cleave/cleave", "train", "--model",
                                   std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json", "--devices",
                                   std::to_string(devices), "--epochs", "2", "--batch", "32", "--microbatches", "2",
                                   "--optimizer", "adam", "--lr", "0.001", "--seed", "5", "--limit-train", "960",
                                   "--limit-test", "200", "--threads", "1", "--key", cluster.coordinator_key(),
                                   "--allow", cluster.allow(), "--listen", endpoint, "--register-timeout", "60000",
                                   "--planner", "balance", "--json", cluster.dir() + "/" + tag + ".json", "--save",
                                   cluster.dir() + "/" + tag + ".ckpt", "--no-progress"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return cleave::spawn(argv, cluster.dir() + "/" + tag + ".log");
}

// Waits until `n` daemons of the cluster's logs say they hold a stage.
bool wait_assigned(const DaemonCluster& cluster, int daemons, size_t n) {
  for (int i = 0; i < 600; ++i) {
    size_t assigned = 0;
    for (int d = 1; d <= daemons; ++d) assigned += count_of(cluster.log(d), "assigned stage");
    if (assigned >= n) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// The final weights of an uninterrupted run on 3 daemons (computed once).
const std::vector<float>& reference_weights() {
  static const std::vector<float> weights = [] {
    DaemonCluster cluster(3);
    const std::string endpoint = loopback();
    const pid_t c = start_coordinator(cluster, endpoint, 3, "reference");
    cluster.start_all(endpoint);
    const int code = wait_exit(c, 180);
    INFO(read_text(cluster.dir() + "/reference.log") << cluster.log(1));
    REQUIRE(code == 0);
    // Without checkpoint flags: one checkpoint per epoch (not after the last), beside --save.
    const auto out = nlohmann::json::parse(read_text(cluster.dir() + "/reference.json"));
    CHECK(out["checkpoints"]["every_steps"] == 0);
    CHECK(out["checkpoints"]["written"] == 1);
    CHECK(out["checkpoints"]["dir"] == cluster.dir() + "/reference.ckpt.checkpoints");
    CHECK(out["recoveries"].empty());
    return cleave::load_training_state(cluster.dir() + "/reference.ckpt").params;
  }();
  return weights;
}

// ||got - want|| / ||want||.
double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

// The checkpoint files in `dir`, oldest first (none while it does not exist).
std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".ckpt") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string> kDaemonFlags = {"--max-jobs", "8", "--coordinator-timeout", "3000"};

// Runs a 3-stage job with a fourth daemon joining once it trains, does
// `disturb(pid of dev2)` after `delay`, and returns the result JSON.
template <typename Disturb>
nlohmann::json run_with(DaemonCluster& cluster, const std::string& tag, std::chrono::milliseconds delay,
                        Disturb&& disturb) {
  const std::string endpoint = loopback();
  const pid_t c = start_coordinator(cluster, endpoint, 3, tag, {"--peer-timeout", "1500", "--checkpoint-every", "4"});
  std::vector<pid_t> pids;
  for (int i = 1; i <= 3; ++i) pids.push_back(cluster.start(i, endpoint, kDaemonFlags));
  REQUIRE(wait_assigned(cluster, 3, 3));
  pids.push_back(cluster.start(4, endpoint, kDaemonFlags));  // joins mid-run: a spare
  std::this_thread::sleep_for(delay);
  disturb(pids[1]);
  const int code = wait_exit(c, 240);
  INFO(read_text(cluster.dir() + "/" + tag + ".log") << cluster.log(1) << cluster.log(2) << cluster.log(3)
                                                      << cluster.log(4));
  REQUIRE(code == 0);
  return nlohmann::json::parse(read_text(cluster.dir() + "/" + tag + ".json"));
}

// What every recovered run must show: one recovery naming the device, a new
// plan of 3 stages that uses the spare (dev4), the steps replayed from a
// checkpoint, the timings, and the uninterrupted run's weights.
void check_recovered(const DaemonCluster& cluster, const nlohmann::json& out, const std::string& tag) {
  INFO(out.dump(1));
  REQUIRE(out["recoveries"].size() >= 1);
  const auto& r = out["recoveries"][0];
  CHECK(r["device"] == "dev2");
  CHECK(r["lost_devices"] == nlohmann::json::array({"dev2"}));
  CHECK(r["step"].get<int64_t>() >= r["checkpoint"]["step"].get<int64_t>());
  CHECK(r["replayed_steps"].get<int64_t>() == r["step"].get<int64_t>() - r["checkpoint"]["step"].get<int64_t>());
  CHECK(r["replayed_steps"].get<int64_t>() < 4 + 2);  // --checkpoint-every 4: never more than the steps since one
  for (const char* k : {"detect_seconds", "replan_seconds", "read_seconds", "restore_seconds", "catch_up_seconds"})
    CHECK(r[k].get<double>() >= 0);
  std::vector<std::string> planned;
  for (const auto& s : r["plan"]) planned.push_back(s["device"]);
  CHECK(planned == std::vector<std::string>{"dev1", "dev3", "dev4"});  // the spare replaced dev2
  CHECK(out["losses"].size() == 60);  // every step once: the replayed ones replace what was lost
  CHECK(out["steps"] == 60);
  const auto got = cleave::load_training_state(cluster.dir() + "/" + tag + ".ckpt").params;
  CHECK(relative_difference(got, reference_weights()) <= 1e-5);
}

}  // namespace

TEST_CASE("a daemon killed at a random step: the run re-plans onto the spare and ends with the uninterrupted weights",
          "[integration][pipeline][recovery][slow]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  (void)reference_weights();
  DaemonCluster cluster(4);
  std::mt19937 rng(std::random_device{}());
  const auto delay = std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 2500)(rng));
  INFO("killed after " << delay.count() << " ms");
  const auto out = run_with(cluster, "killed", delay, [](pid_t dev2) { REQUIRE(kill(dev2, SIGKILL) == 0); });
  check_recovered(cluster, out, "killed");
  CHECK(out["recoveries"][0]["detect_seconds"].get<double>() < 1.5);  // a closed connection, not a timeout
}

TEST_CASE("a daemon frozen past --peer-timeout is lost like a dead one, and woken it cannot disturb the run",
          "[integration][pipeline][recovery][slow]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  (void)reference_weights();
  DaemonCluster cluster(4);
  const auto out = run_with(cluster, "frozen", 1000ms, [](pid_t dev2) {
    REQUIRE(kill(dev2, SIGSTOP) == 0);
    std::this_thread::sleep_for(4s);  // --peer-timeout 1500 ms
    REQUIRE(kill(dev2, SIGCONT) == 0);
  });
  check_recovered(cluster, out, "frozen");
  CHECK(out["recoveries"][0]["detect_seconds"].get<double>() >= 1.4);  // silence, measured against --peer-timeout
}

TEST_CASE("a killed coordinator restarted with --resume ends with the uninterrupted weights, and a corrupt newest "
          "checkpoint falls back to the one before it",
          "[integration][pipeline][recovery][slow]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  (void)reference_weights();
  DaemonCluster cluster(3);
  const std::string endpoint = loopback();
  const std::string dir = cluster.dir() + "/ckpts";
  const pid_t first = start_coordinator(cluster, endpoint, 3, "first", {"--checkpoint-dir", dir, "--checkpoint-every", "3"});
  std::vector<pid_t> daemons;
  for (int i = 1; i <= 3; ++i) daemons.push_back(cluster.start(i, endpoint, kDaemonFlags));
  // Kill it once it has written two checkpoints.
  for (int i = 0; i < 1200 && checkpoints_in(dir).size() < 2; ++i) std::this_thread::sleep_for(50ms);
  REQUIRE(checkpoints_in(dir).size() >= 2);
  REQUIRE(kill(first, SIGKILL) == 0);
  REQUIRE(wait_exit(first, 10) == 128);
  const auto kept = checkpoints_in(dir);
  // The newest one is damaged (a disk error, a torn copy): resume must skip it.
  {
    std::fstream f(kept.back(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(kept.back()) / 2));
    f.put('\x5a').put('\xa5').put('\x5a');
  }
  const pid_t second = cleave::spawn({std::string(CLEAVE_BINARY_DIR) + "/apps/cleave/cleave", "train", "--resume", dir,
                                      "--json", cluster.dir() + "/second.json"},
                                     cluster.dir() + "/second.log");
  const int code = wait_exit(second, 240);
  const std::string log = read_text(cluster.dir() + "/second.log");
  INFO(log << cluster.log(1) << cluster.log(2) << cluster.log(3));
  REQUIRE(code == 0);
  const auto out = nlohmann::json::parse(read_text(cluster.dir() + "/second.json"));
  INFO(out.dump(1));
  CHECK(out["resumed"]["from"] == kept[kept.size() - 2]);
  REQUIRE(out["resumed"]["skipped"].size() == 1);
  CHECK(out["resumed"]["skipped"][0].get<std::string>().find(kept.back()) == 0);
  CHECK(out["checkpoint_warnings"].size() == 1);
  CHECK(count_of(log, "checkpoint skipped: " + kept.back()) == 1);
  // The daemons were never restarted: the same processes trained again.
  for (pid_t p : daemons) CHECK(kill(p, 0) == 0);
  const auto got = cleave::load_training_state(cluster.dir() + "/first.ckpt").params;  // --save, recorded
  CHECK(relative_difference(got, reference_weights()) <= 1e-5);
}

TEST_CASE("a model that no longer fits the devices left stops the run saying how much memory is missing",
          "[integration][pipeline][recovery]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(2);
  const std::string endpoint = loopback();
  const std::string dir = cluster.dir() + "/ckpts";
  // Two stages fit dev1's 36 MiB; the whole model on it alone does not.
  const pid_t c = start_coordinator(cluster, endpoint, 2, "small",
                                    {"--checkpoint-dir", dir, "--checkpoint-every", "2", "--peer-timeout", "1500"});
  cluster.start(1, endpoint, {"--max-jobs", "8", "--memory-limit", "36M"});
  const pid_t dev2 = cluster.start(2, endpoint, kDaemonFlags);
  REQUIRE(wait_assigned(cluster, 2, 2));
  for (int i = 0; i < 600 && checkpoints_in(dir).empty(); ++i) std::this_thread::sleep_for(50ms);
  REQUIRE(kill(dev2, SIGKILL) == 0);
  const int code = wait_exit(c, 120);
  const std::string log = read_text(cluster.dir() + "/small.log");
  INFO(log << cluster.log(1));
  CHECK(code == 1);
  CHECK_THAT(log, Catch::Contains("no longer fits the 1 device(s) left") &&
                      Catch::Contains("stage 0 on dev1 needs") && Catch::Contains("MiB missing") &&
                      Catch::Contains("cleave train --resume " + dir));
  CHECK(!checkpoints_in(dir).empty());  // kept for the resume
}

TEST_CASE("cleave train --resume refuses what it cannot resume, saying why", "[integration][pipeline][recovery]") {
  const std::string cleave_bin = std::string(CLEAVE_BINARY_DIR) + "/apps/cleave/cleave";
  DaemonCluster cluster(1);
  const std::string empty = cluster.dir() + "/nothing-here";
  fs::create_directories(empty);
  const pid_t p = cleave::spawn({cleave_bin, "train", "--resume", empty}, cluster.dir() + "/a.log");
  CHECK(wait_exit(p, 30) == 2);
  CHECK(read_text(cluster.dir() + "/a.log").find("no " + empty + "/command.json there") != std::string::npos);
  const pid_t q = cleave::spawn({cleave_bin, "train", "--local", "--model",
                                 std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json", "--checkpoint-every", "3"},
                                cluster.dir() + "/b.log");
  CHECK(wait_exit(q, 30) == 2);
  CHECK(read_text(cluster.dir() + "/b.log").find("--checkpoint-every is for pipeline training") != std::string::npos);
}

// A run that fails before its first checkpoint has nothing to resume: the
// temporary checkpoint directory it made (under TMPDIR) goes with it.
TEST_CASE("cleave train and cleave fed that fail before a checkpoint leave no temporary checkpoint directory",
          "[integration][pipeline][recovery]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const std::string cleave_bin = std::string(CLEAVE_BINARY_DIR) + "/apps/cleave/cleave";
  const std::string mlp = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  DaemonCluster cluster(1);
  const std::string tmp = cluster.dir() + "/tmp";
  fs::create_directories(tmp);
  const std::vector<std::string> common = {"--model",    mlp, "--limit-test", "32", "--insecure", "--listen",
                                           "tcp://127.0.0.1:*", "--register-timeout", "500", "--no-progress"};
  struct Run {
    const char* tag;
    std::vector<std::string> flags;
  };
  for (const Run& run : {Run{"train", {"train", "--devices", "1", "--limit-train", "64"}}, Run{"fed", {"fed", "--clients", "1"}}}) {
    std::vector<std::string> argv = {"/usr/bin/env", "TMPDIR=" + tmp, cleave_bin};
    argv.insert(argv.end(), run.flags.begin(), run.flags.end());
    argv.insert(argv.end(), common.begin(), common.end());
    const std::string log = cluster.dir() + "/" + run.tag + ".log";
    const int code = wait_exit(cleave::spawn(argv, log), 60);
    INFO(run.tag << ":\n" << read_text(log));
    CHECK(code == 1);
    CHECK(read_text(log).find("registered within 0.5 s") != std::string::npos);  // the timeout given, not "0 s"
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(tmp)) left.push_back(e.path().filename().string());
    CHECK(left.empty());
  }
}
