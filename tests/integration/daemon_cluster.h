// daemon_cluster.h: test fixture that creates keys and starts real cleaved
// processes against a coordinator running in the test process. Tests that
// need Fashion-MNIST skip without it: CLEAVE_SKIP_UNLESS_FASHION_MNIST (tests/skip.h).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/data/dataset.h"
#include "core/runtime/coordinator/pipeline.h"
#include "apps/common/processes.h"
#include "transport/keys.h"

namespace cleave::testing {

// A TCP port on 127.0.0.1 that was free a moment ago.
inline int free_loopback_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  const bool ok = s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (s >= 0) close(s);
  return ok ? ntohs(a.sin_port) : 0;
}

class DaemonCluster {
 public:
  // Keys for a coordinator and `devices` daemons dev1..devN in a fresh temp dir;
  // allow/ holds the devices' public keys.
  explicit DaemonCluster(int devices) : devices_(devices) {
    char tmpl[] = "/tmp/cleave-it-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::filesystem::create_directories(dir_ + "/allow");
    transport::write_keypair(dir_, "coordinator", transport::generate_keypair(), true);
    for (int i = 1; i <= devices; ++i) {
      auto f = transport::write_keypair(dir_, name(i), transport::generate_keypair(), true);
      std::filesystem::copy_file(f.public_, dir_ + "/allow/" + name(i) + ".pub");
    }
  }
  ~DaemonCluster() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static std::string name(int i) { return "dev" + std::to_string(i); }
  const std::string& dir() const { return dir_; }
  std::string coordinator_key() const { return dir_ + "/coordinator.key"; }
  std::string allow() const { return dir_ + "/allow"; }

  // Points any coordinator's options (pipeline, fed, split) at this cluster:
  // its CURVE keys, loopback on an ephemeral port, 30 s to register.
  template <class Options>
  void connect(Options& o) const {
    o.key_path = coordinator_key();
    o.allow_path = allow();
    o.listen = "tcp://127.0.0.1:*";
    o.register_timeout_ms = 30000;
  }

  // Pipeline coordinator options for `devices` of this cluster's daemons.
  ClusterOptions options(int devices, const std::string& planner = "balance") const {
    ClusterOptions cl;
    cl.devices = devices;
    cl.planner = planner;
    connect(cl);
    return cl;
  }

  // Starts daemon i (1-based) dialling `endpoint`; `extra` flags are appended.
  pid_t start(int i, const std::string& endpoint, std::vector<std::string> extra = {}) {
    return start_program({std::string(CLEAVE_BINARY_DIR) + "/apps/cleaved/cleaved"}, i, endpoint, std::move(extra));
  }
  // The same with another cleaved: `program` is its command line before the
  // flags (e.g. {"qemu-aarch64-static", "build-aarch64/apps/cleaved/cleaved"}).
  pid_t start_program(std::vector<std::string> program, int i, const std::string& endpoint,
                      std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = std::move(program);
    argv.insert(argv.end(), {"--coordinator", endpoint, "--key", dir_ + "/" + name(i) + ".key", "--coordinator-key",
                             dir_ + "/coordinator.pub", "--name", name(i), "--backend", "cpu", "--threads", "1"});
    // One job, then exit, unless the test says how many.
    if (std::find(extra.begin(), extra.end(), "--max-jobs") == extra.end()) extra.insert(extra.begin(), {"--max-jobs", "1"});
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_t pid = spawn(argv, dir_ + "/" + name(i) + ".log");
    pids_.push_back(pid);
    return pid;
  }
  void start_all(const std::string& endpoint) {
    for (int i = 1; i <= devices_; ++i) start(i, endpoint);
  }
  void stop() {
    for (pid_t p : pids_) terminate(p, 2000);
    pids_.clear();
  }
  std::string log(int i) const {
    std::string out, path = dir_ + "/" + name(i) + ".log";
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      std::fclose(f);
    }
    return out;
  }

 private:
  int devices_;
  std::string dir_;
  std::vector<pid_t> pids_;
};

}  // namespace cleave::testing
