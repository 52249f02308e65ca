// cleaved: the device daemon, a thin program over the embedding SDK
// (include/cleave/cleave.hpp): its flags go into cleave_options_set by name,
// unchanged, and it runs one SDK client to its end. Whatever cleaved does, an
// app linking libcleave can do.
#include <csignal>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/flag_checks.h"
#include "cleave/cleave.hpp"
#include "device/cpu/openmp_policy.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;  // also: no authenticated connection within --connect-timeout
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

// The flags, as text: each given one goes to the SDK under its own name.
struct Flags {
  std::vector<std::pair<std::string, std::string>> given;  // (name without "--", value)
  bool verbose = false;
  bool insecure = false;
  std::string key, coordinator_key, dataset, data, shard, poison;

  CLI::Option* add(CLI::App& app, const std::string& name, const std::string& help) {
    return app.add_option_function<std::string>(
        "--" + name, [this, name](const std::string& v) { given.emplace_back(name, v); }, help);
  }
};

void add_flags(CLI::App& app, Flags& f) {
  using cleave::flag_checks::non_negative;
  using cleave::flag_checks::positive;
  f.add(app, "coordinator", "Coordinator to dial, tcp://HOST:PORT")->required();
  app.add_option("--key", f.key, "This device's secret key (from `cleave keygen`)");
  app.add_option("--coordinator-key", f.coordinator_key, "The coordinator's public key (.pub)");
  f.add(app, "name", "Device name (default: the key file's stem)");
  f.add(app, "backend", "auto | cpu | opencl | cuda (default: auto)")->check(CLI::IsMember({"auto", "cpu", "opencl", "cuda"}));
  f.add(app, "memory-limit", "Cap on what this daemon allocates, e.g. 512M, 4G");
  f.add(app, "threads", "CPU threads (default 0 = all cores)")->check(non_negative());
  f.add(app, "peer-bind", "Where the previous stage dials in (default: tcp://127.0.0.1:*)");
  f.add(app, "bandwidth-limit", "Throttle outgoing peer links, e.g. 100mbit, 10MB/s");
  f.add(app, "max-jobs", "Exit after this many jobs (default: serve forever)")->check(positive());
  f.add(app, "coordinator-timeout", "Abandon a job after this many ms of coordinator silence (default: 10000)")
      ->check(positive());
  f.add(app, "connect-timeout", "Exit with status 2 when no authenticated connection to the coordinator is made within "
        "SECONDS (default: keep trying, backing off after refused handshakes)")->check(CLI::PositiveNumber);
  app.add_flag("--insecure", f.insecure, "Plain TCP without CURVE (logs a warning; for debugging only)");
  app.add_flag("-v,--verbose", f.verbose, "Log more");
  // Client data (cleave fed, cleave split): the daemon trains on its own shard and never sends a sample.
  app.add_option("--dataset", f.dataset, "Data client (fed/split): fashion-mnist, a CSV file or an IDX directory");
  app.add_option("--data", f.data, "Data client (fed/split): any IDX directory or CSV file (same as --dataset PATH)");
  f.add(app, "dataset-dir", "Data client (fed/split): where Fashion-MNIST lives");
  app.add_option("--shard", f.shard, "Data client (fed/split): this client's shard i/N (i from 0), e.g. 0/4");
  f.add(app, "partition", "Data client (fed/split): iid | dirichlet:ALPHA (default: iid)");
  f.add(app, "seed", "Data client (fed/split): partition seed, the same on every client (default: 1)");
  f.add(app, "limit-train", "Data client (fed/split): shard only the first N training samples")->check(positive());
  // Test hook, hidden from --help: corrupt every update this client sends (the SDK checks the mode).
  app.add_option("--poison", f.poison)->group("");
}

// The flags that only make sense together; "" when they do.
std::string flag_conflict(const Flags& f) {
  if (!f.insecure && (f.key.empty() || f.coordinator_key.empty()))
    return "--key and --coordinator-key are required (or --insecure)";
  if (!f.data.empty() && !f.dataset.empty()) return "give either --dataset or --data, not both";
  const bool data = !f.dataset.empty() || !f.data.empty();
  if (!f.shard.empty() && !data) return "--shard needs --dataset or --data";
  if (!f.poison.empty() && !data) return "--poison needs --dataset or --data";
  return "";
}

// Sets one option of `o` by its flag's name; throws cleave::Error naming the flag.
void set_flag(cleave::Options& o, const std::string& name, const std::string& value) {
  try {
    o.set(name, value);
  } catch (const cleave::Error& e) {
    const std::string m = e.what();
    const std::string prefix = "cleave_options_set: " + name + ": ";
    throw cleave::Error(e.status(), "--" + name + ": " + (m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m));
  }
}

// The flags' values into `o` (a bad one is a usage error), all but the key files.
void apply_flags(cleave::Options& o, const Flags& f) {
  if (f.insecure) set_flag(o, "insecure", "true");
  for (const auto& [name, value] : f.given) set_flag(o, name, value);
  if (f.verbose) set_flag(o, "log-level", "debug");
  const std::string data = f.dataset.empty() ? f.data : f.dataset;
  if (!data.empty()) {
    set_flag(o, "role", "data-client");  // a daemon with data takes federated and split-learning jobs
    set_flag(o, f.dataset.empty() ? "data" : "dataset", data);
  }
  if (!f.shard.empty()) set_flag(o, "shard", f.shard);
  if (!f.poison.empty()) set_flag(o, "poison", f.poison);
}

// The key files (read and checked now: one that is missing means the daemon cannot start).
void apply_keys(cleave::Options& o, const Flags& f) {
  if (!f.key.empty()) set_flag(o, "key", f.key);
  if (!f.coordinator_key.empty()) set_flag(o, "coordinator-key", f.coordinator_key);
}

// Runs the client until it ends or a signal stops it; returns the exit status.
int serve(const cleave::Options& options) {
  cleave::Client client(options);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  client.start();
  bool stopping = false;
  for (;;) {
    if (g_stop && !stopping) {
      client.stop();
      stopping = true;
    }
    try {
      if (client.wait(200)) return 0;
    } catch (const cleave::Error& e) {
      if (e.status() == CLEAVE_ERR_STOPPED) return 0;  // a signal: stopped as asked
      std::fprintf(stderr, "cleaved: error: %s\n", e.what());
      const bool unconnected = e.status() == CLEAVE_ERR_UNREACHABLE || e.status() == CLEAVE_ERR_REFUSED_KEY;
      return unconnected ? kExitUsage : kExitFailure;
    }
  }
}

}  // namespace

// Exit status: 0 after serving (or when stopped by SIGINT / SIGTERM); 2 for a
// bad command line (CLI11's parse errors and the checks below, printed with
// the usage hint) and when --connect-timeout passes without an authenticated
// connection; 1 when serving fails.
int main(int argc, char** argv) {
  cleave::prefer_passive_openmp(argv);
  CLI::App app{"cleaved: the cleave device daemon — hosts a range of layers and trains them with its neighbours"};
  Flags flags;
  add_flags(app, flags);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("cleaved: error: ") + e.what() + "\nRun `cleaved --help` for the flags.\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  cleave::Options options;
  try {
    apply_flags(options, flags);  // each value first (as CLI11's checks), then how they combine
    if (const std::string why = flag_conflict(flags); !why.empty()) throw cleave::Error(CLEAVE_ERR_INVALID_ARGUMENT, why);
  } catch (const cleave::Error& e) {
    std::fprintf(stderr, "cleaved: error: %s\nRun `cleaved --help` for the flags.\n", e.what());
    return kExitUsage;
  }
  try {
    apply_keys(options, flags);
    return serve(options);
  } catch (const cleave::Error& e) {  // a key file, or options the client cannot start with
    std::fprintf(stderr, "cleaved: error: %s\n", e.what());
    return kExitFailure;
  }
}
