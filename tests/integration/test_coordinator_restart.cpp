// test_coordinator_restart.cpp: issue 15's "a daemon whose coordinator is
// killed registers with the next coordinator and trains again without
// restart". A `cleave train` pipeline coordinator process runs a long job on
// two `cleaved` daemons and is killed with SIGKILL once both hold their
// stages; the daemons abandon the job when the coordinator falls silent
// (--coordinator-timeout), free it and register again; a new coordinator on
// the same endpoint and key then trains to the end with the same two daemon
// processes (the same PIDs, never restarted), and its result is the
// uninterrupted run's.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/processes.h"
#include "child_process.h"
#include "integration/daemon_cluster.h"
#include "skip.h"

namespace {

using cleave::testing::count_of;
using cleave::testing::DaemonCluster;
using cleave::testing::read_text;
using cleave::testing::wait_exit;
using namespace std::chrono_literals;

// A `cleave train` coordinator of the cluster's two daemons on `endpoint`,
// split evenly (--planner balance): the test is of recovery, and a profiled
// plan on a loaded machine may leave one daemon without a stage (it measures
// how much the two slow each other down on one host).
pid_t start_coordinator(const DaemonCluster& cluster, const std::string& endpoint, int64_t limit_train,
                        const std::string& tag) {
  return cleave::spawn({std::string(CLEAVE_BINARY_DIR) + "/apps/cleave/cleave", "train", "--model",
                        std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json", "--devices", "2", "--epochs", "1",
                        "--batch", "32", "--seed", "3", "--limit-train", std::to_string(limit_train), "--limit-test",
                        "200", "--threads", "1", "--key", cluster.coordinator_key(), "--allow", cluster.allow(),
                        "--listen", endpoint, "--register-timeout", "60000", "--planner", "balance", "--json",
                        cluster.dir() + "/" + tag + ".json", "--no-progress"},
                       cluster.dir() + "/" + tag + ".log");
}

bool alive(pid_t pid) { return kill(pid, 0) == 0; }

}  // namespace

TEST_CASE("daemons whose coordinator is killed register with the next one and train again without a restart",
          "[integration][pipeline][recovery]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(2);
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(cleave::testing::free_loopback_port());
  const std::vector<std::string> flags = {"--max-jobs", "2", "--coordinator-timeout", "2000"};
  // The first coordinator: a run long enough to be killed in the middle (60000 samples).
  const pid_t first = start_coordinator(cluster, endpoint, 60000, "first");
  const pid_t dev1 = cluster.start(1, endpoint, flags);
  const pid_t dev2 = cluster.start(2, endpoint, flags);
  for (int i = 0; i < 600; ++i) {
    if (count_of(cluster.log(1) + cluster.log(2), "assigned stage") >= 2) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(read_text(cluster.dir() + "/first.log") << cluster.log(1) << cluster.log(2));
  REQUIRE(count_of(cluster.log(1) + cluster.log(2), "assigned stage") == 2);
  std::this_thread::sleep_for(1s);  // some steps run
  REQUIRE(kill(first, SIGKILL) == 0);
  REQUIRE(wait_exit(first, 10) == 128);

  // The daemons notice the silence, abandon the job and wait for the next coordinator.
  for (int i = 0; i < 300; ++i) {
    if (count_of(cluster.log(1) + cluster.log(2), "abandoned") >= 2) break;
    std::this_thread::sleep_for(100ms);
  }
  REQUIRE(count_of(cluster.log(1) + cluster.log(2), "abandoned") >= 2);
  CHECK(alive(dev1));
  CHECK(alive(dev2));

  // The next coordinator, same endpoint and key: a short run, to the end.
  const pid_t second = start_coordinator(cluster, endpoint, 320, "second");
  const int code = wait_exit(second, 120);
  INFO(read_text(cluster.dir() + "/second.log") << cluster.log(1) << cluster.log(2));
  REQUIRE(code == 0);
  // Both daemons served it: their second job, and then they exit as --max-jobs 2 says.
  CHECK(count_of(cluster.log(1), "assigned stage") == 2);
  CHECK(count_of(cluster.log(2), "assigned stage") == 2);
  CHECK(wait_exit(dev1, 20) == 0);
  CHECK(wait_exit(dev2, 20) == 0);

  // The same result as an uninterrupted run of the second job.
  DaemonCluster fresh(2);
  const std::string fresh_endpoint = "tcp://127.0.0.1:" + std::to_string(cleave::testing::free_loopback_port());
  const pid_t reference = start_coordinator(fresh, fresh_endpoint, 320, "reference");
  fresh.start(1, fresh_endpoint);
  fresh.start(2, fresh_endpoint);
  REQUIRE(wait_exit(reference, 120) == 0);
  const auto got = nlohmann::json::parse(read_text(cluster.dir() + "/second.json"));
  const auto want = nlohmann::json::parse(read_text(fresh.dir() + "/reference.json"));
  REQUIRE(got["losses"].size() == want["losses"].size());
  REQUIRE(got["losses"].size() == 10);
  for (size_t i = 0; i < got["losses"].size(); ++i)
    CHECK(std::abs(got["losses"][i].get<double>() - want["losses"][i].get<double>()) <=
          1e-6 * std::abs(want["losses"][i].get<double>()));
  CHECK(got["test_accuracy"] == want["test_accuracy"]);
}
