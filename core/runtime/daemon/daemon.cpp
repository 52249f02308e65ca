// daemon.cpp: the cleaved service loop; see daemon.h and docs/protocol.md.
#include "core/runtime/daemon/daemon.h"

#include "cleave/version.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "core/runtime/daemon/daemon_monitor.h"
#include "core/runtime/daemon/host_info.h"
#include "core/runtime/daemon/job_context.h"
#include "core/runtime/daemon/pipeline_job.h"
#include "core/runtime/daemon/probe.h"
#include "core/runtime/daemon/services.h"
#include "core/runtime/daemon/split_job.h"
#include "device/cpu/blas_kernels.h"
#include "transport/endpoint.h"
#include "transport/keys.h"
#include "transport/log.h"
#include "transport/wakeup.h"

namespace cleave {
namespace {

using namespace transport;
using Clock = std::chrono::steady_clock;

void info(const std::string& name, const std::string& text) {
  log(LogLevel::kInfo, "cleaved " + name + ": " + text);
}

// The device and its start-up speed; a warning where OpenBLAS runs kernels far below the CPU.
void log_device(const std::string& name, const Device& device, double gflops) {
  info(name, "device " + device.name() + ", " + std::to_string(static_cast<int>(gflops)) + " GFLOP/s measured");
  if (device.backend() == Backend::cpu)
    if (const std::string advice = openblas_kernel_advice(); !advice.empty())
      log(LogLevel::kWarning, "cleaved " + name + ": " + advice);
}

// Why no connection to the coordinator was made, and what to do (connect_timeout_ms passed).
std::string no_coordinator_message(const DaemonOptions& opts, const ClientEndpoint& client) {
  const std::string within = " within " + std::to_string(opts.connect_timeout_ms / 1000.0).substr(0, 4) + " s";
  const std::string why = client.last_handshake_failure();
  if (why.empty())
    return "no connection to the coordinator at " + opts.coordinator + within +
           ": is it running and listening there (cleave ... --listen)?";
  return "authentication with the coordinator at " + opts.coordinator + " failed" + within + " (" +
         std::to_string(client.failed_handshakes()) + " attempts): " + why +
         ". Check that --coordinator-key is the coordinator's public key (the .pub written next to the key "
         "it was started with; a wrong coordinator key looks like this) and that this device's .pub is in "
         "the coordinator's allow directory";
}

void emit(const DaemonOptions& opts, DaemonEvent::Kind kind, const std::string& job = {}, const char* outcome = "") {
  if (!opts.on_event) return;
  DaemonEvent e;
  e.kind = kind;
  e.job = job;
  e.outcome = outcome;
  opts.on_event(e);
}

const char* outcome_name(JobEnd end) {
  switch (end) {
    case JobEnd::finished: return "finished";
    case JobEnd::shutdown: return "shutdown";
    case JobEnd::abandoned: return "abandoned";
    case JobEnd::refused: return "refused";
  }
  return "finished";
}

// How long the loop between jobs may wait for the coordinator: with no Wakeup
// to say that the flags changed, 100 ms; with one, until its next
// registration or, unconnected, at most 5 s and not past `connect_deadline`
// (--connect-timeout; time_point::max(): never). A wait also ends for a
// message, the Wakeup, and the end of a handshake (a new connection registers
// at once, a failed one backs off at once).
Millis idle_wait(const DaemonOptions& opts, bool connected, Clock::time_point last_register,
                 Clock::time_point connect_deadline) {
  if (!opts.wake) return Millis(100);
  const auto due = connected ? last_register + std::chrono::seconds(1)
                             : std::min(Clock::now() + std::chrono::seconds(5), connect_deadline);
  // Rounded up: woken a little early, the loop would find nothing due and spin until it is.
  return std::clamp(std::chrono::ceil<Millis>(due - Clock::now()) + Millis(1), Millis(0), Millis(5000));
}

// The daemon's end of its link to the coordinator.
ClientOptions coordinator_link(const DaemonOptions& opts, const KeyPair& keys, const std::string& coordinator_key) {
  ClientOptions copts;
  copts.connect = opts.coordinator;
  copts.keys = keys;
  copts.server_public_key = coordinator_key;
  copts.insecure = opts.insecure;
  copts.label = "cleaved " + opts.name;
  // A lost coordinator is dialled again 1 s later, the wait doubling to 30 s
  // (docs/recovery.md); once connected, the daemon registers every second.
  copts.tuning.reconnect_ms = 1000;
  copts.tuning.reconnect_max_ms = 30000;
  return copts;
}

// Logs why no connection was made within connect_timeout_ms, tells the embedder, and returns the exit code.
int give_up_unconnected(const DaemonOptions& opts, const ClientEndpoint& client) {
  const std::string why = no_coordinator_message(opts, client);
  log(LogLevel::kError, "cleaved " + opts.name + ": " + why + "; exiting");
  if (opts.on_event) {
    DaemonEvent e;
    e.kind = DaemonEvent::Kind::no_coordinator;
    e.refused_key = client.failed_handshakes() > 0;
    e.message = why;
    opts.on_event(e);
  }
  return kExitNoCoordinator;
}

// Runs the job an assignment starts, whatever its kind, in the one job loop.
JobEnd dispatch_job(const JobContext& ctx, FedClient* fed, const AssignMsg& a, uint64_t rid) {
  const std::string& name = ctx.options.name;
  if (const auto* split = std::get_if<SplitJob>(&a.job)) {  // split_job.h
    const bool client_role = split->role == SplitRole::kClient;
    if (client_role && !fed) {
      ctx.channel.send(error_message(ErrorCode::kRefused, name + " holds no data for a split-learning client: "
                                     "start cleaved with --dataset and --shard i/N", rid));
      return JobEnd::refused;
    }
    if (client_role && !ctx.options.split_client_jobs) {
      ctx.channel.send(error_message(ErrorCode::kRefused, name + " joined as a federated client only: its data "
                                     "does not leave it as activations; assign it federated jobs", rid));
      return JobEnd::refused;
    }
    return client_role ? run_split_client(ctx, fed->data(), ctx.options.fed, a, rid) : run_split_server(ctx, a, rid);
  }
  if (std::holds_alternative<FedJob>(a.job)) {  // fed_client.h
    if (!fed) {
      ctx.channel.send(error_message(ErrorCode::kRefused, name + " is not a federated client: start cleaved "
                                     "with --dataset and --shard i/N", rid));
      return JobEnd::refused;
    }
    if (!ctx.options.fed_jobs) {
      ctx.channel.send(error_message(ErrorCode::kRefused, name + " joined as a split-learning client only: "
                                     "assign it split-learning jobs", rid));
      return JobEnd::refused;
    }
    FedRoundHook on_round;
    if (ctx.options.on_event) on_round = [&ctx](int64_t round, double loss) { ctx.progress("fed", round, loss); };
    return fed->run(ctx.channel, ctx.device, a, rid, ctx.keys, name, ctx.options.coordinator_timeout_ms, ctx.stop,
                    on_round);
  }
  return run_pipeline_stage(ctx, a, rid);  // pipeline_job.h
}

// dispatch_job, with job_started / job_ended told to whoever embeds the daemon.
JobEnd run_job(const JobContext& ctx, FedClient* fed, const AssignMsg& a, uint64_t rid) {
  const char* kind = std::holds_alternative<SplitJob>(a.job) ? "split" : std::holds_alternative<FedJob>(a.job) ? "fed" : "stage";
  emit(ctx.options, DaemonEvent::Kind::job_started, kind);
  const JobEnd end = dispatch_job(ctx, fed, a, rid);
  emit(ctx.options, DaemonEvent::Kind::job_ended, kind, outcome_name(end));
  return end;
}

}  // namespace

int run_daemon(const DaemonOptions& opts_in, const std::atomic<bool>& stop) {
  DaemonOptions opts = opts_in;
  KeyPair keys;
  std::string coordinator_key;
  if (!opts.insecure) {
    keys = opts.secret_key_z85.empty() ? load_secret_key(opts.key_path)
                                       : KeyPair{public_key_of(opts.secret_key_z85), opts.secret_key_z85};
    coordinator_key = opts.coordinator_key_z85.empty() ? load_public_key(opts.coordinator_key_path)
                                                       : opts.coordinator_key_z85;
  }
  if (opts.name.empty()) opts.name = std::filesystem::path(opts.key_path).stem().string();
  if (opts.name.empty()) throw std::runtime_error("cleaved: give the device a --name");
  // --metrics-listen: bound before the slow start-up work, so a port in use fails at once.
  const std::unique_ptr<DaemonMonitor> metrics = start_daemon_monitor(opts);

  DeviceOptions dopts;
  dopts.threads = opts.threads;
  dopts.memory_limit = opts.memory_limit;
  auto device = open_device(opts.backend, dopts);
  // [fed] A federated client loads its shard before it registers (fed_client.h).
  std::unique_ptr<FedClient> fed;
  if (opts.fed.enabled()) fed = std::make_unique<FedClient>(opts.fed);
  const double gflops = measure_gflops(*device);
  log_device(opts.name, *device, gflops);

  ClientEndpoint client(coordinator_link(opts, keys, coordinator_key));
  JobChannel channel(client, opts.name);
  const auto watching = watch_daemon(metrics.get(), *device, client, channel);  // declared after what it reads

  // What this daemon tells the coordinator besides its memory: fixed for its
  // life, so worked out once (the machine's identity reads /etc/machine-id).
  const int host_cores = usable_cores();
  nlohmann::json details = {{"device", device->name()},
                            {"backend", backend_name(device->backend())},
                            {"bandwidth_limit_bytes_per_sec", opts.bandwidth_limit},
                            {"host", host_identity()},
                            {"arch", host_architecture()},
                            {"cpu_cores", host_cores},
                            {"cpu_threads", device->backend() == Backend::cpu
                                                ? (opts.threads > 0 ? std::min(opts.threads, host_cores) : host_cores)
                                                : 0}};
  if (fed) {  // [fed] the client's data (size only, never samples), and which data jobs it takes
    details.update(fed->register_details());
    details["fed_jobs"] = opts.fed_jobs;
    details["split_jobs"] = opts.split_client_jobs;
  }
  const std::string details_json = details.dump();
  auto register_message = [&] {
    RegisterMsg r;
    r.device_name = opts.name;
    for (Backend b : compiled_backends()) r.backends.push_back(backend_name(b));
    MemoryInfo mem = device->memory();
    r.memory_total = mem.total;
    r.memory_free = mem.free;
    r.compute_gflops = gflops;
    r.public_key = keys.public_key;
    r.software_version = "cleave " CLEAVE_VERSION_STRING;
    r.details_json = details_json;
    Message m;
    m.body = r;
    return m;
  };

  const JobContext ctx{*device, channel, keys, opts, stop, metrics.get()};
  DaemonServices services(ctx);
  int jobs_done = 0;
  auto last_register = Clock::now() - std::chrono::seconds(10);
  // --connect-timeout: when an unconnected daemon gives up.
  const auto give_up_at =
      opts.connect_timeout_ms > 0 ? Clock::now() + Millis(opts.connect_timeout_ms) : Clock::time_point::max();
  bool ever_connected = false;
  while (!stop && (opts.max_jobs < 0 || jobs_done < opts.max_jobs)) {
    const bool connected = client.connected();
    if (connected && !ever_connected) emit(opts, DaemonEvent::Kind::connected);
    ever_connected = ever_connected || connected;
    if (!ever_connected && Clock::now() > give_up_at) return give_up_unconnected(opts, client);
    // Registrations go out on an authenticated connection only (none pile up while it backs off).
    if (connected && Clock::now() - last_register > std::chrono::seconds(1)) {
      channel.send(register_message());
      last_register = Clock::now();
    }
    channel.poll(idle_wait(opts, connected, last_register, ever_connected ? Clock::time_point::max() : give_up_at),
                 opts.wake);
    if (opts.wake) opts.wake->clear();  // before the flags are read: a later signal wakes the next wait
    if (opts.release_requested && opts.release_requested()) device->release_cached_memory();
    while (auto cmd = channel.pop_command()) {
      const uint64_t rid = cmd->request_id;
      if (auto* a = std::get_if<AssignMsg>(&cmd->body)) {
        const JobEnd end = run_job(ctx, fed.get(), *a, rid);
        if (end == JobEnd::shutdown) return 0;
        if (end == JobEnd::refused) continue;  // no job ran
        // An idle daemon holds only what it needs, and says it is free again.
        device->release_cached_memory();
        ++jobs_done;
        channel.clear_mailboxes();
        channel.heard_now();
        last_register = Clock::now() - std::chrono::seconds(10);
        break;
      }
      const Command& c = std::get<CommandMsg>(cmd->body).command;
      if (std::holds_alternative<ShutdownCmd>(c)) {
        channel.send(ack_message(rid, {{"op", "shutdown"}}));
        info(opts.name, "shutdown requested by the coordinator");
        return 0;
      }
      if (std::holds_alternative<FinishCmd>(c) || services.handle(c, rid)) continue;
      channel.send(error_message(ErrorCode::kNotAssigned, opts.name + " has no stage assigned", rid));
    }
  }
  return 0;
}

}  // namespace cleave
