// test_sdk_split_example.cpp: the C++ example apps/examples/split_client.cpp
// (cleave.hpp only) joins a real split-learning run (issue 14). The split
// coordinator (train_split, what `cleave split` runs) trains the MLP with a
// `cleaved` server and two data clients: an ordinary `cleaved` on the iid shard
// 0/2 and the example on shard 1/2 (`--seed 11`: the example computes cleaved's
// iid shard itself). The run completes, the example printed its progress from
// the progress callback, and every training loss (the server's, batch by batch)
// equals that of the same run with two `cleaved` clients: the example trained
// on the same samples in the same order. The evaluation is the same too: the
// example serves cleaved's test shard through the test-data callback.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/processes.h"
#include "core/runtime/coordinator/split_coordinator.h"
#include "core/train/train_config.h"
#include "integration/daemon_cluster.h"
#include "skip.h"

namespace {

using cleave::read_text;
using cleave::testing::DaemonCluster;
using namespace std::chrono_literals;

constexpr int64_t kLimit = 640;  // training samples over the two clients

cleave::TrainConfig config() {
  cleave::TrainConfig c;
  c.model_path = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  c.epochs = 1;
  c.batch = 64;
  c.seed = 3;
  c.limit_test = 200;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 1e-3f;
  c.threads = 1;
  c.progress = false;
  return c;
}

std::vector<std::string> client_flags(int shard) {
  return {"--dataset", "fashion-mnist", "--shard", std::to_string(shard) + "/2", "--seed", "11",
          "--limit-train", std::to_string(kLimit)};
}

// Exit status of `pid` (waits up to a minute; -1 when it still runs).
int exit_code(pid_t pid) {
  for (int i = 0; i < 600; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::this_thread::sleep_for(100ms);
  }
  return -1;
}

}  // namespace

TEST_CASE("SDK: the C++ split example joins cleave split as a client and trains like a cleaved client",
          "[sdk][integration][split]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(3);  // dev1 the server, dev2 and dev3 the clients
  cleave::SplitOptions o;
  o.clients = 2;
  cluster.connect(o);
  o.epoch_timeout_s = 120;
  o.server = "dev1";

  o.on_listening = [&cluster](const std::string& ep) {
    cluster.start(1, ep);
    cluster.start(2, ep, client_flags(0));
    cluster.start(3, ep, client_flags(1));
  };
  const nlohmann::json reference = cleave::train_split(config(), o);
  cluster.stop();

  pid_t example = -1;
  const std::string log = cluster.dir() + "/example.log";
  o.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep);
    cluster.start(2, ep, client_flags(0));
    example = cleave::spawn({std::string(CLEAVE_BINARY_DIR) + "/apps/examples/split_client", "--coordinator", ep,
                             "--key", cluster.dir() + "/dev3.key", "--coordinator-key",
                             cluster.dir() + "/coordinator.pub", "--shard", "1/2", "--seed", "11", "--limit",
                             std::to_string(kLimit), "--limit-test", "200", "--backend", "cpu", "--threads", "1"},
                            log);
  };
  const nlohmann::json run = cleave::train_split(config(), o);
  const int code = exit_code(example);
  if (code == -1) cleave::terminate(example, 2000);
  const std::string out = read_text(log);
  INFO(out << cluster.log(1) << cluster.log(2));
  CHECK(code == 0);
  CHECK(out.find("shard 1/2 (iid): 320 samples, 100 test samples") != std::string::npos);
  CHECK(out.find("progress: connected") != std::string::npos);
  CHECK(out.find("progress: job started") != std::string::npos);
  CHECK(out.find("progress: job ended") != std::string::npos);
  CHECK(out.find("progress: step 5") != std::string::npos);  // its 5 batches are reported (printed every 5th)
  CHECK(out.find("split_client: done, 1 job(s)") != std::string::npos);

  REQUIRE(run["steps"] == reference["steps"]);
  REQUIRE(run["losses"].size() == reference["losses"].size());
  REQUIRE(run["losses"].size() == 10);  // 2 x 320 / 64
  for (size_t i = 0; i < run["losses"].size(); ++i) {
    INFO("step " << i);
    const double a = run["losses"][i].get<double>(), b = reference["losses"][i].get<double>();
    CHECK(std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b)));
  }
  // Evaluation: on the same test samples, with the same results.
  CHECK(run["test_samples"] == reference["test_samples"]);
  CHECK(run["test_samples"].get<int64_t>() == 200);
  CHECK(std::abs(run["test_loss"].get<double>() - reference["test_loss"].get<double>()) <=
        1e-6 * std::abs(reference["test_loss"].get<double>()));
  CHECK(run["test_accuracy"] == reference["test_accuracy"]);
  CHECK(run["rounds"][0]["per_client"] == reference["rounds"][0]["per_client"]);
}
