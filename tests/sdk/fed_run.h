// fed_run.h: what the SDK's federated tests share: a real `cleave fed`
// coordinator process over a DaemonCluster's keys, cleaved's data flags, and
// an app whose data callback serves a Fashion-MNIST shard.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/processes.h"
#include "cleave/cleave.h"
#include "core/data/dataset.h"
#include "integration/daemon_cluster.h"

#include <catch2/catch.hpp>

namespace cleave::testing::sdk {

using namespace std::chrono_literals;
using ::cleave::read_text;

constexpr int64_t kLimit = 1200;  // training samples sharded over the two clients
constexpr int kRounds = 2;

// cleaved's data flags for shard i of 2.
inline std::vector<std::string> client_flags(int shard) {
  return {"--dataset", "fashion-mnist", "--shard", std::to_string(shard) + "/2", "--seed", "11",
          "--limit-train", std::to_string(kLimit)};
}

// A `cleave fed` process over the cluster's keys (`rounds` rounds, two
// clients); returns once it listens.
struct FedRun {
  FedRun(const DaemonCluster& cluster, const std::string& tag, int rounds = kRounds)
      : log(cluster.dir() + "/" + tag + ".log") {
    save = cluster.dir() + "/" + tag + ".ckpt";
    json = cluster.dir() + "/" + tag + ".json";
    pid = cleave::spawn({std::string(CLEAVE_BINARY_DIR) + "/apps/cleave/cleave", "fed", "--model",
                         std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json", "--dataset", "fashion-mnist",
                         "--clients", "2", "--min-clients", "2", "--rounds", std::to_string(rounds), "--batch", "32",
                         "--seed", "5", "--limit-test", "500", "--threads", "1", "--key", cluster.coordinator_key(),
                         "--allow", cluster.allow(), "--listen", "tcp://127.0.0.1:*", "--register-timeout", "60000",
                         "--json", json, "--save", save, "--shutdown-clients"},
                        log);
    for (int i = 0; i < 300 && read_text(log).find("listening on ") == std::string::npos; ++i)
      std::this_thread::sleep_for(100ms);
    const std::string text = read_text(log);
    const size_t at = text.find("listening on ");
    REQUIRE(at != std::string::npos);
    endpoint = text.substr(at + 13, text.find(',', at + 13) - at - 13);
  }
  // The coordinator's exit status (waits up to two minutes).
  int wait() {
    for (int i = 0; i < 1200; ++i) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
      }
      std::this_thread::sleep_for(100ms);
    }
    return -1;
  }
  ~FedRun() {
    if (pid > 0) cleave::terminate(pid, 2000);
  }
  std::string log, save, json, endpoint;
  pid_t pid = -1;
};

// What the SDK client's callbacks see.
struct App {
  cleave::Dataset shard;
  std::mutex mutex;
  std::vector<int64_t> rounds;
  std::vector<double> losses;
  int fills = 0;
};

inline int64_t fill(void* user, const int64_t* indices, int64_t count, float* inputs, float* labels) {
  auto* app = static_cast<App*>(user);
  const int64_t per = app->shard.sample_numel();
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = indices[k];
    if (i < 0 || i >= app->shard.size()) return -1;
    std::copy_n(app->shard.x.data() + i * per, per, inputs + k * per);
    labels[k] = app->shard.y[static_cast<size_t>(i)];
  }
  ++app->fills;
  return count;
}

inline void on_progress(void* user, const cleave_progress* p) {
  auto* app = static_cast<App*>(user);
  if (p->event != CLEAVE_EVENT_ROUND) return;
  std::lock_guard<std::mutex> lock(app->mutex);
  app->rounds.push_back(p->step);
  app->losses.push_back(p->loss);
}

// An SDK federated client of `endpoint` as dev2 of `cluster`, serving `app`'s shard.
// `progress` may be null; `data` is the data callback (default: serve the shard).
inline cleave_client* make_fed_client(const DaemonCluster& cluster, const std::string& endpoint, App& app,
                                      cleave_progress_fn progress, cleave_fill_fn data = fill) {
  cleave_options* o = nullptr;
  REQUIRE(cleave_options_create(&o) == CLEAVE_OK);
  REQUIRE(cleave_options_set_coordinator(o, endpoint.c_str()) == CLEAVE_OK);
  REQUIRE(cleave_options_set_key_files(o, (cluster.dir() + "/dev2.key").c_str(),
                                       (cluster.dir() + "/coordinator.pub").c_str()) == CLEAVE_OK);
  REQUIRE(cleave_options_set_backend(o, "cpu", 1) == CLEAVE_OK);
  REQUIRE(cleave_options_set_role(o, CLEAVE_ROLE_FED_CLIENT) == CLEAVE_OK);
  REQUIRE(cleave_options_set_connect_timeout(o, 30000) == CLEAVE_OK);
  const int64_t shape[] = {1, 28, 28};
  REQUIRE(cleave_options_set_data(o, app.shard.size(), shape, 3, 10, "1/2", data, &app) == CLEAVE_OK);
  REQUIRE(cleave_options_set_progress_callback(o, progress, &app) == CLEAVE_OK);
  cleave_client* c = nullptr;
  REQUIRE(cleave_client_create(o, &c) == CLEAVE_OK);
  cleave_options_destroy(o);
  return c;
}

}  // namespace cleave::testing::sdk
