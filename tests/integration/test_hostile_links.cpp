// test_hostile_links.cpp: issue 13's transport findings against real `cleave
// fed` coordinator and `cleaved` processes on loopback, with messages crafted
// by the project's own transport code:
//   4. one allow-listed peer sends a ~1 GB frame: the coordinator refuses it
//      without buffering it (its peak RSS stays far below the frame) and the
//      run goes on to its end;
//   6. a key removed from the allow directory (or replaced, then SIGHUP) is
//      revoked while the coordinator runs: logged, its connection closed, its
//      reconnect refused;
//   7. `cleaved` with a wrong --coordinator-key backs off with a few clear
//      lines, and with --connect-timeout exits with status 2.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/processes.h"
#include "integration/daemon_cluster.h"
#include "skip.h"
#include "transport/endpoint.h"
#include "transport/keys.h"

using namespace cleave;
using namespace std::chrono_literals;
using cleave::testing::DaemonCluster;

namespace {

const char* kTinyModel = R"({"name": "tiny", "input": [2], "loss": "cross_entropy",
  "layers": [{"type": "linear", "out_features": 4}, {"type": "relu"}, {"type": "linear", "out_features": 2}]})";

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  REQUIRE(out.good());
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

size_t lines(const std::string& text) { return count(text, "\n"); }

// The lines a daemon wrote about connecting: its log less the start-up lines
// about its device (the measured speed, and on machines whose OpenBLAS runs
// kernels below the CPU, a warning about that), which say nothing of the link.
size_t connection_lines(const std::string& log) {
  return lines(log) - count(log, " GFLOP/s measured\n") - count(log, ": OpenBLAS chose its ");
}

// A field of /proc/PID/status in kB (VmHWM: peak resident set), or -1.
long proc_status_kb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  return -1;
}

long mem_available_kb() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) return std::stol(line.substr(13));
  return -1;
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

// The exit status of `pid` if it ends within `limit`, else nullopt (still running).
std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds limit) {
  std::optional<int> code;
  eventually(
      [&] {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) != pid) return false;
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return true;
      },
      limit);
  return code;
}

// A `cleave fed` coordinator over `cluster`'s keys, training the tiny model on
// a small CSV, started as a child process; endpoint() once it listens.
class FedCoordinator {
 public:
  FedCoordinator(const DaemonCluster& cluster, int clients) : cluster_(cluster) {
    write_file(cluster.dir() + "/tiny.json", kTinyModel);
    write_csv(cluster.dir() + "/train.csv", 128, 1);
    write_csv(cluster.dir() + "/test.csv", 64, 2);
    log_ = cluster.dir() + "/coordinator.log";
    pid_ = spawn({std::string(CLEAVE_BINARY_DIR) + "/apps/cleave/cleave", "fed", "--model", cluster.dir() + "/tiny.json",
                  "--dataset", cluster.dir() + "/train.csv", "--clients", std::to_string(clients), "--rounds", "1",
                  "--batch", "16", "--threads", "1", "--key", cluster.coordinator_key(), "--allow",
                  cluster.allow(), "--listen", "tcp://127.0.0.1:*", "--register-timeout", "60000", "--json",
                  cluster.dir() + "/fed.json", "--shutdown-clients"},
                 log_);
    REQUIRE(eventually([&] { return log().find("listening on ") != std::string::npos; }, 30s));
    const std::string text = log();
    const size_t at = text.find("listening on ") + 13;
    endpoint_ = text.substr(at, text.find(',', at) - at);
  }
  ~FedCoordinator() {
    if (pid_ > 0) terminate(pid_, 2000);
  }
  pid_t pid() const { return pid_; }
  const std::string& endpoint() const { return endpoint_; }
  std::string log() const { return read_text(log_); }
  std::optional<int> wait(std::chrono::milliseconds limit) {
    auto code = wait_exit(pid_, limit);
    if (code) pid_ = -1;
    return code;
  }
  // A client of this coordinator with `name`'s key pair from the cluster dir.
  std::unique_ptr<transport::ClientEndpoint> client(const std::string& name) const {
    transport::ClientOptions o;
    o.connect = endpoint_;
    o.keys = transport::load_secret_key(cluster_.dir() + "/" + name + ".key");
    o.server_public_key = transport::load_public_key(cluster_.dir() + "/coordinator.pub");
    o.label = "test " + name;
    o.auth_backoff_initial_ms = 200;
    o.auth_backoff_max_ms = 400;
    return std::make_unique<transport::ClientEndpoint>(o);
  }

 private:
  static void write_csv(const std::string& path, int rows, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::ofstream out(path);
    out << "label,x0,x1\n";
    for (int i = 0; i < rows; ++i) {
      const float x0 = u(rng), x1 = u(rng);
      out << (x0 > x1 ? 1 : 0) << "," << x0 << "," << x1 << "\n";
    }
    REQUIRE(out.good());
  }

  const DaemonCluster& cluster_;
  std::string log_, endpoint_;
  pid_t pid_ = -1;
};

transport::Message registration(const std::string& name) {
  transport::RegisterMsg r;
  r.device_name = name;
  r.backends = {"cpu"};
  r.software_version = "cleave 0.1.0";
  return transport::message_of(r);
}

}  // namespace

TEST_CASE("a coordinator refuses a 1 GB frame from an allow-listed peer without buffering it and runs on",
          "[integration][security][transport]") {
  const long available_kb = mem_available_kb();
  if (available_kb < (4L << 20)) CLEAVE_SKIP("needs 4 GiB of available memory, the host has " << available_kb << " kB");
  DaemonCluster cluster(1);
  FedCoordinator coordinator(cluster, 1);
  const long hwm_before_kb = proc_status_kb(coordinator.pid(), "VmHWM");
  REQUIRE(hwm_before_kb > 0);

  // dev1's key is on the allow-list: the frame passes CURVE and ZAP and meets the size caps.
  constexpr size_t kFrameBytes = size_t{1} << 30;
  auto hostile = coordinator.client("dev1");
  REQUIRE(hostile->wait_connected(10s));
  std::shared_ptr<std::byte[]> bytes(new std::byte[kFrameBytes]);  // untouched pages: the sender's RSS stays small
  transport::TensorMsg t;
  t.shape = {static_cast<int64_t>(kFrameBytes / sizeof(float))};
  transport::Message big = transport::message_of(t);
  big.payloads.push_back(transport::Payload::borrow(bytes.get(), kFrameBytes, bytes));
  REQUIRE(hostile->send(big));
  // The coordinator drops the connection as soon as it reads the frame's size.
  REQUIRE(eventually([&] { return hostile->stats().disconnects > 0; }, 20s));
  const long hwm_after_kb = proc_status_kb(coordinator.pid(), "VmHWM");
  INFO("coordinator peak RSS " << hwm_before_kb << " kB before, " << hwm_after_kb << " kB after the 1 GiB frame\n"
                               << coordinator.log());
  CHECK(hwm_after_kb - hwm_before_kb < (128L << 10));  // far below the frame (1 GiB = 1048576 kB)
  CHECK(hwm_after_kb < (300L << 10));
  hostile.reset();

  // It keeps serving: a real client registers, trains its round, and the run ends well.
  cluster.start(1, coordinator.endpoint(), {"--dataset", cluster.dir() + "/train.csv", "--shard", "0/1"});
  const auto code = coordinator.wait(60s);
  INFO(coordinator.log() << "\n" << cluster.log(1));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(std::filesystem::exists(cluster.dir() + "/fed.json"));
}

TEST_CASE("a key removed from the allow directory is revoked at once, and a replaced one on SIGHUP",
          "[integration][security][transport]") {
  DaemonCluster cluster(2);
  FedCoordinator coordinator(cluster, 2);  // waits for two clients: neither key is used yet

  auto a = coordinator.client("dev1");
  auto b = coordinator.client("dev2");
  REQUIRE(a->wait_connected(10s));
  REQUIRE(b->wait_connected(10s));
  REQUIRE(a->send(registration("dev1")));
  REQUIRE(b->send(registration("dev2")));
  std::this_thread::sleep_for(300ms);  // both registrations read (their connections are known)

  SECTION("removing dev1.pub revokes dev1 within the poll interval") {
    std::filesystem::remove(cluster.allow() + "/dev1.pub");
    REQUIRE(eventually([&] { return coordinator.log().find("key of dev1 revoked") != std::string::npos; }, 5s));
    INFO(coordinator.log());
    CHECK(coordinator.log().find("closed the connection of revoked dev1") != std::string::npos);
    // Its connection is closed and its reconnect is refused by ZAP.
    CHECK(eventually([&] { return a->failed_handshakes() > 0; }, 5s));
    CHECK(a->last_handshake_failure().find("refused this client's key") != std::string::npos);
    CHECK_FALSE(a->connected());
    CHECK(coordinator.log().find("is not on the allow-list") != std::string::npos);
    // dev2 is untouched.
    CHECK(b->connected());
    CHECK(b->failed_handshakes() == 0);
  }

  SECTION("dev2.pub replaced in place is revoked on SIGHUP") {
    const std::string path = cluster.allow() + "/dev2.pub";
    struct stat before {};
    REQUIRE(::stat(path.c_str(), &before) == 0);
    const auto fresh = transport::generate_keypair();
    write_file(path, fresh.public_key + "\n");
    // Same size and times: only a reload request can notice the new key.
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
    std::this_thread::sleep_for(1500ms);
    REQUIRE(coordinator.log().find("key of dev2 revoked") == std::string::npos);
    REQUIRE(b->connected());

    REQUIRE(::kill(coordinator.pid(), SIGHUP) == 0);
    REQUIRE(eventually([&] { return coordinator.log().find("key of dev2 revoked") != std::string::npos; }, 5s));
    INFO(coordinator.log());
    CHECK(coordinator.log().find("reload requested") != std::string::npos);
    CHECK(eventually([&] { return b->failed_handshakes() > 0; }, 5s));
    CHECK_FALSE(b->connected());
    CHECK(a->connected());  // dev1 is untouched
    // The new key is admitted under the name dev2 at once.
    transport::write_keypair(cluster.dir(), "dev2-new", fresh, true);
    auto renewed = coordinator.client("dev2-new");
    CHECK(renewed->wait_connected(10s));
  }
  // The coordinator survived both and is still waiting for its clients.
  CHECK_FALSE(wait_exit(coordinator.pid(), 0ms).has_value());
}

TEST_CASE("cleaved with a wrong coordinator key backs off with a few clear lines and exits 2 at --connect-timeout",
          "[integration][security][transport]") {
  DaemonCluster cluster(2);
  FedCoordinator coordinator(cluster, 2);
  transport::write_keypair(cluster.dir(), "impostor", transport::generate_keypair(), true);
  auto start = [&](int i, std::vector<std::string> extra) {
    std::vector<std::string> argv = {std::string(CLEAVE_BINARY_DIR) + "/apps/cleaved/cleaved", "--coordinator",
                                     coordinator.endpoint(), "--key", cluster.dir() + "/" + DaemonCluster::name(i) + ".key",
                                     "--coordinator-key", cluster.dir() + "/impostor.pub", "--name",
                                     DaemonCluster::name(i), "--backend", "cpu", "--threads", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return spawn(argv, cluster.dir() + "/" + DaemonCluster::name(i) + ".log");
  };
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t bounded = start(1, {"--connect-timeout", "3"});
  const pid_t patient = start(2, {});

  const auto code = wait_exit(bounded, 15s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string bounded_log = cluster.log(1);
  INFO(bounded_log);
  REQUIRE(code.has_value());
  CHECK(*code == 2);
  CHECK(seconds >= 3.0);
  CHECK(seconds < 10.0);
  CHECK(bounded_log.find("authentication with the coordinator") != std::string::npos);
  CHECK(bounded_log.find("--coordinator-key") != std::string::npos);
  CHECK(bounded_log.find("wrong coordinator key") != std::string::npos);
  CHECK(connection_lines(bounded_log) <= 5);

  // Without --connect-timeout it keeps trying, quietly.
  std::this_thread::sleep_until(t0 + 8500ms);
  const std::string patient_log = cluster.log(2);
  INFO(patient_log);
  CHECK_FALSE(wait_exit(patient, 0ms).has_value());
  CHECK(connection_lines(patient_log) <= 4);
  CHECK(count(patient_log, "retrying in") >= 2);  // it did retry, with growing waits
  terminate(patient, 2000);
  // The coordinator logged the refusals rate-limited, not one line per attempt.
  INFO(coordinator.log());
  CHECK(count(coordinator.log(), "refused a connection") <= 2);
}
