// pipeline_job.cpp: see pipeline_job.h.
#include "core/runtime/daemon/pipeline_job.h"

#include "core/runtime/daemon/daemon_monitor.h"
#include "core/runtime/daemon/link_pump.h"

#include <cstdio>
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>

#include "core/model/model_spec.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/stage.h"
#include "core/planner/memory_model.h"
#include "core/runtime/common/stage_state.h"
#include "core/runtime/common/wire.h"
#include "transport/endpoint.h"
#include "transport/link.h"
#include "transport/log.h"

namespace cleave {
namespace {

using namespace transport;
using Clock = std::chrono::steady_clock;

struct JobAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The stage this daemon runs and its links.
struct StageJob {
  AssignMsg assign;
  ModelSpec spec;
  ScheduleKind schedule = ScheduleKind::gpipe;
  int microbatches = 1;
  uint64_t seed = 1;
  std::unique_ptr<Stage> stage;
  std::unique_ptr<ServerEndpoint> peer_server;  // the previous stage dials in here
  std::unique_ptr<LinkPump> prev, next;  // the links, each on its own thread (after peer_server: stopped first)
  std::unique_ptr<StageTracer> tracer;
  int64_t steps = 0;
  size_t estimated_bytes = 0;  // what the memory model said the stage needs
  DecodeLimits link_limits;    // what the stage links accept: the job's largest activation
};

// Caps of both stage links: a whole batch (the micro-batches are smaller) of
// the activation at either cut of layers [begin, end), in float32.
DecodeLimits stage_link_limits(const ModelSpec& spec, const AssignMsg& a, int64_t batch) {
  const int64_t widest = std::max(numel(spec.shapes.at(a.layer_begin)), numel(spec.shapes.at(a.layer_end)));
  return payload_limits(static_cast<size_t>(std::max<int64_t>(batch, 1) * widest) * sizeof(float));
}

// "the previous stage d1 (link zmq tcp://127.0.0.1:4000 f32)": how errors name a neighbour.
std::string neighbour(const AssignMsg& a, bool previous, const TensorLink& link) {
  const auto& peer = previous ? a.prev : a.next;
  std::string text = previous ? "the previous stage" : "the next stage";
  if (peer && !peer->name.empty()) text += " " + peer->name;
  return text + " (link " + link.describe() + ")";
}

// The stage links' queues: one tensor being sent per link (what the memory
// model counts), and up to two steps of micro-batches received ahead.
LinkPump::Limits pump_limits(int microbatches) {
  LinkPump::Limits l;
  l.sends = kStageLinkSends;
  l.received = static_cast<size_t>(std::max(4, 2 * microbatches + 2));
  return l;
}

// Where a running stage's tensors come from and go to: the coordinator's
// mailbox (inputs, labels) and the links to the neighbouring stages. Every
// wait of a step is bounded by the step's deadline (StepCmd.deadline_ms, set
// by the coordinator from the measured step time and --peer-timeout): a
// stalled link ends the job with an error that names the stage, the link and
// what it waited for, instead of waiting for ever. The links run on their own
// threads (LinkPump): a send returns once the tensor is queued, and the stage
// computes on while it is on the wire.
class DaemonIO : public StageIO {
 public:
  DaemonIO(const JobContext& ctx, StageJob& job, Millis deadline) : ctx_(ctx), job_(job), deadline_(deadline) {}

  Tensor receive_input(int64_t step, int mb) override {
    if (!job_.prev) return from_message(ctx_.device, wait_coordinator(TensorKind::kInput, step, mb));
    return from_message(ctx_.device, wait_link(*job_.prev, TensorKind::kActivation, step, mb));
  }
  Tensor receive_targets(int64_t step, int mb) override {
    return from_message(ctx_.device, wait_coordinator(TensorKind::kLabels, step, mb));
  }
  void send_output(int64_t step, int mb, const Tensor& y) override {
    send(*job_.next, to_message(y, TensorKind::kActivation, step, mb));
  }
  Tensor receive_output_grad(int64_t step, int mb) override {
    return from_message(ctx_.device, wait_link(*job_.next, TensorKind::kGradient, step, mb));
  }
  void send_input_grad(int64_t step, int mb, const Tensor& dx) override {
    send(*job_.prev, to_message(dx, TensorKind::kGradient, step, mb));
  }

 private:
  void check_alive() {
    if (const std::string why = job_interruption(ctx_.serving("stage")); !why.empty()) throw JobAborted(why);
  }

  // Throws once `t0` is more than the step's deadline ago: `what()` says what
  // the stage was waiting for (built only then: the waits poll every few ms).
  template <typename What>
  void check_deadline(Clock::time_point t0, const What& what) const {
    if (deadline_.count() <= 0 || Clock::now() - t0 <= deadline_) return;
    char waited[32];
    std::snprintf(waited, sizeof waited, "%.1f s", std::chrono::duration<double>(Clock::now() - t0).count());
    throw std::runtime_error("stage " + std::to_string(job_.assign.stage) + " waited " + waited + " for " + what() +
                             " (the step's deadline is " + std::to_string(deadline_.count()) + " ms): the link stalled");
  }

  static std::string tensor_of(TensorKind kind, int64_t step, int mb) {
    return std::string("the ") + tensor_kind_name(kind) + " of step " + std::to_string(step) + ", micro-batch " +
           std::to_string(mb);
  }

  TensorMessage wait_coordinator(TensorKind kind, int64_t step, int mb) {
    const auto t0 = Clock::now();
    for (;;) {
      if (auto t = ctx_.channel.take_tensor(kind, step, mb)) return std::move(*t);
      check_alive();
      check_deadline(t0, [&] { return tensor_of(kind, step, mb) + " from the coordinator"; });
      ctx_.channel.poll(Millis(50));
    }
  }

  TensorMessage wait_link(LinkPump& link, TensorKind kind, int64_t step, int mb) {
    const auto t0 = Clock::now();
    for (;;) {
      if (auto t = link.try_take(kind, step, mb, Millis(20))) return std::move(*t);
      ctx_.channel.drain();
      check_alive();
      check_deadline(t0, [&] { return tensor_of(kind, step, mb) + " from " + link.peer(); });
    }
  }

  // Waits while the link's send queue is full (back-pressure). The pump frees
  // a micro-batch's output and input gradient as soon as they are on the
  // wire; the memory model counts the queue (core/planner/memory_model.h).
  void send(LinkPump& link, TensorMessage m) {
    const auto t0 = Clock::now();
    while (!link.try_send(m, Millis(20))) {  // `m` stays whole until it is queued
      ctx_.channel.drain();
      check_alive();
      check_deadline(t0, [&] {
        return "room on the link to " + link.peer() + " for " + tensor_of(m.kind, m.step, m.micro_batch);
      });
    }
  }

  const JobContext& ctx_;
  StageJob& job_;
  Millis deadline_;
};

// Builds the stage of `a`, or throws (OutOfMemory, a bad model) with the reason.
std::unique_ptr<StageJob> build_stage(const JobContext& ctx, const AssignMsg& a) {
  const DaemonOptions& opts = ctx.options;
  auto j = std::make_unique<StageJob>();
  const auto& pj = std::get<PipelineJob>(a.job);
  j->assign = a;
  j->spec = parse_model_text(a.model_spec_json, "assigned model");
  j->schedule = schedule_from_wire(pj.schedule);
  j->microbatches = pj.microbatches;
  j->seed = pj.seed;
  const OptimizerConfig ocfg = from_wire(a.optimizer);
  const StageMemory need =
      stage_memory(j->spec, a.layer_begin, a.layer_end, ocfg, pj.batch, j->microbatches,
                   max_in_flight(j->schedule, a.stage, a.num_stages, j->microbatches), ctx.device.backend(),
                   pj.recompute, recompute_saves_memory(j->schedule));
  const MemoryInfo mem = ctx.device.memory();
  j->estimated_bytes = need.total();
  if (need.total() > mem.free)
    throw OutOfMemory(opts.name + " cannot host stage " + std::to_string(a.stage) + " (layers " +
                      std::to_string(a.layer_begin) + ".." + std::to_string(a.layer_end - 1) + "): it needs " +
                      need.describe() + " but only " + format_mib(mem.free) + " is available" +
                      (opts.memory_limit ? " under --memory-limit " + format_mib(opts.memory_limit) : ""));
  ctx.device.reset_peak();  // the stage's peak, reported when it finishes, starts here
  j->stage = std::make_unique<Stage>(ctx.device, j->spec, a.layer_begin, a.layer_end, a.stage, a.num_stages, ocfg);
  j->stage->partition().set_recompute(pj.recompute);
  j->stage->partition().init(j->seed);
  j->stage->partition().zero_grad();
  j->link_limits = stage_link_limits(j->spec, a, pj.batch);
  if (a.prev) {
    ServerOptions sopts;
    sopts.tuning.limits = j->link_limits;
    sopts.bind = opts.peer_bind;
    sopts.keys = ctx.keys;
    sopts.insecure = opts.insecure;
    if (!opts.insecure) sopts.allow.add(a.prev->name.empty() ? "prev" : a.prev->name, a.prev->public_key);
    sopts.label = "cleaved " + opts.name + " peer";
    j->peer_server = std::make_unique<ServerEndpoint>(sopts);
  }
  j->tracer = std::make_unique<StageTracer>(a.stage, Clock::time_point{});
  return j;
}

class PipelineStage {
 public:
  PipelineStage(const JobContext& ctx, std::unique_ptr<StageJob> job) : ctx_(ctx), job_(std::move(job)) {}

  JobEnd serve() {
    return serve_job(
        ctx_.serving("stage"), [this] { return finish_detail(); },
        [this](const Command& c, uint64_t rid) { return handle(c, rid); }, [this] { take_starting_state(); });
  }

 private:
  nlohmann::json finish_detail() const {
    nlohmann::json events = nlohmann::json::array();
    for (const auto& e : job_->tracer->events()) events.push_back(to_json(e));
    // The stage's real peak beside its estimate (0: the backend cannot tell).
    return {{"trace", events},
            {"busy", job_->tracer->busy_seconds()},
            {"steps", job_->steps},
            {"estimated_memory_bytes", job_->estimated_bytes},
            {"recompute", job_->stage->partition().recompute()},
            {"peak_memory_bytes", ctx_.device.peak_bytes_in_use()}};
  }

  // A stage state to start from (--load, --init), when one arrived.
  void take_starting_state() {
    auto w = ctx_.channel.take_weights(job_->stage->index());
    if (!w) return;
    Stage& stage = *job_->stage;
    try {
      const size_t buffers = stage.optimizer().state().size();
      restore_stage_state(stage, read_stage_state(*w, stage.partition().param_count(), buffers));
      ctx_.channel.send(ack_message(w->request_id, {{"op", "load_state"}}));
    } catch (const std::exception& e) {
      ctx_.channel.send(error_message(ErrorCode::kBadMessage,
                                      ctx_.options.name + " cannot load the stage state: " + e.what(), w->request_id));
    }
  }

  std::optional<JobEnd> handle(const Command& c, uint64_t rid) {
    try {
      if (const auto* s = std::get_if<StepCmd>(&c)) {
        step(*s, rid);
      } else if (const auto* k = std::get_if<ConnectCmd>(&c)) {
        connect(*k);
        ctx_.channel.send(ack_message(rid, {{"op", "connect"}}));
      } else if (const auto* ck = std::get_if<CheckpointCmd>(&c)) {
        // kParams: the parameters (to evaluate); kParamsAndOptimizer: with the optimizer state (--save).
        const bool with_optimizer = ck->what == StateKind::kParamsAndOptimizer;
        ctx_.channel.send(stage_state_message(capture_stage_state(*job_->stage, with_optimizer), rid));
      } else {
        ctx_.channel.send(error_message(ErrorCode::kBadMessage, std::string("unexpected command '") + command_name(c) +
                                                                    "' for a pipeline stage", rid));
      }
    } catch (const JobAborted& e) {
      log(LogLevel::kWarning, "cleaved " + ctx_.options.name + ": job ended: " + e.what());
      return JobEnd::abandoned;
    } catch (const std::exception& e) {
      const std::string text =
          ctx_.options.name + " (stage " + std::to_string(job_->stage->index()) + ") failed: " + e.what();
      ctx_.channel.send(error_message(ErrorCode::kInternal, text, rid));
      log(LogLevel::kWarning, "cleaved " + ctx_.options.name + ": job ended: " + e.what());
      return JobEnd::abandoned;
    }
    return std::nullopt;
  }

  void connect(const ConnectCmd& k) {
    const DaemonOptions& opts = ctx_.options;
    StageJob& job = *job_;
    const auto pump = [&](std::unique_ptr<TensorLink> link, bool previous) {
      if (opts.bandwidth_limit > 0) link = throttle_link(std::move(link), opts.bandwidth_limit);
      std::string peer = neighbour(job.assign, previous, *link);
      return std::make_unique<LinkPump>(std::move(link), std::move(peer), pump_limits(job.microbatches),
                                        "cleaved " + opts.name + ": ");
    };
    if (job.assign.next) {
      ClientOptions lo;
      lo.connect = k.next_endpoint;
      lo.keys = ctx_.keys;
      lo.server_public_key = job.assign.next->public_key;
      lo.insecure = opts.insecure;
      lo.label = "cleaved " + opts.name + " -> next";
      lo.tuning.limits = job.link_limits;
      job.next = pump(dial_tensor_link(lo, job.assign.link_encoding), false);
    }
    if (job.assign.prev) {
      const std::string name = job.assign.prev->name.empty() ? "prev" : job.assign.prev->name;
      job.prev = pump(serve_tensor_link(*job.peer_server, name, job.assign.link_encoding), true);
    }
  }

  void step(const StepCmd& s, uint64_t rid) {
    StageJob& job = *job_;
    const auto& pj = std::get<PipelineJob>(job.assign.job);
    if (s.plan_epoch != pj.plan_epoch) {  // not this stage's plan: running it would mix two plans' tensors
      ctx_.channel.send(error_message(ErrorCode::kBadMessage,
                                      ctx_.options.name + " refused step " + std::to_string(s.step) + " of plan " +
                                          std::to_string(s.plan_epoch) + ": its stage belongs to plan " +
                                          std::to_string(pj.plan_epoch),
                                      rid));
      return;
    }
    const int m = static_cast<int>(std::min<int64_t>(job.microbatches, s.batch));
    DaemonIO io(ctx_, job, Millis(s.deadline_ms));
    auto actions = make_schedule(job.schedule, job.stage->index(), job.stage->count(), m);
    const double t0 = monotonic_us();
    StepMetrics sm = job.stage->run(actions, io, s.step, s.batch, job.seed, job.tracer.get());
    ++job.steps;
    MetricsMsg mm;
    mm.stage = job.stage->index();
    mm.step = s.step;
    mm.loss_sum = sm.loss_sum;
    mm.correct = sm.correct;
    mm.sample_count = sm.samples;
    mm.step_ms = (monotonic_us() - t0) / 1000.0;
    mm.job_id = pj.job_id;
    mm.plan_epoch = pj.plan_epoch;
    ctx_.channel.send(message_of(mm));
    report_links();
    const bool last = job.stage->index() == job.stage->count() - 1;
    ctx_.progress("stage", s.step,
                  last && sm.samples > 0 ? sm.loss_sum / static_cast<double>(sm.samples) : std::nan(""));
  }

  // The stage links' traffic so far, for --metrics-listen (daemon_monitor.h).
  void report_links() const {
    if (!ctx_.monitor) return;
    const StageJob& job = *job_;
    if (job.prev) {
      const LinkStats s = job.prev->stats();
      ctx_.monitor->link_traffic("previous", job.assign.prev->name, s.payload_bytes_sent, s.payload_bytes_received,
                                 job.peer_server->stats().handshakes_failed);
    }
    if (job.next) {
      const LinkStats s = job.next->stats();
      ctx_.monitor->link_traffic("next", job.assign.next->name, s.payload_bytes_sent, s.payload_bytes_received, 0);
    }
  }

  const JobContext& ctx_;
  std::unique_ptr<StageJob> job_;
};

}  // namespace

JobEnd run_pipeline_stage(const JobContext& ctx, const AssignMsg& a, uint64_t request_id) {
  std::unique_ptr<StageJob> job;
  const bool ready = set_up_job(ctx, "assignment", request_id, [&] {
    job = build_stage(ctx, a);
    nlohmann::json detail = nlohmann::json::object();
    if (job->peer_server) detail["peer_endpoint"] = job->peer_server->endpoint();
    log(LogLevel::kInfo, "cleaved " + ctx.options.name + ": assigned stage " + std::to_string(a.stage) + " of " +
                             std::to_string(a.num_stages) + ": layers " + std::to_string(a.layer_begin) + ".." +
                             std::to_string(a.layer_end - 1));
    return detail;
  });
  if (!ready) return JobEnd::refused;
  return PipelineStage(ctx, std::move(job)).serve();
}

}  // namespace cleave
