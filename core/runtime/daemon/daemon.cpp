// daemon.cpp: the cleaved service loop; see daemon.h and docs/protocol.md.
#include "core/runtime/daemon/daemon.h"

#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "core/model/model_spec.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/stage.h"
#include "core/runtime/daemon/host_info.h"
#include "core/runtime/daemon/job_channel.h"
#include "core/runtime/daemon/layer_profile.h"
#include "core/runtime/daemon/link_probe.h"
#include "core/runtime/common/memory_estimate.h"
#include "core/runtime/daemon/probe.h"
#include "core/runtime/daemon/split_job.h"
#include "core/runtime/common/stage_state.h"
#include "core/runtime/common/wire.h"
#include "transport/endpoint.h"
#include "transport/keys.h"
#include "transport/link.h"
#include "transport/log.h"

namespace cleave {
namespace {

using namespace transport;
using Clock = std::chrono::steady_clock;

struct JobAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void info(const std::string& name, const std::string& text) {
  log(LogLevel::kInfo, "cleaved " + name + ": " + text);
}
void warn(const std::string& name, const std::string& text) {
  log(LogLevel::kWarning, "cleaved " + name + ": " + text);
}

// One job: the stage this daemon runs and its links.
struct Job {
  AssignMsg assign;
  ModelSpec spec;
  ScheduleKind schedule = ScheduleKind::gpipe;
  int microbatches = 1;
  uint64_t seed = 1;
  Encoding encoding = Encoding::kF32;
  std::unique_ptr<Stage> stage;
  std::unique_ptr<ServerEndpoint> peer_server;  // the previous stage dials in here
  std::unique_ptr<TensorLink> prev, next;
  std::unique_ptr<StageTracer> tracer;
  std::map<std::tuple<int, int64_t, int>, TensorMessage> early;  // link messages that arrived ahead
  int64_t steps = 0;
};

class DaemonIO : public StageIO {
 public:
  DaemonIO(Device& dev, Job& job, JobChannel& channel, const DaemonOptions& opts, const std::atomic<bool>& stop)
      : dev_(dev), job_(job), channel_(channel), opts_(opts), stop_(stop) {}

  Tensor receive_input(int64_t step, int mb) override {
    if (!job_.prev) return from_message(dev_, wait_coordinator(TensorKind::kInput, step, mb));
    return from_message(dev_, wait_link(*job_.prev, "previous stage", TensorKind::kActivation, step, mb));
  }
  Tensor receive_targets(int64_t step, int mb) override {
    return from_message(dev_, wait_coordinator(TensorKind::kLabels, step, mb));
  }
  void send_output(int64_t step, int mb, const Tensor& y) override {
    send(*job_.next, "next stage", to_message(y, TensorKind::kActivation, step, mb));
  }
  Tensor receive_output_grad(int64_t step, int mb) override {
    return from_message(dev_, wait_link(*job_.next, "next stage", TensorKind::kGradient, step, mb));
  }
  void send_input_grad(int64_t step, int mb, const Tensor& dx) override {
    send(*job_.prev, "previous stage", to_message(dx, TensorKind::kGradient, step, mb));
  }

 private:
  void check_alive() {
    if (stop_) throw JobAborted("daemon is stopping");
    if (channel_.stop_queued()) throw JobAborted("the coordinator stopped the job");
    if (channel_.silence() > Millis(opts_.coordinator_timeout_ms))
      throw JobAborted("the coordinator has been silent for " + std::to_string(channel_.silence().count()) + " ms");
  }

  TensorMessage wait_coordinator(TensorKind kind, int64_t step, int mb) {
    for (;;) {
      if (auto t = channel_.take_tensor(kind, step, mb)) return std::move(*t);
      check_alive();
      channel_.poll(Millis(50));
    }
  }

  TensorMessage wait_link(TensorLink& link, const char* which, TensorKind kind, int64_t step, int mb) {
    const auto key = std::make_tuple(static_cast<int>(kind), step, mb);
    for (;;) {
      if (auto it = job_.early.find(key); it != job_.early.end()) {
        TensorMessage t = std::move(it->second);
        job_.early.erase(it);
        return t;
      }
      auto r = link.receive(Millis(20));
      if (r) {
        TensorMessage& t = r.value();
        if (static_cast<int>(t.kind) == static_cast<int>(kind) && t.step == step && t.micro_batch == mb) return std::move(t);
        job_.early[{static_cast<int>(t.kind), t.step, t.micro_batch}] = std::move(t);
        continue;
      }
      if (r.is(FailureKind::kClosed)) throw std::runtime_error(std::string("link to the ") + which + " closed");
      if (r.is(FailureKind::kRejected)) warn(opts_.name, std::string("rejected input from the ") + which + ": " + r.failure().message);
      while (channel_.poll(Millis(0))) {
      }
      check_alive();
    }
  }

  void send(TensorLink& link, const char* which, const TensorMessage& m) {
    for (;;) {
      Status s = link.send(m);
      if (s) return;
      if (!s.is(FailureKind::kUnreachable))
        throw std::runtime_error(std::string("cannot send to the ") + which + ": " + s.failure().message);
      // The previous stage has not said hello yet: wait for it.
      channel_.poll(Millis(20));
      check_alive();
    }
  }

  Device& dev_;
  Job& job_;
  JobChannel& channel_;
  const DaemonOptions& opts_;
  const std::atomic<bool>& stop_;
};

}  // namespace

int run_daemon(const DaemonOptions& opts_in, const std::atomic<bool>& stop) {
  DaemonOptions opts = opts_in;
  KeyPair keys;
  std::string coordinator_key;
  if (!opts.insecure) {
    keys = load_secret_key(opts.key_path);
    coordinator_key = load_public_key(opts.coordinator_key_path);
  }
  if (opts.name.empty()) opts.name = std::filesystem::path(opts.key_path).stem().string();
  if (opts.name.empty()) throw std::runtime_error("cleaved: give the device a --name");

  DeviceOptions dopts;
  dopts.threads = opts.threads;
  dopts.memory_limit = opts.memory_limit;
  auto device = open_device(opts.backend, dopts);
  // [fed] A federated client loads its shard before it registers (fed_client.h).
  std::unique_ptr<FedClient> fed;
  if (opts.fed.enabled()) fed = std::make_unique<FedClient>(opts.fed);
  const double gflops = measure_gflops(*device);
  info(opts.name, "device " + device->name() + ", " + std::to_string(static_cast<int>(gflops)) + " GFLOP/s measured");

  ClientOptions copts;
  copts.connect = opts.coordinator;
  copts.keys = keys;
  copts.server_public_key = coordinator_key;
  copts.insecure = opts.insecure;
  copts.label = "cleaved " + opts.name;
  ClientEndpoint client(copts);
  JobChannel channel(client, opts.name);

  // What this daemon tells the coordinator besides its memory: fixed for its
  // life, so worked out once (the machine's identity reads /etc/machine-id).
  const int host_cores = usable_cores();
  nlohmann::json details = {{"device", device->name()},
                            {"backend", backend_name(device->backend())},
                            {"bandwidth_limit_bytes_per_sec", opts.bandwidth_limit},
                            {"host", host_identity()},
                            {"cpu_cores", host_cores},
                            {"cpu_threads", device->backend() == Backend::cpu
                                                ? (opts.threads > 0 ? std::min(opts.threads, host_cores) : host_cores)
                                                : 0}};
  if (fed) details.update(fed->register_details());  // [fed] the client's data (size only, never samples)
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
    r.software_version = "cleave 0.1.0";
    r.details_json = details_json;
    Message m;
    m.body = r;
    return m;
  };

  std::unique_ptr<Job> job;
  std::map<std::string, std::unique_ptr<ProbeEchoServer>> probe_servers;  // by the peer they answer
  int jobs_done = 0;
  auto last_register = Clock::now() - std::chrono::seconds(10);
  auto drop_job = [&](const std::string& why) {
    if (job && !why.empty()) warn(opts.name, "job ended: " + why);
    job.reset();
    channel.clear_mailboxes();
    device->release_cached_memory();  // an idle daemon holds only what it needs
  };

  while (!stop && (opts.max_jobs < 0 || jobs_done < opts.max_jobs)) {
    if (!job && Clock::now() - last_register > std::chrono::seconds(1)) {
      channel.send(register_message());
      last_register = Clock::now();
    }
    channel.poll(Millis(100));
    if (job && channel.silence() > Millis(opts.coordinator_timeout_ms)) {
      drop_job("the coordinator has been silent for " + std::to_string(channel.silence().count()) + " ms");
      ++jobs_done;
      continue;
    }
    if (job) {
      if (auto w = channel.take_weights(job->stage->index())) {  // a stage state to start from (--load, --init)
        Stage& stage = *job->stage;
        try {
          const size_t buffers = stage.optimizer().state().size();
          restore_stage_state(stage, read_stage_state(*w, stage.partition().param_count(), buffers));
          channel.send(ack_message(w->request_id, {{"op", "load_state"}}));
        } catch (const std::exception& e) {
          channel.send(error_message(ErrorCode::kBadMessage, opts.name + " cannot load the stage state: " + e.what(),
                                     w->request_id));
        }
      }
    }
    while (auto cmd = channel.pop_command()) {
      const uint64_t rid = cmd->request_id;
      if (auto* a = std::get_if<AssignMsg>(&cmd->body)) {
        if (job) {
          channel.send(error_message(ErrorCode::kUnexpectedKind, opts.name + " is already running a stage", rid));
          continue;
        }
        if (is_split_assign(*a)) {  // [split] split learning: split_job.h runs it on this connection
          const auto training = nlohmann::json::parse(a->training_json);
          const bool client_role = training.value("role", std::string()) == "client";
          if (client_role && !fed) {
            channel.send(error_message(ErrorCode::kRefused, opts.name + " holds no data for a split-learning client: "
                                       "start cleaved with --dataset and --shard i/N", rid));
            continue;
          }
          const SplitJobContext ctx{*device, channel, keys, opts, stop};
          const JobEnd end = client_role ? run_split_client(ctx, fed->data(), opts.fed, *a, rid)
                                              : run_split_server(ctx, *a, rid);
          if (end == JobEnd::shutdown) return 0;
          if (end == JobEnd::refused) continue;
          device->release_cached_memory();
          ++jobs_done;
          channel.clear_mailboxes();
          channel.heard_now();
          last_register = Clock::now() - std::chrono::seconds(10);
          break;
        }
        if (is_fed_assign(*a)) {  // [fed] federated job: fed_client.cpp serves it on this connection
          if (!fed) {
            channel.send(error_message(ErrorCode::kRefused, opts.name + " is not a federated client: start cleaved "
                                       "with --dataset and --shard i/N", rid));
            continue;
          }
          const JobEnd end = fed->run(channel, *device, *a, rid, opts.name, opts.coordinator_timeout_ms, stop);
          if (end == JobEnd::shutdown) return 0;
          if (end == JobEnd::refused) continue;  // like a refused stage: not a job
          device->release_cached_memory();
          ++jobs_done;
          channel.clear_mailboxes();
          channel.heard_now();
          last_register = Clock::now() - std::chrono::seconds(10);
          break;
        }
        try {
          auto j = std::make_unique<Job>();
          j->assign = *a;
          j->spec = ModelSpec::parse(nlohmann::json::parse(a->model_spec_json), "assigned model");
          const auto training = nlohmann::json::parse(a->training_json.empty() ? "{}" : a->training_json);
          j->schedule = parse_schedule(training.value("schedule", std::string("gpipe")));
          j->microbatches = training.value("microbatches", 1);
          j->seed = training.value("seed", static_cast<uint64_t>(1));
          const int64_t batch = training.value("batch", static_cast<int64_t>(64));
          j->encoding = a->link_encoding;
          OptimizerConfig ocfg = OptimizerConfig::from_json(nlohmann::json::parse(a->optimizer_json));
          StageMemory need = estimate_stage_memory(j->spec, a->layer_begin, a->layer_end, ocfg, batch,
                                                   max_in_flight(j->schedule, a->stage, a->num_stages, j->microbatches),
                                                   j->microbatches, device->backend());
          const MemoryInfo mem = device->memory();
          if (need.total() > mem.free)
            throw OutOfMemory(opts.name + " cannot host stage " + std::to_string(a->stage) + " (layers " +
                              std::to_string(a->layer_begin) + ".." + std::to_string(a->layer_end - 1) + "): it needs " +
                              need.describe() + " but only " + format_mib(mem.free) + " is available" +
                              (opts.memory_limit ? " under --memory-limit " + format_mib(opts.memory_limit) : ""));
          j->stage = std::make_unique<Stage>(*device, j->spec, a->layer_begin, a->layer_end, a->stage, a->num_stages, ocfg);
          j->stage->partition().init(j->seed);
          j->stage->partition().zero_grad();
          nlohmann::json detail = nlohmann::json::object();
          if (a->prev) {
            ServerOptions sopts;
            sopts.bind = opts.peer_bind;
            sopts.keys = keys;
            sopts.insecure = opts.insecure;
            if (!opts.insecure) sopts.allow.add(a->prev->name.empty() ? "prev" : a->prev->name, a->prev->public_key);
            sopts.label = "cleaved " + opts.name + " peer";
            j->peer_server = std::make_unique<ServerEndpoint>(sopts);
            detail["peer_endpoint"] = j->peer_server->endpoint();
          }
          j->tracer = std::make_unique<StageTracer>(a->stage, Clock::time_point{});
          job = std::move(j);
          info(opts.name, "assigned stage " + std::to_string(a->stage) + " of " + std::to_string(a->num_stages) +
                              ": layers " + std::to_string(a->layer_begin) + ".." + std::to_string(a->layer_end - 1));
          channel.send(ack_message(rid, detail));
        } catch (const std::exception& e) {
          warn(opts.name, std::string("refused assignment: ") + e.what());
          channel.send(error_message(ErrorCode::kRefused, e.what(), rid));
          job.reset();
        }
        continue;
      }
      auto* c = std::get_if<ControlMsg>(&cmd->body);
      if (!c) continue;
      nlohmann::json arg;
      try {
        arg = control_argument(*c);
      } catch (const std::exception& e) {
        channel.send(error_message(ErrorCode::kBadMessage, e.what(), rid));
        continue;
      }
      const std::string op = arg.value("op", std::string());
      if (c->command == ControlCommand::kShutdown) {
        channel.send(ack_message(rid, {{"op", "shutdown"}}));
        info(opts.name, "shutdown requested by the coordinator");
        return 0;
      }
      if (!job && c->command == ControlCommand::kStart && op == "profile") {
        // Planner input: measured per-layer time for the job's model, before any assignment.
        try {
          ModelSpec spec = ModelSpec::parse(arg.at("model"), "profiled model");
          auto seconds = profile_layers(*device, spec, arg.value("samples", static_cast<int64_t>(16)));
          nlohmann::json detail = {{"op", "profile"}, {"layer_seconds_per_sample", seconds}};
          if (arg.contains("optimizer"))
            detail["update_seconds_per_param"] =
                profile_update(*device, OptimizerConfig::from_json(arg.at("optimizer")));
          channel.send(ack_message(rid, detail));
        } catch (const std::exception& e) {
          channel.send(error_message(ErrorCode::kBadMessage, opts.name + " cannot profile the model: " + e.what(), rid));
        }
        continue;
      }
      if (!job && c->command == ControlCommand::kStart &&
          (op == "probe_serve" || op == "probe_peer" || op == "probe_stop")) {
        // Planner input: this daemon's links to the others (link_probe.h), before any assignment.
        try {
          if (opts.insecure) throw std::runtime_error("link probes need CURVE keys (the daemon runs --insecure)");
          const std::string peer = arg.at("peer").get<std::string>();
          nlohmann::json detail = {{"op", op}, {"peer", peer}};
          if (op == "probe_serve") {
            auto server = std::make_unique<ProbeEchoServer>(opts.peer_bind, keys, peer, arg.at("peer_key").get<std::string>(),
                                                            opts.bandwidth_limit);
            detail["endpoint"] = server->endpoint();
            probe_servers[peer] = std::move(server);
          } else if (op == "probe_peer") {
            ClientOptions po;
            po.connect = arg.at("endpoint").get<std::string>();
            po.keys = keys;
            po.server_public_key = arg.at("peer_key").get<std::string>();
            po.label = "cleaved " + opts.name + " link probe -> " + peer;
            const LinkMeasurement lm = probe_peer_link(po, opts.bandwidth_limit);
            detail["latency_ms"] = lm.latency_ms;
            detail["mbps_out"] = lm.mbps_out;
            detail["mbps_in"] = lm.mbps_in;
          } else {
            probe_servers.erase(peer);
          }
          channel.send(ack_message(rid, detail));
        } catch (const std::exception& e) {
          channel.send(error_message(ErrorCode::kBadMessage, opts.name + " cannot probe the link: " + e.what(), rid));
        }
        continue;
      }
      if (!job) {
        if (c->command != ControlCommand::kStop)
          channel.send(error_message(ErrorCode::kNotAssigned, opts.name + " has no stage assigned", rid));
        continue;
      }
      try {
        if (c->command == ControlCommand::kStop) {
          nlohmann::json events = nlohmann::json::array();
          for (const auto& e : job->tracer->events()) events.push_back(to_json(e));
          channel.send(ack_message(rid, {{"op", "finish"}, {"trace", events}, {"busy", job->tracer->busy_seconds()},
                                         {"steps", job->steps}}));
          drop_job("");
          ++jobs_done;
          last_register = Clock::now() - std::chrono::seconds(10);
        } else if (c->command == ControlCommand::kStart && op == "connect") {
          if (job->assign.next) {
            ClientOptions lo;
            lo.connect = arg.at("next_endpoint").get<std::string>();
            lo.keys = keys;
            lo.server_public_key = job->assign.next->public_key;
            lo.insecure = opts.insecure;
            lo.label = "cleaved " + opts.name + " -> next";
            job->next = dial_tensor_link(lo, job->encoding);
            if (opts.bandwidth_limit > 0) job->next = throttle_link(std::move(job->next), opts.bandwidth_limit);
          }
          if (job->assign.prev) {
            job->prev = serve_tensor_link(*job->peer_server, job->assign.prev->name.empty() ? "prev" : job->assign.prev->name,
                                          job->encoding);
            if (opts.bandwidth_limit > 0) job->prev = throttle_link(std::move(job->prev), opts.bandwidth_limit);
          }
          channel.send(ack_message(rid, {{"op", "connect"}}));
        } else if (c->command == ControlCommand::kStart && op == "step") {
          const int64_t step = arg.at("step").get<int64_t>();
          const int64_t batch = arg.at("batch").get<int64_t>();
          const int m = static_cast<int>(std::min<int64_t>(job->microbatches, batch));
          DaemonIO io(*device, *job, channel, opts, stop);
          auto actions = make_schedule(job->schedule, job->stage->index(), job->stage->count(), m);
          const double t0 = monotonic_us();
          StepMetrics sm = job->stage->run(actions, io, step, batch, job->seed, job->tracer.get());
          ++job->steps;
          MetricsMsg mm;
          mm.stage = job->stage->index();
          mm.step = step;
          mm.loss_sum = sm.loss_sum;
          mm.correct = sm.correct;
          mm.sample_count = sm.samples;
          mm.timings_json = nlohmann::json{{"step_ms", (monotonic_us() - t0) / 1000.0}}.dump();
          Message msg;
          msg.body = mm;
          channel.send(msg);
        } else if (c->command == ControlCommand::kCheckpoint) {
          // "weights": the parameters (to evaluate); "state": with the optimizer state (--save).
          channel.send(stage_state_message(capture_stage_state(*job->stage, op == "state"), rid));
        } else {
          channel.send(error_message(ErrorCode::kBadMessage, "unknown control op '" + op + "'", rid));
        }
      } catch (const JobAborted& e) {
        drop_job(e.what());
        ++jobs_done;
      } catch (const std::exception& e) {
        const std::string text = opts.name + " (stage " + std::to_string(job->stage ? job->stage->index() : -1) +
                                 ") failed: " + e.what();
        channel.send(error_message(ErrorCode::kInternal, text, rid));
        drop_job(e.what());
        ++jobs_done;
      }
    }
  }
  return 0;
}

}  // namespace cleave
