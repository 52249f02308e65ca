// cleaved: the device daemon, a thin program over the embedding SDK
// (include/cleave/cleave.hpp): its flags go into cleave_options_set by name,
// unchanged, and it runs one SDK client to its end. Whatever cleaved does, an
// app linking libcleave can do.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/cleaved/config_file.h"
#include "apps/flag_checks.h"
#include "cleave/cleave.hpp"
#include "device/cpu/process_env.h"
#include "transport/wakeup.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;  // also: no authenticated connection within --connect-timeout
// SIGINT / SIGTERM: the handler may only write to a descriptor (signal() on
// a Wakeup); a thread that sleeps on it (SignalStop) turns the write into
// client.stop(), so the main thread waits for the client without waking to
// look at a flag.
const cleave::transport::Wakeup* g_signalled = nullptr;
void on_signal(int) { g_signalled->signal(); }

// One option as given: by a flag or by a line of the configuration file.
struct Setting {
  std::string name, value;
  std::string origin;  // "--name" or "FILE:LINE"
};

// The options, as text: each one given goes to the SDK under its own name.
struct Flags {
  std::vector<Setting> given;  // in order: the file's first, then the flags (which override it)
  std::set<std::string> known;  // every option's name (the file's keys)
  std::string config;
  bool check_config = false;

  CLI::Option* add(CLI::App& app, const std::string& name, const std::string& help) {
    known.insert(name);
    return app.add_option_function<std::string>(
        "--" + name, [this, name](const std::string& v) { given.push_back({name, v, "--" + name}); }, help);
  }
  CLI::Option* add_switch(CLI::App& app, const std::string& names, const std::string& name, const std::string& help) {
    known.insert(name);
    return app.add_flag_function(
        names, [this, name](int64_t) { given.push_back({name, "true", "--" + name}); }, help);
  }
  // The last setting of `name` ("" when none).
  std::string value(const std::string& name) const {
    for (auto it = given.rbegin(); it != given.rend(); ++it)
      if (it->name == name) return it->value;
    return "";
  }
  bool has(const std::string& name) const { return !value(name).empty(); }
  bool on(const std::string& name) const { return value(name) == "true" || value(name) == "1" || value(name) == "yes"; }
  // The file's entries that no flag overrides go first.
  void merge(const std::vector<cleave::daemon_config::Entry>& file) {
    std::vector<Setting> merged;
    for (const auto& e : file)
      if (!has(e.key)) merged.push_back({e.key, e.value, e.origin + ": " + e.key});
    merged.insert(merged.end(), given.begin(), given.end());
    given = std::move(merged);
  }
};

void add_flags(CLI::App& app, Flags& f) {
  using cleave::flag_checks::non_negative;
  using cleave::flag_checks::positive;
  f.add(app, "coordinator", "Coordinator to dial, tcp://HOST:PORT (required, here or in the --config file)");
  f.add(app, "key", "This device's secret key (from `cleave keygen`)");
  f.add(app, "coordinator-key", "The coordinator's public key (.pub)");
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
  f.add(app, "metrics-listen", "Serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 127.0.0.1:9464 (port 0: "
        "any free one, logged); unauthenticated, so keep it on loopback or firewalled (default: off)");
  f.add_switch(app, "--insecure", "insecure", "Plain TCP without CURVE (logs a warning; for debugging only)");
  f.add_switch(app, "-v,--verbose", "verbose", "Log more");
  // Client data (cleave fed, cleave split): the daemon trains on its own shard and never sends a sample.
  f.add(app, "dataset", "Data client (fed/split): fashion-mnist, a CSV file or an IDX directory");
  f.add(app, "data", "Data client (fed/split): any IDX directory or CSV file (same as --dataset PATH)");
  f.add(app, "dataset-dir", "Data client (fed/split): where Fashion-MNIST lives");
  f.add(app, "shard", "Data client (fed/split): this client's shard i/N (i from 0), e.g. 0/4");
  f.add(app, "partition", "Data client (fed/split): iid | dirichlet:ALPHA (default: iid)");
  f.add(app, "seed", "Data client (fed/split): partition seed, the same on every client (default: 1)");
  f.add(app, "limit-train", "Data client (fed/split): shard only the first N training samples")->check(positive());
  // Test hook, hidden from --help: corrupt every update this client sends (the SDK checks the mode).
  f.add(app, "poison", "")->group("");
  app.add_option("--config", f.config,
                 "Read options from FILE first: KEY = VALUE lines, KEY a flag's name without the dashes, # comments; "
                 "flags override it (e.g. /etc/cleave/cleaved.conf)");
  app.add_flag("--check-config", f.check_config,
               "Check the options (flags, --config file, key files) and print them with where each came from; "
               "start nothing");
  app.set_version_flag("--version", std::string("cleaved ") + cleave_version());
}

// The options that only make sense together; "" when they do.
std::string flag_conflict(const Flags& f) {
  if (!f.has("coordinator")) return "--coordinator is required (or `coordinator = ...` in the --config file)";
  if (!f.on("insecure") && (!f.has("key") || !f.has("coordinator-key")))
    return "--key and --coordinator-key are required (or --insecure)";
  if (!f.has("name") && !f.has("key"))
    return "--name is required without --key (a daemon is otherwise named after its key file), e.g. --name board1";
  if (f.has("data") && f.has("dataset")) return "give either --dataset or --data, not both";
  const bool data = f.has("dataset") || f.has("data");
  if (f.has("shard") && !data) return "--shard needs --dataset or --data";
  if (f.has("poison") && !data) return "--poison needs --dataset or --data";
  return "";
}

// Sets one option of `o`; throws cleave::Error naming where it was given.
void set_option(cleave::Options& o, const Setting& s, const std::string& name, const std::string& value) {
  try {
    o.set(name, value);
  } catch (const cleave::Error& e) {
    const std::string m = e.what();
    const std::string prefix = "cleave_options_set: " + name + ": ";
    throw cleave::Error(e.status(), s.origin + ": " + (m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m));
  }
}

// The options' values into `o` (a bad one is a usage error), all but the key files.
void apply_flags(cleave::Options& o, const Flags& f) {
  for (const Setting& s : f.given) {
    if (s.name == "key" || s.name == "coordinator-key") continue;  // apply_keys
    if (s.name == "verbose") {
      set_option(o, s, "log-level", f.on("verbose") ? "debug" : "info");
    } else {
      set_option(o, s, s.name, s.value);
      // A daemon with data takes federated and split-learning jobs.
      if (s.name == "dataset" || s.name == "data") set_option(o, s, "role", "data-client");
    }
  }
}

// The key files (read and checked now: one that is missing means the daemon cannot start).
void apply_keys(cleave::Options& o, const Flags& f) {
  for (const Setting& s : f.given)
    if (s.name == "key" || s.name == "coordinator-key") set_option(o, s, s.name, s.value);
}

// --check-config: the client could be made from the options; say what they are.
int check_config(const cleave::Options& options, const Flags& f) {
  cleave::Client client(options);  // complete options, or cleave::Error
  std::printf("cleaved: the options are valid (cleave %s):\n", cleave_version());
  for (const Setting& s : f.given) std::printf("  %-20s %-40s (%s)\n", s.name.c_str(), s.value.c_str(), s.origin.c_str());
  return 0;
}

// From construction (the handlers are installed) to destruction, a signal
// stops the started client; the destructor ends the thread.
class SignalStop {
 public:
  explicit SignalStop(cleave::Client& client) : client_(client) {
    static const cleave::transport::Wakeup signalled;  // throws std::runtime_error without an eventfd
    g_signalled = &signalled;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
  }
  // After client.start(): a signal that came before it stops the client now.
  void watch() {
    thread_ = std::thread([this] {
      g_signalled->wait(-1);
      if (done_) return;
      try {
        client_.stop();
      } catch (const cleave::Error&) {  // it has ended: nothing to stop
      }
    });
  }
  // The handlers and the Wakeup stay until the process exits: a signal that
  // comes while it ends still finds them (and changes nothing).
  ~SignalStop() {
    done_ = true;
    g_signalled->signal();
    if (thread_.joinable()) thread_.join();
  }
  SignalStop(const SignalStop&) = delete;
  SignalStop& operator=(const SignalStop&) = delete;

 private:
  cleave::Client& client_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Runs the client until it ends or a signal stops it; returns the exit status.
int serve(const cleave::Options& options) {
  cleave::Client client(options);
  SignalStop signals(client);
  client.start();
  signals.watch();
  try {
    client.wait(-1);
    return 0;
  } catch (const cleave::Error& e) {
    if (e.status() == CLEAVE_ERR_STOPPED) return 0;  // a signal: stopped as asked
    std::fprintf(stderr, "cleaved: error: %s\n", e.what());
    const bool unconnected = e.status() == CLEAVE_ERR_UNREACHABLE || e.status() == CLEAVE_ERR_REFUSED_KEY;
    return unconnected ? kExitUsage : kExitFailure;
  }
}

}  // namespace

// Exit status: 0 after serving (or when stopped by SIGINT / SIGTERM, or
// --check-config found the options valid); 2 for a bad command line or
// configuration file (CLI11's parse errors and the checks below, printed with
// the usage hint) and when --connect-timeout passes without an authenticated
// connection; 1 when serving fails (also: a key file that cannot be read).
int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);
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
    if (!flags.config.empty()) flags.merge(cleave::daemon_config::read_config(flags.config, flags.known));
    apply_flags(options, flags);  // each value first (as CLI11's checks), then how they combine
    if (const std::string why = flag_conflict(flags); !why.empty()) throw cleave::Error(CLEAVE_ERR_INVALID_ARGUMENT, why);
  } catch (const std::exception& e) {  // cleave::Error, or the configuration file's std::runtime_error
    std::fprintf(stderr, "cleaved: error: %s\nRun `cleaved --help` for the flags.\n", e.what());
    return kExitUsage;
  }
  try {
    apply_keys(options, flags);
    return flags.check_config ? check_config(options, flags) : serve(options);
  } catch (const std::exception& e) {  // a key file, options the client cannot start with, no eventfd
    std::fprintf(stderr, "cleaved: error: %s\n", e.what());
    return kExitFailure;
  }
}
