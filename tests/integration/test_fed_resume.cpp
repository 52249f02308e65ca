// test_fed_resume.cpp: issue 15, federated part, with a real `cleave fed`
// coordinator process and real cleaved clients on loopback:
//   - a coordinator SIGKILLed after round 2 of 4 was checkpointed and
//     restarted with `--resume DIR` (the same client processes, never
//     restarted) ends at the uninterrupted run's weights;
//   - a corrupted newest checkpoint is skipped with a warning (log and
//     "resumed" in the JSON) and the one before it is used;
//   - a client killed in round 1 and restarted registers again and is sampled
//     and accepted in the later rounds (the round's "rejoined");
//   - --resume without a record, with --load or --init, and with no valid
//     checkpoint are refused saying what to do.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli_util.h"
#include "apps/common/processes.h"
#include "core/runtime/coordinator/fed_coordinator.h"
#include "core/train/train_checkpoint.h"
#include "integration/daemon_cluster.h"
#include "integration/test_fed_privacy_run.h"
#include "log_capture.h"
#include "skip.h"

using namespace cleave;
using namespace cleave::cli_test;
using cleave::testing::DaemonCluster;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr int kClients = 3;

// cleaved flags of client i (1-based) of kClients: shard i-1 of the first `limit` samples.
std::vector<std::string> client_flags(int i, int64_t limit, std::vector<std::string> extra = {}) {
  std::vector<std::string> f = {"--dataset", "fashion-mnist", "--shard", std::to_string(i - 1) + "/" + std::to_string(kClients),
                                "--seed", "11", "--limit-train", std::to_string(limit)};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// The argv of `cleave fed` over the cluster's clients on `endpoint`; `flags` are appended.
std::vector<std::string> fed_argv(const DaemonCluster& cluster, const std::string& model, const std::string& endpoint,
                                  const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {kCleave, "fed", "--model", model, "--clients", std::to_string(kClients),
                                   "--key", cluster.coordinator_key(), "--allow", cluster.allow(), "--listen", endpoint,
                                   "--seed", "5", "--batch", "32", "--threads", "1", "--limit-test", "300",
                                   "--optimizer", "adam", "--lr", "0.001", "--fraction", "0.6", "--min-clients", "2",
                                   "--register-timeout", "60000", "--no-progress"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

// Waits up to `seconds` for `pid` to exit: its exit status, 128 + signal, or -1 when it still runs.
int wait_exit(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    std::this_thread::sleep_for(50ms);
  }
  return -1;
}

// Runs a coordinator to its end: its exit status (-1 when it ran past `seconds`, then killed).
int run_to_end(const std::vector<std::string>& argv, const std::string& log, int seconds = 120) {
  const pid_t pid = spawn(argv, log);
  const int code = wait_exit(pid, seconds);
  if (code < 0) terminate(pid, 1000);
  return code;
}

std::string ckpt(const std::string& dir, int rounds_done) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%012d.ckpt", rounds_done);
  return (fs::path(dir) / name).string();
}

// ||a - b|| / ||b||.
double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

// Flips bytes in the middle of `path` (its checksum no longer matches).
void corrupt(const std::string& path) {
  std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() > 64);
  for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 16; ++i) bytes[i] = static_cast<char>(~bytes[i]);
  write_text(path, bytes);
}

// A model small enough for quick rounds (kPrivacyMlp), written into `dir`.
std::string small_model(const TempDir& dir) {
  const std::string model = dir.file("small.json");
  write_text(model, cleave::testing::kPrivacyMlp);
  return model;
}

// Starts the cluster's kClients clients (client_flags(i, limit, extra)) toward
// a free loopback port: that endpoint, with each client's pid in `pids` when given.
std::string start_clients(DaemonCluster& cluster, int64_t limit, const std::vector<std::string>& extra = {},
                          std::vector<pid_t>* pids = nullptr) {
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(cleave::testing::free_loopback_port());
  for (int i = 1; i <= kClients; ++i) {
    const pid_t pid = cluster.start(i, endpoint, client_flags(i, limit, extra));
    if (pids) pids->push_back(pid);
  }
  return endpoint;
}

}  // namespace

TEST_CASE("fed: a coordinator killed after round 2 of 4 resumes with --resume DIR and ends at the uninterrupted weights",
          "[integration][fed][recovery]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  DaemonCluster cluster(kClients);
  const std::string model = kMlp;  // big enough that a round takes a while to kill in between
  // The same client processes serve all three coordinators: never restarted.
  std::vector<pid_t> clients;
  const std::string endpoint =
      start_clients(cluster, 3000, {"--max-jobs", "3", "--coordinator-timeout", "2000"}, &clients);

  // The uninterrupted run.
  const std::string ref_save = dir.file("ref.ckpt");
  REQUIRE(run_to_end(fed_argv(cluster, model, endpoint, {"--rounds", "4", "--save", ref_save, "--json", dir.file("ref.json")}),
                     dir.file("ref.log")) == 0);

  // The same run, SIGKILLed once round 2 is in its checkpoint directory.
  const std::string ckdir = dir.file("ck");
  const std::string save = dir.file("resumed.ckpt");
  const pid_t killed = spawn(fed_argv(cluster, model, endpoint,
                                      {"--rounds", "4", "--checkpoint-dir", ckdir, "--save", save, "--json",
                                       dir.file("killed.json")}),
                             dir.file("killed.log"));
  for (int i = 0; i < 2400 && !fs::exists(ckpt(ckdir, 2)); ++i) std::this_thread::sleep_for(25ms);
  REQUIRE(kill(killed, SIGKILL) == 0);
  INFO(read_bytes(dir.file("killed.log")));
  REQUIRE(wait_exit(killed, 10) == 128 + SIGKILL);
  REQUIRE(fs::exists(ckpt(ckdir, 2)));
  REQUIRE_FALSE(fs::exists(ckpt(ckdir, 4)));  // killed before the end
  CHECK_THAT(read_bytes(dir.file("killed.log")),
             Catch::Contains("checkpoints in " + ckdir) && Catch::Contains("cleave fed --resume " + ckdir));

  // Resumed with nothing but the directory (its command.json has the rest) and a new --json.
  const std::string json = dir.file("resume.json");
  const int code = run_to_end({kCleave, "fed", "--resume", ckdir, "--json", json}, dir.file("resume.log"));
  INFO(read_bytes(dir.file("resume.log")) << cluster.log(1) << cluster.log(2) << cluster.log(3));
  REQUIRE(code == 0);
  const nlohmann::json got = read_json(json);
  const int64_t done = got["resumed"]["rounds_done"].get<int64_t>();
  CHECK(done >= 2);
  CHECK(done < 4);
  CHECK(got["resumed"]["from"] == ckpt(ckdir, static_cast<int>(done)));
  CHECK(got["resumed"]["skipped"].empty());
  CHECK(got["start_round"] == done);
  CHECK(got["rounds"].size() == static_cast<size_t>(4 - done));
  CHECK(got["rounds"].back()["round"] == 4);
  for (pid_t c : clients) CHECK(kill(c, 0) == 0);  // the same processes served all three runs

  // The final weights are the uninterrupted run's (sampling and data order depend on seed and round only).
  const FedState want = load_fed_state(ref_save), have = load_fed_state(save);
  CHECK(have.rounds_done == 4);
  CHECK(relative_distance(have.params, want.params) <= 1e-5);
  CHECK(relative_distance(load_fed_state(ckpt(ckdir, 4)).params, want.params) <= 1e-5);
}

TEST_CASE("fed: --resume skips a corrupted newest checkpoint with a warning and uses the one before it",
          "[integration][fed][recovery]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  DaemonCluster cluster(kClients);
  const std::string model = small_model(dir);
  const std::string endpoint = start_clients(cluster, 900, {"--max-jobs", "2"});
  const std::string ckdir = dir.file("ck");
  REQUIRE(run_to_end(fed_argv(cluster, model, endpoint, {"--rounds", "3", "--checkpoint-dir", ckdir}), dir.file("first.log")) == 0);
  // The newest two are kept.
  CHECK_FALSE(fs::exists(ckpt(ckdir, 1)));
  REQUIRE(fs::exists(ckpt(ckdir, 2)));
  REQUIRE(fs::exists(ckpt(ckdir, 3)));
  corrupt(ckpt(ckdir, 3));

  const std::string json = dir.file("resume.json");
  const int code = run_to_end({kCleave, "fed", "--resume", ckdir, "--json", json}, dir.file("resume.log"));
  const std::string log = read_bytes(dir.file("resume.log"));
  INFO(log);
  REQUIRE(code == 0);
  CHECK_THAT(log, Catch::Contains("[warning]") && Catch::Contains("skipped the checkpoint " + ckpt(ckdir, 3)));
  const nlohmann::json got = read_json(json);
  CHECK(got["resumed"]["from"] == ckpt(ckdir, 2));
  CHECK(got["resumed"]["rounds_done"] == 2);
  REQUIRE(got["resumed"]["skipped"].size() == 1);
  CHECK_THAT(got["resumed"]["skipped"][0].get<std::string>(), Catch::StartsWith(ckpt(ckdir, 3) + ": "));
  REQUIRE(got["rounds"].size() == 1);  // round 3 again, as the recorded --rounds 3 says
  CHECK(got["rounds"][0]["round"] == 3);
  CHECK(load_fed_state(ckpt(ckdir, 3)).rounds_done == 3);  // written anew, readable again
}

TEST_CASE("fed: a client killed in round 1 and restarted rejoins sampling in a later round", "[integration][fed][recovery]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  DaemonCluster cluster(kClients);
  const std::string model = small_model(dir);
  TrainConfig cfg;
  cfg.model_path = model;
  cfg.batch = 32;
  cfg.seed = 5;
  cfg.limit_test = 300;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 1e-3f;
  cfg.threads = 1;
  cfg.progress = false;
  FedOptions o;
  o.clients = kClients;
  cluster.connect(o);
  o.rounds = 5;
  o.min_clients = 2;  // fraction 1: every live client is sampled
  o.round_timeout_s = 60;
  std::string ep;
  pid_t victim = 0;
  o.on_listening = [&](const std::string& endpoint) {
    ep = endpoint;
    for (int i = 1; i <= kClients; ++i) {
      const pid_t p = cluster.start(i, ep, client_flags(i, i == 2 ? 30000 : 900));  // dev2 still trains when killed
      if (i == 2) victim = p;
    }
  };
  o.on_round_started = [&](int round, const std::vector<std::string>&) {
    if (round == 0) {
      REQUIRE(kill(victim, SIGKILL) == 0);
      REQUIRE(waitpid(victim, nullptr, 0) == victim);
      cluster.start(2, ep, client_flags(2, 900));  // the same name and key, a new process
    }
    if (round == 1)  // give the new daemon time to start and register before round 3 samples
      for (int i = 0; i < 400 && cluster.log(2).find("device cpu") == std::string::npos; ++i)
        std::this_thread::sleep_for(50ms);
    if (round == 1) std::this_thread::sleep_for(2s);
  };
  cleave::testing::LogCapture logs;
  const nlohmann::json r = train_federated(cfg, o);
  INFO(r.dump(1));
  REQUIRE(r["rounds"].size() == 5);
  CHECK_THAT(r["rounds"][0]["dropped"].dump(), Catch::Contains("dev2"));
  int back = -1;  // the round (0-based) dev2 rejoined before
  for (size_t i = 0; i < r["rounds"].size(); ++i)
    for (const auto& c : r["rounds"][i]["rejoined"])
      if (c == "dev2") back = static_cast<int>(i);
  REQUIRE(back >= 1);
  CHECK(back <= 3);
  // Sampled again from the round it rejoined before, and its updates accepted.
  for (size_t i = static_cast<size_t>(back); i < r["rounds"].size(); ++i) {
    const auto& rd = r["rounds"][i];
    CHECK(rd["sampled"].size() == 3);
    CHECK_THAT(rd["participating"].dump(), Catch::Contains("dev2"));
    CHECK(rd["dropped"].empty());
  }
  // Every round between its drop and its rejoin (none when it rejoined
  // before round 2) is sampled without it.
  for (size_t i = 1; i < static_cast<size_t>(back); ++i) {
    INFO("round " << i + 1);
    CHECK(r["rounds"][i]["sampled"].size() == 2);
    CHECK_THAT(r["rounds"][i]["sampled"].dump(), !Catch::Contains("dev2"));
  }
  for (const auto& d : r["devices"])
    if (d["name"] == "dev2") CHECK(d["dead"] == false);
  bool logged = false;
  {
    std::lock_guard lock(logs.mutex);
    for (const auto& l : logs.lines) logged |= l.find("dev2") != std::string::npos && l.find("rejoins") != std::string::npos;
  }
  CHECK(logged);
}

TEST_CASE("fed: --resume is refused without a record or valid checkpoint and with --load or --init",
          "[integration][fed][recovery]") {
  TempDir dir;
  const std::string base = "fed --model '" + kMlp + "' --clients 1 --insecure --no-progress";
  require_usage_error(base + " --resume '" + dir.str() + "'", {"--resume " + dir.str(), "command.json", "--checkpoint-dir"});
  // A record, as a run with --checkpoint-dir writes it.
  write_text(dir.file("command.json"),
             nlohmann::json{{"command", "fed"}, {"flags", {"--model=" + kMlp, "--clients=1", "--insecure", "--no-progress",
                                                           "--listen=tcp://127.0.0.1:*", "--register-timeout=1000"}}}
                 .dump());
  require_usage_error("fed --resume '" + dir.str() + "' --load '" + dir.file("x.ckpt") + "'", {"--resume", "--load"});
  require_usage_error("fed --resume '" + dir.str() + "' --init '" + dir.file("x.safetensors") + "'", {"--resume", "--init"});
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();  // the run loads its test set before its checkpoint
  require_failure("fed --resume '" + dir.str() + "'", {"no valid checkpoint", "start the run again without --resume"});
  // Only corrupt checkpoints: each is named with why it was skipped.
  write_text(ckpt(dir.str(), 1), "not a checkpoint");
  write_text(ckpt(dir.str(), 2), "not one either");
  const RunResult r = run_cleave("fed --resume '" + dir.str() + "'");
  INFO(r.output);
  CHECK(r.code == kExitFailure);
  CHECK_THAT(r.output, Catch::Contains("no valid checkpoint") && Catch::Contains(ckpt(dir.str(), 1)) &&
                           Catch::Contains(ckpt(dir.str(), 2)) && Catch::Contains("skipped the checkpoint"));
  // A fresh run into a directory holding another run's later checkpoints is refused too.
  require_failure(base + " --listen tcp://127.0.0.1:* --checkpoint-dir '" + dir.str() + "'",
                  {"already holds", "cleave fed --resume " + dir.str()});
}

// With no --save and no --checkpoint-dir, the rounds' checkpoints go to a
// new directory under TMPDIR, which a run that succeeds removes: nothing is
// left to resume (core/runtime/coordinator/fed_coordinator.h, checkpoint_dir_temporary).
TEST_CASE("fed: a run that names no checkpoint directory removes its temporary one when it succeeds",
          "[integration][fed][recovery]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  DaemonCluster cluster(kClients);
  const std::string model = small_model(dir);
  const std::string endpoint = start_clients(cluster, 600);
  const std::string tmp = dir.file("tmp");
  fs::create_directories(tmp);
  std::vector<std::string> argv = {"/usr/bin/env", "TMPDIR=" + tmp};
  for (const std::string& a : fed_argv(cluster, model, endpoint, {"--rounds", "2", "--json", dir.file("r.json")}))
    argv.push_back(a);
  const int code = run_to_end(argv, dir.file("run.log"));
  INFO(read_bytes(dir.file("run.log")));
  REQUIRE(code == 0);
  const std::string used = read_json(dir.file("r.json")).at("checkpoint_dir").get<std::string>();
  CHECK_THAT(used, Catch::StartsWith(tmp + "/cleave-fed-checkpoints-"));
  CHECK_THAT(read_bytes(dir.file("run.log")), Catch::Contains("checkpoints in " + used));
  CHECK_FALSE(fs::exists(used));
  CHECK(fs::is_empty(tmp));
}
