// test_sdk_misuse.cpp: misuse of the SDK's C API returns a status and a
// message, never a crash or a hang (issue 14): null handles and arguments,
// calls in the wrong order, bad key bytes, an unreachable coordinator (within
// the connect timeout), data callbacks that fail, return short, give bad labels
// or (C++) throw, stop from another thread, destroy while running.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cleave/cleave.h"
#include "cleave/cleave.hpp"
#include "integration/daemon_cluster.h"
#include "transport/keys.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string last_error() { return cleave_last_error(); }

// Keys on disk for one device and a coordinator, in a fresh temp dir.
struct Keys {
  Keys() {
    char tmpl[] = "/tmp/cleave-sdk-XXXXXX";
    dir = mkdtemp(tmpl);
    device = cleave::transport::generate_keypair();
    coordinator = cleave::transport::generate_keypair();
    cleave::transport::write_keypair(dir, "app1", device, true);
    cleave::transport::write_keypair(dir, "coordinator", coordinator, true);
  }
  ~Keys() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string dir;
  cleave::transport::KeyPair device, coordinator;
};

// A tcp:// endpoint nobody listens on.
std::string dead_endpoint() { return "tcp://127.0.0.1:" + std::to_string(cleave::testing::free_loopback_port()); }

// Options for a client of a dead endpoint with Z85 keys, name app1, CPU, one thread.
cleave_options* make_options(const Keys& keys, int connect_timeout_ms) {
  cleave_options* o = nullptr;
  REQUIRE(cleave_options_create(&o) == CLEAVE_OK);
  REQUIRE(cleave_options_set_coordinator(o, dead_endpoint().c_str()) == CLEAVE_OK);
  REQUIRE(cleave_options_set_keys_z85(o, keys.device.secret_key.c_str(), keys.coordinator.public_key.c_str()) ==
          CLEAVE_OK);
  REQUIRE(cleave_options_set_name(o, "app1") == CLEAVE_OK);
  REQUIRE(cleave_options_set_backend(o, "cpu", 1) == CLEAVE_OK);
  REQUIRE(cleave_options_set_connect_timeout(o, connect_timeout_ms) == CLEAVE_OK);
  return o;
}

// The app's data for the data-callback cases: 1000 samples of 4 floats, 3 classes.
struct FillState {
  int mode = 0;  // 0: good, 1: fail, 2: short, 3: bad label
  std::atomic<int> calls{0};
};

int64_t fill(void* user, const int64_t* indices, int64_t count, float* inputs, float* labels) {
  auto* s = static_cast<FillState*>(user);
  ++s->calls;
  if (s->mode == 1) return -1;
  if (s->mode == 2 && indices[0] >= 512) return count - 1;
  for (int64_t k = 0; k < count; ++k) {
    for (int j = 0; j < 4; ++j) inputs[k * 4 + j] = static_cast<float>(indices[k] % 7) * 0.1f;
    labels[k] = s->mode == 3 && indices[k] == 700 ? 3.0f : static_cast<float>(indices[k] % 3);
  }
  return count;
}

// Runs a federated client over `state`'s data against a dead endpoint; returns how it ended.
cleave_status run_with_data(const Keys& keys, FillState& state) {
  cleave_options* o = make_options(keys, 500);
  const int64_t shape[] = {4};
  REQUIRE(cleave_options_set_data(o, 1000, shape, 1, 3, "0/1", fill, &state) == CLEAVE_OK);
  REQUIRE(cleave_options_set_role(o, CLEAVE_ROLE_FED_CLIENT) == CLEAVE_OK);
  cleave_client* c = nullptr;
  REQUIRE(cleave_client_create(o, &c) == CLEAVE_OK);
  cleave_options_destroy(o);  // the client keeps its own copy
  REQUIRE(cleave_client_start(c) == CLEAVE_OK);
  const cleave_status s = cleave_client_wait(c, 30000);
  INFO(last_error());
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);
  return s;
}

}  // namespace

TEST_CASE("SDK: null handles and null arguments return INVALID_ARGUMENT with a message", "[sdk]") {
  cleave_options* o = nullptr;
  REQUIRE(cleave_options_create(&o) == CLEAVE_OK);
  const int64_t shape[] = {4};
  cleave_client_info info{};
  cleave_client* c = nullptr;
  const cleave_status statuses[] = {
      cleave_options_create(nullptr),
      cleave_options_set_coordinator(nullptr, "tcp://127.0.0.1:1"),
      cleave_options_set_coordinator(o, nullptr),
      cleave_options_set_coordinator(o, "127.0.0.1:1"),
      cleave_options_set_key_files(o, nullptr, "x.pub"),
      cleave_options_set_keys_z85(o, "a", nullptr),
      cleave_options_set_name(o, nullptr),
      cleave_options_set_name(o, "no/slash"),
      cleave_options_set_backend(o, "tpu", 0),
      cleave_options_set_backend(o, "cpu", -1),
      cleave_options_set_memory_limit(nullptr, 0),
      cleave_options_set_bandwidth_limit(o, -1),
      cleave_options_set_connect_timeout(o, -5),
      cleave_options_set_max_jobs(o, -1),
      cleave_options_set_role(o, static_cast<cleave_role>(7)),
      cleave_options_set_data(o, 10, shape, 1, 3, "0/1", nullptr, nullptr),
      cleave_options_set_data(o, 0, shape, 1, 3, "0/1", fill, nullptr),
      cleave_options_set_data(o, 10, shape, 5, 3, "0/1", fill, nullptr),
      cleave_options_set_data(o, 10, shape, 1, 3, "2/2", fill, nullptr),
      cleave_options_set_progress_callback(nullptr, nullptr, nullptr),
      cleave_options_set_log_callback(nullptr, nullptr, nullptr),
      cleave_client_create(nullptr, &c),
      cleave_client_create(o, nullptr),
      cleave_client_create(o, &c),  // no coordinator, no keys
      cleave_client_start(nullptr),
      cleave_client_stop(nullptr),
      cleave_client_wait(nullptr, 0),
      cleave_client_get_status(nullptr, &info),
      cleave_client_release_memory(nullptr),
  };
  int i = 0;
  for (cleave_status s : statuses) {
    INFO("call " << i++);
    CHECK(s == CLEAVE_ERR_INVALID_ARGUMENT);
  }
  CHECK(c == nullptr);
  // Each failure leaves its own message: the last one names the function.
  CHECK(cleave_client_get_status(nullptr, &info) == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(last_error().find("cleave_client_get_status") != std::string::npos);
  CHECK(cleave_options_set_data(o, 10, shape, 1, 3, "2/2", fill, nullptr) == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(last_error().find("2/2") != std::string::npos);
  CHECK(cleave_options_destroy(nullptr) == CLEAVE_OK);
  CHECK(cleave_client_destroy(nullptr) == CLEAVE_OK);
  cleave_options_destroy(o);
}

TEST_CASE("SDK: bad key bytes and incomplete options are refused when set", "[sdk]") {
  Keys keys;
  cleave_options* o = nullptr;
  REQUIRE(cleave_options_create(&o) == CLEAVE_OK);
  CHECK(cleave_options_set_keys_z85(o, "not a key", keys.coordinator.public_key.c_str()) == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(last_error().find("Z85") != std::string::npos);
  std::string bad = keys.device.secret_key;
  bad[3] = '"';  // not a Z85 character
  CHECK(cleave_options_set_keys_z85(o, bad.c_str(), keys.coordinator.public_key.c_str()) == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(cleave_options_set_key_files(o, (keys.dir + "/missing.key").c_str(), (keys.dir + "/coordinator.pub").c_str()) ==
        CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(last_error().find("missing.key") != std::string::npos);
  std::ofstream(keys.dir + "/garbage.pub") << "0123\n";
  CHECK(cleave_options_set_key_files(o, (keys.dir + "/app1.key").c_str(), (keys.dir + "/garbage.pub").c_str()) ==
        CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(last_error().find("garbage.pub") != std::string::npos);
  // Good key files: the name defaults to the key's stem; a data role without data is refused.
  REQUIRE(cleave_options_set_key_files(o, (keys.dir + "/app1.key").c_str(), (keys.dir + "/coordinator.pub").c_str()) ==
          CLEAVE_OK);
  REQUIRE(cleave_options_set_coordinator(o, dead_endpoint().c_str()) == CLEAVE_OK);
  REQUIRE(cleave_options_set_role(o, CLEAVE_ROLE_FED_CLIENT) == CLEAVE_OK);
  cleave_client* c = nullptr;
  CHECK(cleave_client_create(o, &c) == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(last_error().find("cleave_options_set_data") != std::string::npos);
  REQUIRE(cleave_options_set_role(o, CLEAVE_ROLE_STAGE) == CLEAVE_OK);
  CHECK(cleave_client_create(o, &c) == CLEAVE_OK);
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);  // never started
  // Z85 keys carry no name.
  REQUIRE(cleave_options_set_keys_z85(o, keys.device.secret_key.c_str(), keys.coordinator.public_key.c_str()) == CLEAVE_OK);
  CHECK(cleave_client_create(o, &c) == CLEAVE_ERR_INVALID_ARGUMENT);
  CHECK(last_error().find("name") != std::string::npos);
  cleave_options_destroy(o);
}

TEST_CASE("SDK: calls in the wrong order return WRONG_STATE, and an unreachable coordinator ends within the connect timeout",
          "[sdk]") {
  Keys keys;
  cleave_options* o = make_options(keys, 1500);
  cleave_client* c = nullptr;
  REQUIRE(cleave_client_create(o, &c) == CLEAVE_OK);
  cleave_options_destroy(o);
  CHECK(cleave_client_wait(c, 0) == CLEAVE_ERR_WRONG_STATE);
  CHECK(!last_error().empty());
  CHECK(cleave_client_stop(c) == CLEAVE_ERR_WRONG_STATE);
  cleave_client_info info{};
  REQUIRE(cleave_client_get_status(c, &info) == CLEAVE_OK);
  CHECK(info.state == CLEAVE_STATE_CREATED);
  CHECK(info.role == CLEAVE_ROLE_STAGE);
  CHECK(cleave_client_release_memory(c) == CLEAVE_OK);

  const auto t0 = Clock::now();
  REQUIRE(cleave_client_start(c) == CLEAVE_OK);
  CHECK(cleave_client_start(c) == CLEAVE_ERR_WRONG_STATE);
  CHECK(last_error().find("already started") != std::string::npos);
  CHECK(cleave_client_wait(c, 0) == CLEAVE_ERR_TIMEOUT);  // still dialling
  const cleave_status s = cleave_client_wait(c, 20000);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(last_error());
  CHECK(s == CLEAVE_ERR_UNREACHABLE);
  CHECK(last_error().find("no connection to the coordinator") != std::string::npos);
  CHECK(seconds >= 1.4);
  CHECK(seconds < 1.5 + 3.0);  // the timeout, plus start-up (device, GFLOP/s probe)
  REQUIRE(cleave_client_get_status(c, &info) == CLEAVE_OK);
  CHECK(info.state == CLEAVE_STATE_ENDED);
  CHECK(cleave_client_wait(c, 0) == CLEAVE_ERR_UNREACHABLE);  // the same answer again
  CHECK(cleave_client_stop(c) == CLEAVE_OK);                  // after the end: nothing happens
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);
}

TEST_CASE("SDK: stop from another thread ends the run with STOPPED, and destroy while running stops and joins", "[sdk]") {
  Keys keys;
  cleave_options* o = make_options(keys, 0);  // keeps dialling forever
  cleave_client *a = nullptr, *b = nullptr;
  REQUIRE(cleave_client_create(o, &a) == CLEAVE_OK);
  REQUIRE(cleave_client_create(o, &b) == CLEAVE_OK);
  cleave_options_destroy(o);
  REQUIRE(cleave_client_start(a) == CLEAVE_OK);
  REQUIRE(cleave_client_start(b) == CLEAVE_OK);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread stopper([a] { CHECK(cleave_client_stop(a) == CLEAVE_OK); });
  stopper.join();
  CHECK(cleave_client_wait(a, 10000) == CLEAVE_ERR_STOPPED);
  CHECK(last_error().find("stopped") != std::string::npos);
  CHECK(cleave_client_destroy(a) == CLEAVE_OK);
  const auto t0 = Clock::now();
  CHECK(cleave_client_destroy(b) == CLEAVE_OK);  // running: stopped and joined
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 5.0);
}

TEST_CASE("SDK: a data callback that fails, returns short or gives bad labels ends with DATA_CALLBACK", "[sdk]") {
  Keys keys;
  FillState good;
  CHECK(run_with_data(keys, good) == CLEAVE_ERR_UNREACHABLE);  // the data was read; then nobody answered
  CHECK(good.calls == 4);                                        // 1000 samples in chunks of 256
  FillState failing;
  failing.mode = 1;
  CHECK(run_with_data(keys, failing) == CLEAVE_ERR_DATA_CALLBACK);
  CHECK(last_error().find("failed") != std::string::npos);
  CHECK(failing.calls == 1);
  FillState short_data;
  short_data.mode = 2;
  CHECK(run_with_data(keys, short_data) == CLEAVE_ERR_DATA_CALLBACK);
  CHECK(last_error().find("short") != std::string::npos);
  CHECK(last_error().find("[512, 768)") != std::string::npos);
  FillState bad_label;
  bad_label.mode = 3;
  CHECK(run_with_data(keys, bad_label) == CLEAVE_ERR_DATA_CALLBACK);
  CHECK(last_error().find("invalid") != std::string::npos);
}

TEST_CASE("SDK C++: a throwing data callback becomes DATA_CALLBACK with its message, and wrong calls throw Error",
          "[sdk]") {
  Keys keys;
  cleave::Options o;
  o.coordinator(dead_endpoint()).keys_z85(keys.device.secret_key, keys.coordinator.public_key).name("app1");
  o.backend("cpu", 1).connect_timeout_ms(500).role(CLEAVE_ROLE_FED_CLIENT);
  o.data(100, {2, 2}, 2, "0/1", [](const int64_t*, int64_t, float*, float*) -> int64_t {
    throw std::runtime_error("the camera roll is locked");
  });
  try {
    o.name("bad name");
    FAIL("no exception");
  } catch (const cleave::Error& e) {
    CHECK(e.status() == CLEAVE_ERR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("bad name") != std::string::npos);
  }
  cleave::Client c(o);
  c.start();
  CHECK_THROWS_AS(c.start(), cleave::Error);
  try {
    c.wait(30000);
    FAIL("no exception");
  } catch (const cleave::Error& e) {
    CHECK(e.status() == CLEAVE_ERR_DATA_CALLBACK);
    CHECK(std::string(e.what()).find("the camera roll is locked") != std::string::npos);
  }
  CHECK(c.status().state == CLEAVE_STATE_ENDED);
}
