// cleaved: the device daemon. Thin: flags -> DaemonOptions -> run_daemon().
#include <csignal>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/flag_checks.h"
#include "core/data/shard.h"
#include "core/runtime/daemon/daemon.h"
#include "device/cpu/openmp_policy.h"
#include "device/device.h"
#include "transport/link.h"
#include "transport/log.h"

namespace {
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }
}  // namespace

// Exit status: 0 after serving; 2 for a bad command line (CLI11's parse errors
// and the checks below, printed with the usage hint) and when --connect-timeout
// passes without an authenticated connection; 1 when serving fails.
int main(int argc, char** argv) {
  cleave::prefer_passive_openmp(argv);
  CLI::App app{"cleaved: the cleave device daemon — hosts a range of layers and trains them with its neighbours"};
  cleave::DaemonOptions o;
  std::string memory_limit, bandwidth_limit;
  bool verbose = false;
  app.add_option("--coordinator", o.coordinator, "Coordinator to dial, tcp://HOST:PORT")->required();
  app.add_option("--key", o.key_path, "This device's secret key (from `cleave keygen`)");
  app.add_option("--coordinator-key", o.coordinator_key_path, "The coordinator's public key (.pub)");
  app.add_option("--name", o.name, "Device name (default: the key file's stem)");
  app.add_option("--backend", o.backend, "auto | cpu | opencl | cuda")->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "opencl", "cuda"}));
  app.add_option("--memory-limit", memory_limit, "Cap on what this daemon allocates, e.g. 512M, 4G");
  app.add_option("--threads", o.threads, "CPU threads (0 = all cores)")->capture_default_str()
      ->check(cleave::flag_checks::non_negative());
  app.add_option("--peer-bind", o.peer_bind, "Where the previous stage dials in")->capture_default_str();
  app.add_option("--bandwidth-limit", bandwidth_limit, "Throttle outgoing peer links, e.g. 100mbit, 10MB/s");
  app.add_option("--max-jobs", o.max_jobs, "Exit after this many jobs (default: serve forever)")
      ->check(cleave::flag_checks::positive());
  app.add_option("--coordinator-timeout", o.coordinator_timeout_ms, "Abandon a job after this many ms of coordinator silence")
      ->capture_default_str()->check(cleave::flag_checks::positive());
  double connect_timeout_s = 0;
  app.add_option("--connect-timeout", connect_timeout_s,
                 "Exit with status 2 when no authenticated connection to the coordinator is made within SECONDS "
                 "(default: keep trying, backing off after refused handshakes)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--insecure", o.insecure, "Plain TCP without CURVE (logs a warning; for debugging only)");
  app.add_flag("-v,--verbose", verbose, "Log more");
  // Client data (cleave fed, cleave split): the daemon trains on its own shard and never sends a sample.
  std::string shard, data_path;
  app.add_option("--dataset", o.fed.dataset, "Data client (fed/split): fashion-mnist, a CSV file or an IDX directory");
  app.add_option("--data", data_path, "Data client (fed/split): any IDX directory or CSV file (same as --dataset PATH)");
  app.add_option("--dataset-dir", o.fed.dataset_dir, "Data client (fed/split): where Fashion-MNIST lives");
  app.add_option("--shard", shard, "Data client (fed/split): this client's shard i/N (i from 0), e.g. 0/4");
  app.add_option("--partition", o.fed.partition, "Data client (fed/split): iid | dirichlet:ALPHA")->capture_default_str();
  app.add_option("--seed", o.fed.seed, "Data client (fed/split): partition seed (the same on every client)")
      ->capture_default_str();
  app.add_option("--limit-train", o.fed.limit, "Data client (fed/split): shard only the first N training samples")
      ->check(cleave::flag_checks::positive());
  // Test hook, hidden from --help: corrupt every update this client sends (nan | inf | shape).
  app.add_option("--poison", o.fed.poison)->group("")->check([](const std::string& v) { return cleave::fed_poison_refusal(v); });
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    std::string msg = "cleaved: error: ";
    msg += e.what();
    msg += "\nRun `cleaved --help` for the flags.\n";
    return msg;
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  // Flags that do not go together, and values only a parser can check.
  try {
    if (!o.insecure && (o.key_path.empty() || o.coordinator_key_path.empty()))
      throw std::invalid_argument("--key and --coordinator-key are required (or --insecure)");
    if (!data_path.empty()) {
      if (!o.fed.dataset.empty()) throw std::invalid_argument("give either --dataset or --data, not both");
      o.fed.dataset = data_path;
    }
    if (!shard.empty()) cleave::parse_shard_spec(shard, o.fed.shard, o.fed.num_shards);
    if (!shard.empty() && o.fed.dataset.empty()) throw std::invalid_argument("--shard needs --dataset or --data");
    if (!o.fed.poison.empty() && o.fed.dataset.empty())
      throw std::invalid_argument("--poison needs --dataset or --data");
    // The parsers' messages quote the value; say which flag it came from.
    auto for_flag = [](const char* flag, auto parse) {
      try {
        parse();
      } catch (const std::exception& e) {
        throw std::invalid_argument(std::string(flag) + ": " + e.what());
      }
    };
    for_flag("--partition", [&] { cleave::parse_shard_scheme(o.fed.partition); });
    o.connect_timeout_ms = static_cast<int>(connect_timeout_s * 1000);
    if (!memory_limit.empty()) for_flag("--memory-limit", [&] { o.memory_limit = cleave::parse_bytes(memory_limit); });
    if (!bandwidth_limit.empty())
      for_flag("--bandwidth-limit", [&] { o.bandwidth_limit = cleave::transport::parse_bandwidth(bandwidth_limit); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cleaved: error: %s\nRun `cleaved --help` for the flags.\n", e.what());
    return kExitUsage;
  }
  try {
    cleave::transport::set_log_level(verbose ? cleave::transport::LogLevel::kDebug : cleave::transport::LogLevel::kInfo);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    return cleave::run_daemon(o, g_stop);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cleaved: error: %s\n", e.what());
    return kExitFailure;
  }
}
