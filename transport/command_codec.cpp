// command_codec.cpp: typed job commands and job specs on the wire; see
// command_codec.h and docs/protocol.md.
#include "transport/command_codec.h"

#include <cmath>

namespace cleave::transport {

const char* command_name(const Command& command) {
  static const char* const kNames[] = {"profile", "probe_serve", "probe_peer", "probe_stop", "connect", "step",
                                       "finish",  "shutdown",    "checkpoint", "fed_round",  "split_round"};
  static_assert(std::variant_size_v<Command> == 11);
  return kNames[command.index()];
}

const char* split_phase_name(SplitPhase phase) {
  switch (phase) {
    case SplitPhase::kTrain: return "split_round";
    case SplitPhase::kEval: return "split_eval";
    case SplitPhase::kAverage: return "split_weights";
    case SplitPhase::kDrop: return "split_drop";
    case SplitPhase::kRejoin: return "split_rejoin";
  }
  return "?";
}

const char* job_kind_name(const JobSpec& job) {
  static const char* const kNames[] = {"pipeline", "federated", "split"};
  static_assert(std::variant_size_v<JobSpec> == 3);
  return kNames[job.index()];
}

Message message_of(Body body, uint64_t request_id) {
  Message m;
  m.request_id = request_id;
  m.body = std::move(body);
  return m;
}

Message command_message(Command command, uint64_t request_id) {
  return message_of(CommandMsg{std::move(command)}, request_id);
}

namespace detail {
namespace fb = ::cleave::wire;

std::string check_string(const char* field, const std::string& s, const DecodeLimits& limits) {
  if (s.size() > limits.max_string_bytes)
    return std::string(field) + " is " + std::to_string(s.size()) + " bytes (limit " +
           std::to_string(limits.max_string_bytes) + ")";
  if (s.find('\0') != std::string::npos) return std::string(field) + " contains a NUL byte";
  return {};
}

std::string check_key(const char* field, const std::string& key) {
  if (!key.empty() && !is_z85_key(key)) return std::string(field) + " is not a 40-character Z85 public key";
  return {};
}

namespace {

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

// Every string field of a command, with its name, for one check loop.
struct CommandValidator {
  const DecodeLimits& limits;

  std::string strings(const char* what, std::initializer_list<const std::string*> fields) const {
    for (const auto* s : fields)
      if (auto e = check_string(what, *s, limits); !e.empty()) return e;
    return {};
  }
  std::string operator()(const ProfileCmd& c) const {
    if (c.model_spec_json.empty()) return "profile: empty model";
    if (c.samples < 1 || c.samples > (1 << 20)) return "profile: samples must be in [1, 1048576]";
    if (c.in_flight < 1 || c.in_flight > 1024) return "profile: in_flight must be in [1, 1024]";
    return strings("profile model", {&c.model_spec_json});
  }
  std::string operator()(const ProbeServeCmd& c) const {
    if (c.peer.empty()) return "probe_serve: empty peer";
    if (auto e = check_key("probe_serve.peer_key", c.peer_key); !e.empty()) return e;
    return strings("probe_serve peer", {&c.peer});
  }
  std::string operator()(const ProbePeerCmd& c) const {
    if (c.peer.empty() || c.endpoint.empty()) return "probe_peer: empty peer or endpoint";
    if (auto e = check_key("probe_peer.peer_key", c.peer_key); !e.empty()) return e;
    return strings("probe_peer string", {&c.peer, &c.endpoint});
  }
  std::string operator()(const ProbeStopCmd& c) const {
    if (c.peer.empty()) return "probe_stop: empty peer";
    return strings("probe_stop peer", {&c.peer});
  }
  std::string operator()(const ConnectCmd& c) const { return strings("connect.next_endpoint", {&c.next_endpoint}); }
  std::string operator()(const StepCmd& c) const {
    if (c.step < 0) return "step: negative step " + std::to_string(c.step);
    if (c.batch < 1) return "step: batch must be >= 1, got " + std::to_string(c.batch);
    return {};
  }
  std::string operator()(const FinishCmd&) const { return {}; }
  std::string operator()(const ShutdownCmd&) const { return {}; }
  std::string operator()(const CheckpointCmd& c) const {
    if (static_cast<uint8_t>(c.what) > 1) return "checkpoint: unknown state kind";
    return {};
  }
  std::string operator()(const FedRoundCmd& c) const {
    if (c.round < 0) return "fed_round: negative round";
    if (c.local_epochs < 1) return "fed_round: local_epochs must be >= 1";
    if (c.batch < 1) return "fed_round: batch must be >= 1";
    if (!std::isfinite(c.mu) || c.mu < 0) return "fed_round: mu must be finite and >= 0";
    return c.secagg ? secagg_setup(*c.secagg) : std::string();
  }
  std::string secagg_setup(const SecAggSetup& s) const {
    const auto n = static_cast<int64_t>(s.clients.size());
    if (n > static_cast<int64_t>(kMaxSecAggClients))
      return "fed_round.secagg: more than " + std::to_string(kMaxSecAggClients) + " clients";
    if (s.threshold < 2 || s.threshold > n)
      return "fed_round.secagg: threshold " + std::to_string(s.threshold) + " outside [2, " + std::to_string(n) + "]";
    for (const auto& c : s.clients) {
      if (auto e = check_key("fed_round.secagg.clients.public_key", c.public_key); !e.empty()) return e;
      if (c.public_key.empty()) return "fed_round.secagg: a client without a public key";
      if (auto e = check_string("fed_round.secagg client name", c.name, limits); !e.empty()) return e;
    }
    if (!std::isfinite(s.range) || s.range <= 0) return "fed_round.secagg: range must be finite and > 0";
    if (s.frac_bits < 1 || s.frac_bits > 40) return "fed_round.secagg: frac_bits outside [1, 40]";
    if (!std::isfinite(s.clip) || s.clip < 0) return "fed_round.secagg: clip must be finite and >= 0";
    if (!std::isfinite(s.noise_stddev) || s.noise_stddev < 0)
      return "fed_round.secagg: noise_stddev must be finite and >= 0";
    return {};
  }
  std::string operator()(const SplitRoundCmd& c) const {
    if (static_cast<uint8_t>(c.phase) > 4) return "split_round: unknown phase";
    if (c.round < 0) return "split_round: negative round";
    for (int32_t i : c.order)
      if (i < 0) return "split_round: negative client index in order";
    return {};
  }
};

struct JobValidator {
  const DecodeLimits& limits;
  std::string operator()(const PipelineJob& j) const {
    if (j.schedule > static_cast<uint8_t>(fb::Schedule::MAX))
      return "assign: unknown schedule " + std::to_string(j.schedule);
    if (j.microbatches < 1) return "assign: microbatches must be >= 1";
    if (j.batch < 1) return "assign: batch must be >= 1";
    return {};
  }
  std::string operator()(const FedJob& j) const {
    if (j.batch < 1) return "assign: batch must be >= 1";
    return check_string("assign strategy", j.strategy, limits);
  }
  std::string operator()(const SplitJob& j) const {
    if (static_cast<uint8_t>(j.role) > 1) return "assign: unknown split role";
    if (j.batch < 1 || j.eval_batch < 1) return "assign: batch and eval_batch must be >= 1";
    if (j.epochs < 1) return "assign: epochs must be >= 1";
    if (j.client_index < 0) return "assign: negative client_index";
    if (j.limit_test < -1) return "assign: limit_test must be >= -1";
    if (j.cut_back < -1) return "assign: cut_back must be >= -1";
    if (!std::isfinite(j.activation_noise) || j.activation_noise < 0 || !std::isfinite(j.activation_clip) ||
        j.activation_clip < 0)
      return "assign: activation_noise and activation_clip must be finite and >= 0";
    if (j.activation_noise > 0 && j.activation_clip <= 0) return "assign: activation_noise needs activation_clip > 0";
    if (j.clients.size() > 4096) return "assign: more than 4096 split clients";
    for (const auto& c : j.clients) {
      if (auto e = check_key("assign.clients.public_key", c.public_key); !e.empty()) return e;
      if (auto e = check_string("assign client name", c.name, limits); !e.empty()) return e;
    }
    return {};
  }
};

}  // namespace

std::string validate_command(const CommandMsg& command, const DecodeLimits& limits) {
  return std::visit(CommandValidator{limits}, command.command);
}

std::string validate_assign_job(const AssignMsg& a, const DecodeLimits& limits) {
  const OptimizerSpec& o = a.optimizer;
  for (const auto* s : {&o.kind, &o.schedule})
    if (auto e = check_string("assign optimizer string", *s, limits); !e.empty()) return e;
  for (float v : {o.lr, o.momentum, o.dampening, o.weight_decay, o.beta1, o.beta2, o.eps, o.gamma, o.min_lr})
    if (!std::isfinite(v)) return "assign: a non-finite optimizer setting";
  return std::visit(JobValidator{limits}, a.job);
}

// ---------------------------------------------------------------------------
// C++ -> FlatBuffers

flatbuffers::Offset<fb::OptimizerSpec> build_optimizer(Builder& b, const OptimizerSpec& o) {
  return fb::CreateOptimizerSpecDirect(b, o.kind.c_str(), o.lr, o.momentum, o.dampening, o.weight_decay, o.beta1,
                                       o.beta2, o.eps, o.nesterov, o.schedule.c_str(), o.step_size, o.gamma,
                                       o.warmup_steps, o.total_steps, o.min_lr);
}

namespace {

using Built = std::pair<fb::CommandBody, flatbuffers::Offset<void>>;

struct CommandBuilder {
  Builder& b;
  Built operator()(const ProfileCmd& c) const {
    auto opt = c.optimizer ? build_optimizer(b, *c.optimizer) : 0;
    return {fb::CommandBody::Profile, fb::CreateProfileDirect(b, c.model_spec_json.c_str(), c.samples, opt, c.split_backward, c.in_flight).Union()};
  }
  Built operator()(const ProbeServeCmd& c) const {
    return {fb::CommandBody::ProbeServe, fb::CreateProbeServeDirect(b, c.peer.c_str(), c.peer_key.c_str()).Union()};
  }
  Built operator()(const ProbePeerCmd& c) const {
    auto off = fb::CreateProbePeerDirect(b, c.peer.c_str(), c.peer_key.c_str(), c.endpoint.c_str());
    return {fb::CommandBody::ProbePeer, off.Union()};
  }
  Built operator()(const ProbeStopCmd& c) const {
    return {fb::CommandBody::ProbeStop, fb::CreateProbeStopDirect(b, c.peer.c_str()).Union()};
  }
  Built operator()(const ConnectCmd& c) const {
    return {fb::CommandBody::Connect, fb::CreateConnectDirect(b, c.next_endpoint.c_str()).Union()};
  }
  Built operator()(const StepCmd& c) const {
    return {fb::CommandBody::Step, fb::CreateStep(b, c.step, c.batch, c.deadline_ms, c.plan_epoch).Union()};
  }
  Built operator()(const FinishCmd&) const { return {fb::CommandBody::EndJob, fb::CreateEndJob(b).Union()}; }
  Built operator()(const ShutdownCmd&) const { return {fb::CommandBody::Shutdown, fb::CreateShutdown(b).Union()}; }
  Built operator()(const CheckpointCmd& c) const {
    return {fb::CommandBody::Checkpoint, fb::CreateCheckpoint(b, static_cast<fb::StateKind>(c.what)).Union()};
  }
  Built operator()(const FedRoundCmd& c) const {
    flatbuffers::Offset<fb::SecAggSetup> setup;
    if (c.secagg) {
      const auto& s = *c.secagg;
      std::vector<flatbuffers::Offset<fb::Peer>> clients;
      for (const auto& p : s.clients)
        clients.push_back(fb::CreatePeerDirect(b, p.endpoint.c_str(), p.public_key.c_str(), p.name.c_str()));
      setup = fb::CreateSecAggSetupDirect(b, s.threshold, &clients, s.range, s.frac_bits, s.clip, s.noise_stddev,
                                          s.weight_by_samples);
    }
    return {fb::CommandBody::FedRound, fb::CreateFedRound(b, c.round, c.local_epochs, c.batch, c.mu, setup).Union()};
  }
  Built operator()(const SplitRoundCmd& c) const {
    auto off = fb::CreateSplitRoundDirect(b, static_cast<fb::SplitPhase>(c.phase), c.round, &c.order);
    return {fb::CommandBody::SplitRound, off.Union()};
  }
};

}  // namespace

flatbuffers::Offset<fb::Command> build_command(Builder& b, const CommandMsg& command) {
  auto [type, body] = std::visit(CommandBuilder{b}, command.command);
  return fb::CreateCommand(b, type, body);
}

std::pair<fb::JobSpec, flatbuffers::Offset<void>> build_job(Builder& b, const JobSpec& job) {
  if (const auto* p = std::get_if<PipelineJob>(&job)) {
    auto off = fb::CreatePipelineJob(b, static_cast<fb::Schedule>(p->schedule), p->microbatches, p->seed, p->batch,
                                     p->job_id, p->plan_epoch, p->recompute);
    return {fb::JobSpec::PipelineJob, off.Union()};
  }
  if (const auto* f = std::get_if<FedJob>(&job))
    return {fb::JobSpec::FedJob, fb::CreateFedJobDirect(b, f->batch, f->seed, f->strategy.c_str()).Union()};
  const auto& s = std::get<SplitJob>(job);
  std::vector<flatbuffers::Offset<fb::Peer>> clients;
  for (const auto& c : s.clients)
    clients.push_back(fb::CreatePeerDirect(b, c.endpoint.c_str(), c.public_key.c_str(), c.name.c_str()));
  auto off = fb::CreateSplitJobDirect(b, static_cast<fb::SplitRole>(s.role), s.labels_on_client, s.seed, s.batch,
                                      s.eval_batch, s.epochs, &clients, s.client_index, s.limit_test, s.cut_back,
                                      s.activation_noise, s.activation_clip);
  return {fb::JobSpec::SplitJob, off.Union()};
}

// ---------------------------------------------------------------------------
// FlatBuffers -> C++ (the tables are verified; enum values are not)

std::string read_optimizer(const fb::OptimizerSpec* in, OptimizerSpec& o) {
  if (!in) return "assign: no optimizer";
  o.kind = str(in->kind());
  o.lr = in->lr();
  o.momentum = in->momentum();
  o.dampening = in->dampening();
  o.weight_decay = in->weight_decay();
  o.beta1 = in->beta1();
  o.beta2 = in->beta2();
  o.eps = in->eps();
  o.nesterov = in->nesterov();
  o.schedule = str(in->schedule());
  o.step_size = in->step_size();
  o.gamma = in->gamma();
  o.warmup_steps = in->warmup_steps();
  o.total_steps = in->total_steps();
  o.min_lr = in->min_lr();
  return {};
}

namespace {

std::vector<int32_t> ints(const flatbuffers::Vector<int32_t>* v) {
  std::vector<int32_t> out;
  if (v) out.assign(v->begin(), v->end());
  return out;
}

std::string read_split_job(const fb::SplitJob& s, JobSpec& out) {
  if (static_cast<uint8_t>(s.role()) > 1) return "assign: unknown split role";
  SplitJob j;
  j.role = static_cast<SplitRole>(s.role());
  j.labels_on_client = s.labels_on_client();
  j.seed = s.seed();
  j.batch = s.batch();
  j.eval_batch = s.eval_batch();
  j.epochs = s.epochs();
  if (s.clients())
    for (const auto* p : *s.clients()) j.clients.push_back({str(p->endpoint()), str(p->public_key()), str(p->name())});
  j.client_index = s.client_index();
  j.limit_test = s.limit_test();
  j.cut_back = s.cut_back();
  j.activation_noise = s.activation_noise();
  j.activation_clip = s.activation_clip();
  out = std::move(j);
  return {};
}

}  // namespace

std::string read_job(const fb::Assign& a, JobSpec& out) {
  if (a.job_type() != fb::JobSpec::NONE && a.job() == nullptr) return "assign: job kind without a job";
  switch (a.job_type()) {
    case fb::JobSpec::PipelineJob: {
      const auto* p = a.job_as_PipelineJob();
      out = PipelineJob{static_cast<uint8_t>(p->schedule()), p->microbatches(), p->seed(), p->batch(), p->job_id(),
                        p->plan_epoch(), p->recompute()};
      return {};
    }
    case fb::JobSpec::FedJob: {
      const auto* f = a.job_as_FedJob();
      out = FedJob{f->batch(), f->seed(), str(f->strategy())};
      return {};
    }
    case fb::JobSpec::SplitJob: return read_split_job(*a.job_as_SplitJob(), out);
    case fb::JobSpec::NONE: return "assign: no job";
  }
  return "assign: unknown job kind " + std::to_string(static_cast<int>(a.job_type()));
}

std::string read_command(const fb::Command& in, CommandMsg& out) {
  if (in.body_type() != fb::CommandBody::NONE && in.body() == nullptr) return "command kind without a body";
  switch (in.body_type()) {
    case fb::CommandBody::Profile: {
      const auto* c = in.body_as_Profile();
      ProfileCmd p{str(c->model_spec_json()), c->samples(), std::nullopt, c->split_backward(), c->in_flight()};
      if (c->optimizer()) {
        p.optimizer.emplace();
        (void)read_optimizer(c->optimizer(), *p.optimizer);
      }
      out.command = std::move(p);
      return {};
    }
    case fb::CommandBody::ProbeServe: {
      const auto* c = in.body_as_ProbeServe();
      out.command = ProbeServeCmd{str(c->peer()), str(c->peer_key())};
      return {};
    }
    case fb::CommandBody::ProbePeer: {
      const auto* c = in.body_as_ProbePeer();
      out.command = ProbePeerCmd{str(c->peer()), str(c->peer_key()), str(c->endpoint())};
      return {};
    }
    case fb::CommandBody::ProbeStop: out.command = ProbeStopCmd{str(in.body_as_ProbeStop()->peer())}; return {};
    case fb::CommandBody::Connect: out.command = ConnectCmd{str(in.body_as_Connect()->next_endpoint())}; return {};
    case fb::CommandBody::Step: {
      const auto* c = in.body_as_Step();
      out.command = StepCmd{c->step(), c->batch(), c->deadline_ms(), c->plan_epoch()};
      return {};
    }
    case fb::CommandBody::EndJob: out.command = FinishCmd{}; return {};
    case fb::CommandBody::Shutdown: out.command = ShutdownCmd{}; return {};
    case fb::CommandBody::Checkpoint: {
      const auto what = static_cast<uint8_t>(in.body_as_Checkpoint()->what());
      if (what > 1) return "checkpoint: unknown state kind " + std::to_string(what);
      out.command = CheckpointCmd{static_cast<StateKind>(what)};
      return {};
    }
    case fb::CommandBody::FedRound: {
      const auto* c = in.body_as_FedRound();
      FedRoundCmd f{c->round(), c->local_epochs(), c->batch(), c->mu(), std::nullopt};
      if (const auto* s = c->secagg()) {
        SecAggSetup setup;
        setup.threshold = s->threshold();
        if (s->clients()) {
          if (s->clients()->size() > kMaxSecAggClients) return "fed_round.secagg: too many clients";
          for (const auto* p : *s->clients())
            setup.clients.push_back({str(p->endpoint()), str(p->public_key()), str(p->name())});
        }
        setup.range = s->range();
        setup.frac_bits = s->frac_bits();
        setup.clip = s->clip();
        setup.noise_stddev = s->noise_stddev();
        setup.weight_by_samples = s->weight_by_samples();
        f.secagg = std::move(setup);
      }
      out.command = std::move(f);
      return {};
    }
    case fb::CommandBody::SplitRound: {
      const auto* c = in.body_as_SplitRound();
      const auto phase = static_cast<uint8_t>(c->phase());
      if (phase > 4) return "split_round: unknown phase " + std::to_string(phase);
      out.command = SplitRoundCmd{static_cast<SplitPhase>(phase), c->round(), ints(c->order())};
      return {};
    }
    case fb::CommandBody::NONE: return "command without a kind";
  }
  return "unknown command kind " + std::to_string(static_cast<int>(in.body_type()));
}

}  // namespace detail
}  // namespace cleave::transport
