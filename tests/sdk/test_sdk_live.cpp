// test_sdk_live.cpp: misuse of the SDK while a client runs (issue 14): a
// progress callback that is slow, stop from another thread in the middle of a
// federated round, a callback that calls wait or destroy on its own client;
// options by name (cleave_options_set) as cleaved gives them; the roles: an
// app that joined as a federated client is never made a split client, and a
// stage client hosts a pipeline stage, reporting every step.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cleave/cleave.h"
#include "cleave/cleave.hpp"
#include "core/data/shard.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/runtime/coordinator/split_coordinator.h"
#include "core/train/local_trainer.h"
#include "core/train/train_config.h"
#include "integration/daemon_cluster.h"
#include "log_capture.h"
#include "sdk/fed_run.h"
#include "skip.h"

namespace {

using cleave::testing::DaemonCluster;
using namespace cleave::testing::sdk;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void load_shard(App& app) {
  const cleave::Dataset all = cleave::load_fashion_mnist("", /*train=*/true, kLimit);
  app.shard = cleave::subset(all, cleave::shard_indices(all, 1, 2, "iid", 11));
}

// A progress callback that takes 1.5 s for every round it is told about.
void slow_progress(void* user, const cleave_progress* p) {
  on_progress(user, p);
  if (p->event == CLEAVE_EVENT_ROUND) std::this_thread::sleep_for(1500ms);
}

}  // namespace

TEST_CASE("SDK: a slow progress callback delays the client but the run completes", "[sdk][integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(2);
  App app;
  load_shard(app);
  FedRun run(cluster, "slow", 3);
  cluster.start(1, run.endpoint, client_flags(0));
  cleave_client* c = make_fed_client(cluster, run.endpoint, app, slow_progress);
  const auto t0 = Clock::now();
  REQUIRE(cleave_client_start(c) == CLEAVE_OK);
  const cleave_status s = cleave_client_wait(c, 180000);
  INFO("SDK client: " << cleave_last_error());
  const int code = run.wait();
  INFO(read_text(run.log) << cluster.log(1));
  CHECK(s == CLEAVE_OK);
  CHECK(code == 0);
  CHECK(app.rounds == std::vector<int64_t>{0, 1, 2});  // every round told, in order, none lost
  CHECK(seconds_since(t0) >= 4.5);                     // the callback's time was spent on the client's thread
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);
}

TEST_CASE("SDK: stop from another thread during a federated round ends the client promptly with STOPPED",
          "[sdk][integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(2);
  App app;
  load_shard(app);
  FedRun run(cluster, "stop", 200);  // far more rounds than the test waits for
  cluster.start(1, run.endpoint, client_flags(0));
  cleave_client* c = make_fed_client(cluster, run.endpoint, app, on_progress);
  REQUIRE(cleave_client_start(c) == CLEAVE_OK);
  // Wait for the job to run and a round to be trained.
  cleave_client_info info{};
  for (int i = 0; i < 600; ++i) {
    REQUIRE(cleave_client_get_status(c, &info) == CLEAVE_OK);
    if (info.state == CLEAVE_STATE_IN_JOB && info.step >= 0) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(read_text(run.log));
  REQUIRE(info.state == CLEAVE_STATE_IN_JOB);
  REQUIRE(info.job == CLEAVE_JOB_FED);
  const auto t0 = Clock::now();
  std::thread stopper([c] { CHECK(cleave_client_stop(c) == CLEAVE_OK); });
  stopper.join();
  const cleave_status s = cleave_client_wait(c, 20000);
  INFO(cleave_last_error());
  CHECK(s == CLEAVE_ERR_STOPPED);
  CHECK(seconds_since(t0) < 10.0);  // within a round or so, not at the end of the run
  REQUIRE(cleave_client_get_status(c, &info) == CLEAVE_OK);
  CHECK(info.state == CLEAVE_STATE_ENDED);
  CHECK(info.job == CLEAVE_JOB_NONE);
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);
}

namespace {

// A data callback that calls wait and destroy on its own client.
struct Reentrant {
  cleave_client* client = nullptr;
  std::atomic<int> wait_status{-1}, destroy_status{-1};
  std::string wait_message;
};

int64_t reentrant_fill(void* user, const int64_t* indices, int64_t count, float* inputs, float* labels) {
  auto* r = static_cast<Reentrant*>(user);
  r->wait_status = cleave_client_wait(r->client, 1000);
  r->wait_message = cleave_last_error();
  r->destroy_status = cleave_client_destroy(r->client);
  for (int64_t k = 0; k < count; ++k) {
    inputs[k * 2] = inputs[k * 2 + 1] = 0.5f;
    labels[k] = static_cast<float>(indices[k] % 2);
  }
  return count;
}

}  // namespace

TEST_CASE("SDK: a callback that calls wait or destroy on its own client gets WRONG_STATE, and the client carries on",
          "[sdk]") {
  const auto keys = cleave::transport::generate_keypair(), coordinator = cleave::transport::generate_keypair();
  cleave::Options o;
  o.coordinator("tcp://127.0.0.1:" + std::to_string(cleave::testing::free_loopback_port()))
      .keys_z85(keys.secret_key, coordinator.public_key)
      .name("app1")
      .backend("cpu", 1)
      .connect_timeout_ms(500)
      .role(CLEAVE_ROLE_FED_CLIENT);
  Reentrant r;
  const int64_t shape[] = {2};
  REQUIRE(cleave_options_set_data(o.get(), 10, shape, 1, 2, "0/1", reentrant_fill, &r) == CLEAVE_OK);
  REQUIRE(cleave_client_create(o.get(), &r.client) == CLEAVE_OK);
  REQUIRE(cleave_client_start(r.client) == CLEAVE_OK);
  const cleave_status s = cleave_client_wait(r.client, 20000);
  CHECK(r.wait_status == CLEAVE_ERR_WRONG_STATE);
  CHECK(r.wait_message.find("own callback") != std::string::npos);
  CHECK(r.destroy_status == CLEAVE_ERR_WRONG_STATE);
  CHECK(s == CLEAVE_ERR_UNREACHABLE);  // the data was read; then nobody answered
  CHECK(cleave_client_destroy(r.client) == CLEAVE_OK);
}

TEST_CASE("SDK: options by name take every cleaved flag's value, and a bad one names the option and changes nothing",
          "[sdk]") {
  cleave::Options o;
  // Every name the header lists, with a value cleaved accepts.
  const std::vector<std::pair<std::string, std::string>> good = {
      {"coordinator", "tcp://127.0.0.1:5555"}, {"name", "board-7"}, {"backend", "cpu"}, {"threads", "2"},
      {"memory-limit", "512M"}, {"bandwidth-limit", "100mbit"}, {"connect-timeout", "2.5"}, {"max-jobs", "3"},
      {"role", "data-client"}, {"peer-bind", "tcp://0.0.0.0:*"}, {"coordinator-timeout", "20000"},
      {"insecure", "true"}, {"log-level", "info"}, {"dataset", "fashion-mnist"}, {"data", "/tmp/x.csv"},
      {"dataset-dir", "/tmp"}, {"shard", "1/4"}, {"partition", "dirichlet:0.5"}, {"seed", "7"},
      {"limit-train", "1000"}, {"poison", "sign-flip"}};
  for (const auto& [name, value] : good) {
    INFO(name << " = " << value);
    CHECK(cleave_options_set(o.get(), name.c_str(), value.c_str()) == CLEAVE_OK);
  }
  struct Bad {
    std::string name, value, says;
  };
  const std::vector<Bad> bad = {{"memory-limit", "12Q", "memory-limit"}, {"threads", "-1", "threads"},
                                {"max-jobs", "two", "max-jobs"},         {"shard", "4/4", "shard"},
                                {"partition", "random", "random"},      {"role", "boss", "fed-client"},
                                {"insecure", "maybe", "true or false"}, {"connect-timeout", "-3", "connect-timeout"},
                                {"log-level", "loud", "debug"},         {"key", "/nonexistent/dev.key", "/nonexistent"},
                                {"poison", "scale:x", "scale:K"},       {"colour", "blue", "unknown option 'colour'"}};
  for (const Bad& b : bad) {
    INFO(b.name << " = " << b.value);
    CHECK(cleave_options_set(o.get(), b.name.c_str(), b.value.c_str()) == CLEAVE_ERR_INVALID_ARGUMENT);
    const std::string m = cleave_last_error();
    INFO(m);
    CHECK(m.rfind("cleave_options_set: ", 0) == 0);
    CHECK(m.find(b.says) != std::string::npos);
  }
  CHECK(cleave_options_set(o.get(), nullptr, "x") == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(cleave_options_set(nullptr, "name", "x") == CLEAVE_ERR_INVALID_ARGUMENT);
  // A refused value leaves the option as it was.
  cleave::Options fresh;
  fresh.set("coordinator", "tcp://127.0.0.1:5555").set("insecure", "true").set("name", "n1").set("role", "fed-client");
  CHECK(cleave_options_set(fresh.get(), "role", "stage-ish") == CLEAVE_ERR_INVALID_ARGUMENT);
  cleave_client* c = nullptr;
  CHECK(cleave_client_create(fresh.get(), &c) == CLEAVE_ERR_INVALID_ARGUMENT);  // still fed-client: needs data
  CHECK(std::string(cleave_last_error()).find("needs data") != std::string::npos);
  // A stage device holds no data; two data sources are one too many.
  fresh.set("role", "stage").set("dataset", "fashion-mnist");
  CHECK(cleave_client_create(fresh.get(), &c) == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(cleave_last_error()).find("holds no data") != std::string::npos);
  fresh.set("role", "fed-client");
  const int64_t shape[] = {2};
  REQUIRE(cleave_options_set_data(fresh.get(), 10, shape, 1, 2, "0/1", reentrant_fill, nullptr) == CLEAVE_OK);
  CHECK(cleave_client_create(fresh.get(), &c) == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(cleave_last_error()).find("two data sources") != std::string::npos);
  CHECK(c == nullptr);
}

TEST_CASE("SDK: an app that joined as a federated client is left out of a split-learning run", "[sdk][integration][split]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(3);  // dev1 a server, dev2 a cleaved client, dev3 the SDK app (federated only)
  cleave::testing::LogCapture logs;
  cleave::SplitOptions so;
  so.clients = 2;
  so.server = "dev1";
  cluster.connect(so);
  so.register_timeout_ms = 10000;  // dev3 registers within it (its log line is checked)
  App app;
  load_shard(app);
  cleave::Options o;
  cleave::Client* sdk = nullptr;
  so.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep);
    cluster.start(2, ep, client_flags(0));
    o.coordinator(ep).key_files(cluster.dir() + "/dev3.key", cluster.dir() + "/coordinator.pub");
    o.backend("cpu", 1).role(CLEAVE_ROLE_FED_CLIENT);
    o.data(app.shard.size(), {1, 28, 28}, 10, "1/2", [&app](const int64_t* idx, int64_t n, float* in, float* lb) {
      return fill(&app, idx, n, in, lb);
    });
    sdk = new cleave::Client(o);
    sdk->start();
  };
  cleave::TrainConfig cfg;
  cfg.model_path = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  cfg.epochs = 1;
  cfg.threads = 1;
  cfg.progress = false;
  CHECK_THROWS(cleave::train_split(cfg, so));  // only one client that may be a split client registered
  CHECK(logs.contains("dev3 joined as a federated client only"));
  REQUIRE(sdk != nullptr);
  const cleave_client_info info = sdk->status();
  CHECK(info.jobs_done == 0);  // it was never given a split job
  CHECK(info.state == CLEAVE_STATE_WAITING);
  delete sdk;
}

namespace {

// What a stage client's progress callback saw.
struct StageSteps {
  std::mutex mutex;
  std::vector<int64_t> steps;
  std::vector<double> losses;
  int jobs_started = 0;
};

void on_stage_progress(void* user, const cleave_progress* p) {
  auto* s = static_cast<StageSteps*>(user);
  std::lock_guard<std::mutex> lock(s->mutex);
  if (p->event == CLEAVE_EVENT_JOB_STARTED && p->job == CLEAVE_JOB_STAGE) ++s->jobs_started;
  if (p->event != CLEAVE_EVENT_STEP) return;
  s->steps.push_back(p->step);
  s->losses.push_back(p->loss);
}

}  // namespace

TEST_CASE("SDK: a stage client hosts a pipeline stage, reports every step (the loss where it is the last) and trains like local training",
          "[sdk][integration][pipeline]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  cleave::TrainConfig cfg;
  cfg.model_path = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  cfg.epochs = 1;
  cfg.batch = 32;
  cfg.seed = 3;
  cfg.limit_train = 320;
  cfg.limit_test = 100;
  cfg.microbatches = 2;
  cfg.threads = 1;
  cfg.progress = false;
  const nlohmann::json local = cleave::train_local(cfg);

  DaemonCluster cluster(2);  // dev1 a cleaved, dev2 this process's SDK client
  cleave::ClusterOptions cl = cluster.options(2);
  cl.shutdown_daemons = true;
  StageSteps seen;
  cleave_client* c = nullptr;
  cl.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep);
    cleave_options* o = nullptr;
    REQUIRE(cleave_options_create(&o) == CLEAVE_OK);
    REQUIRE(cleave_options_set(o, "coordinator", ep.c_str()) == CLEAVE_OK);
    REQUIRE(cleave_options_set(o, "key", (cluster.dir() + "/dev2.key").c_str()) == CLEAVE_OK);
    REQUIRE(cleave_options_set(o, "coordinator-key", (cluster.dir() + "/coordinator.pub").c_str()) == CLEAVE_OK);
    REQUIRE(cleave_options_set(o, "backend", "cpu") == CLEAVE_OK);
    REQUIRE(cleave_options_set(o, "threads", "1") == CLEAVE_OK);
    REQUIRE(cleave_options_set_progress_callback(o, on_stage_progress, &seen) == CLEAVE_OK);
    REQUIRE(cleave_client_create(o, &c) == CLEAVE_OK);
    cleave_options_destroy(o);
    REQUIRE(cleave_client_start(c) == CLEAVE_OK);
  };
  const nlohmann::json piped = cleave::train_pipeline(cfg, cl);
  REQUIRE(c != nullptr);
  const cleave_status s = cleave_client_wait(c, 30000);  // --shutdown-daemons released it
  INFO(cleave_last_error() << cluster.log(1));
  CHECK(s == CLEAVE_OK);
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);

  const auto& a = local["losses"];
  const auto& b = piped["losses"];
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == 10);
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i].get<double>() - b[i].get<double>()) <= 1e-4 * a[i].get<double>());
  bool sdk_last = false;
  for (const auto& st : piped["plan"]) sdk_last = sdk_last || (st["device"] == "dev2" && st["stage"] == 1);
  std::lock_guard<std::mutex> lock(seen.mutex);
  CHECK(seen.jobs_started == 1);
  REQUIRE(seen.steps.size() == a.size());  // one report per step, in order
  for (size_t i = 0; i < seen.steps.size(); ++i) {
    CHECK(seen.steps[i] == static_cast<int64_t>(i));
    // The last stage computes the loss: it reports the step's mean; the first does not (NaN).
    if (sdk_last) CHECK(std::abs(seen.losses[i] - b[i].get<double>()) <= 1e-4 * b[i].get<double>());
    else CHECK(std::isnan(seen.losses[i]));
  }
}

namespace {

struct LogLines {
  std::mutex mutex;
  std::vector<std::pair<cleave_log_level, std::string>> lines;
};

void collect_log(void* user, cleave_log_level level, const char* line) {
  auto* l = static_cast<LogLines*>(user);
  std::lock_guard<std::mutex> lock(l->mutex);
  l->lines.emplace_back(level, line);
}

}  // namespace

TEST_CASE("SDK: a log callback receives the client's log lines with their levels while it runs", "[sdk]") {
  const auto keys = cleave::transport::generate_keypair(), coordinator = cleave::transport::generate_keypair();
  LogLines got;
  cleave_options* o = nullptr;
  REQUIRE(cleave_options_create(&o) == CLEAVE_OK);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(cleave::testing::free_loopback_port());
  REQUIRE(cleave_options_set_coordinator(o, ep.c_str()) == CLEAVE_OK);
  REQUIRE(cleave_options_set_keys_z85(o, keys.secret_key.c_str(), coordinator.public_key.c_str()) == CLEAVE_OK);
  REQUIRE(cleave_options_set_name(o, "logger") == CLEAVE_OK);
  REQUIRE(cleave_options_set_backend(o, "cpu", 1) == CLEAVE_OK);
  REQUIRE(cleave_options_set_connect_timeout(o, 500) == CLEAVE_OK);
  REQUIRE(cleave_options_set_log_callback(o, collect_log, &got) == CLEAVE_OK);
  cleave_client* c = nullptr;
  REQUIRE(cleave_client_create(o, &c) == CLEAVE_OK);
  cleave_options_destroy(o);
  REQUIRE(cleave_client_start(c) == CLEAVE_OK);
  CHECK(cleave_client_wait(c, 20000) == CLEAVE_ERR_UNREACHABLE);
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);
  std::lock_guard<std::mutex> lock(got.mutex);
  bool probe = false, gave_up = false;
  for (const auto& [level, line] : got.lines) {
    probe = probe || (level == CLEAVE_LOG_INFO && line.find("logger") != std::string::npos &&
                      line.find("GFLOP/s measured") != std::string::npos);
    gave_up = gave_up || (level == CLEAVE_LOG_ERROR && line.find("no connection to the coordinator") != std::string::npos);
    CHECK(line.find('\n') == std::string::npos);  // one line each, no newline
  }
  CHECK(probe);
  CHECK(gave_up);
}

namespace {

// Serves the shard for the start-up check, then fails on the 5th batch of training.
int64_t fill_then_fail(void* user, const int64_t* indices, int64_t count, float* inputs, float* labels) {
  auto* app = static_cast<App*>(user);
  const int checks = static_cast<int>((app->shard.size() + 255) / 256);
  if (app->fills >= checks + 4) return -1;
  return fill(user, indices, count, inputs, labels);
}

}  // namespace

TEST_CASE("SDK: a data callback that fails during a federated round ends the client with DATA_CALLBACK",
          "[sdk][integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(2);
  App app;
  load_shard(app);
  FedRun run(cluster, "fail", 5);
  cluster.start(1, run.endpoint, client_flags(0));
  cleave_client* c = make_fed_client(cluster, run.endpoint, app, nullptr, fill_then_fail);
  REQUIRE(cleave_client_start(c) == CLEAVE_OK);
  const cleave_status s = cleave_client_wait(c, 60000);
  const std::string why = cleave_last_error();
  INFO(why << "\n" << read_text(run.log));
  CHECK(s == CLEAVE_ERR_DATA_CALLBACK);
  CHECK(why.find("the data callback failed") != std::string::npos);
  CHECK(why.find("during a job") != std::string::npos);
  CHECK(app.fills == (app.shard.size() + 255) / 256 + 4);  // the check, then four batches, then the failure
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);
}
