// local_daemons.h: real cleaved daemons on loopback for the benchmarks —
// CURVE keys for a coordinator and each named daemon in a fresh temporary
// directory (the daemons' public keys on the allow-list), processes started
// on demand and stopped, with the directory removed, at the end — and the
// coordinator-side settings the federated and split benchmarks share.
#pragma once

#include <sys/types.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/common/processes.h"
#include "core/train/train_config.h"
#include "transport/keys.h"

namespace cleave::bench {

class LocalDaemons {
 public:
  // Keys for "coordinator" and every name in `names`.
  explicit LocalDaemons(const std::vector<std::string>& names, const std::string& cleaved_path)
      : cleaved_(cleaved_path) {
    char tmpl[] = "/tmp/cleave-bench-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) throw std::runtime_error("cannot create a temporary directory for the benchmark's keys");
    dir_ = d;
    std::filesystem::create_directories(dir_ + "/allow");
    transport::write_keypair(dir_, "coordinator", transport::generate_keypair(), true);
    for (const auto& n : names) {
      auto f = transport::write_keypair(dir_, n, transport::generate_keypair(), true);
      std::filesystem::copy_file(f.public_, dir_ + "/allow/" + n + ".pub");
    }
  }
  ~LocalDaemons() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  LocalDaemons(const LocalDaemons&) = delete;
  LocalDaemons& operator=(const LocalDaemons&) = delete;

  std::string coordinator_key() const { return dir_ + "/coordinator.key"; }
  std::string allow() const { return dir_ + "/allow"; }

  // Points a coordinator's options (fed, split) at these daemons: their keys,
  // loopback on an ephemeral port, 60 s to register, 30 s of silence allowed.
  template <class Options>
  void connect(Options& o) const {
    o.key_path = coordinator_key();
    o.allow_path = allow();
    o.listen = "tcp://127.0.0.1:*";
    o.register_timeout_ms = 60000;
    o.peer_timeout_ms = 30000;
  }

  // cleaved flags of a client holding IID shard `shard` of `shards` of the
  // first `limit_train` Fashion-MNIST training samples.
  static std::vector<std::string> data_client_flags(int shard, int shards, int64_t limit_train) {
    return {"--dataset", "fashion-mnist", "--shard", std::to_string(shard) + "/" + std::to_string(shards),
            "--limit-train", std::to_string(limit_train)};
  }

  // Starts daemon `name` (1 CPU thread, one job) dialling `endpoint`, with `extra` flags; log in the temp dir.
  void start(const std::string& name, const std::string& endpoint, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {cleaved_, "--coordinator", endpoint, "--key", dir_ + "/" + name + ".key",
                                     "--coordinator-key", dir_ + "/coordinator.pub", "--name", name,
                                     "--backend", "cpu", "--threads", "1", "--max-jobs", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pids_.push_back(spawn(argv, dir_ + "/" + name + ".log"));
  }
  const std::vector<pid_t>& pids() const { return pids_; }  // in start() order
  void stop() {
    for (pid_t p : pids_) terminate(p);
    pids_.clear();
  }

 private:
  std::string cleaved_, dir_;
  std::vector<pid_t> pids_;
};

// The coordinator's settings of the fed and split benchmarks: batch 64, seed
// 1, Adam lr 0.001, the first 1000 test samples, no progress bar.
inline TrainConfig bench_run_config(const std::string& model_path) {
  TrainConfig cfg;
  cfg.model_path = model_path;
  cfg.batch = 64;
  cfg.seed = 1;
  cfg.limit_test = 1000;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 1e-3f;
  cfg.progress = false;
  return cfg;
}

}  // namespace cleave::bench
