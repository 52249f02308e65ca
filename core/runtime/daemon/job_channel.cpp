// job_channel.cpp: see job_channel.h.
#include "core/runtime/daemon/job_channel.h"

#include <nlohmann/json.hpp>

#include "transport/log.h"

namespace cleave {

using namespace transport;
using Clock = std::chrono::steady_clock;

bool JobChannel::poll(Millis timeout, const Wakeup* woken) {
  auto r = client_.receive(timeout, woken);
  if (!r) {
    if (r.is(FailureKind::kRejected))
      log(LogLevel::kWarning, "cleaved " + name_ + ": rejected a message from the coordinator: " + r.failure().message);
    return false;
  }
  if (auto* e = std::get_if<ErrorMsg>(&r.value().body); e && e->code == ErrorCode::kUnsupportedVersion) {
    // The coordinator cannot read us (message.h: encode_version_error): say why, once a minute at most.
    if (Clock::now() - last_version_error_ > std::chrono::minutes(1)) {
      log(LogLevel::kError, "cleaved " + name_ + ": the coordinator refused this daemon: " + e->message);
      last_version_error_ = Clock::now();
    }
    return true;
  }
  last_heard_ = Clock::now();
  Message& m = r.value();
  if (auto* hb = std::get_if<HeartbeatMsg>(&m.body)) {
    Message reply;
    reply.body = *hb;
    (void)client_.send(reply);
  } else if (auto* pr = std::get_if<ProbeMsg>(&m.body)) {
    // Link measurement: echo probes straight back (same size), so the
    // coordinator can time round trips over this encrypted link.
    if (pr->echo) {
      Message reply;
      reply.request_id = m.request_id;
      reply.body = ProbeMsg{pr->sequence, pr->payload_bytes, false};
      reply.payloads = std::move(m.payloads);
      (void)client_.send(reply);
    }
  } else if (auto* t = std::get_if<TensorMsg>(&m.body)) {
    std::vector<float> values = tensor_values(m);
    tensors_.put(TensorMessage::from_vector(t->kind, t->step, t->micro_batch, t->shape, std::move(values)),
                 "the coordinator");
  } else if (auto* w = std::get_if<WeightsMsg>(&m.body)) {
    weights_[w->stage] = std::move(m);
  } else if (auto* s = std::get_if<SecAggMsg>(&m.body)) {
    // A newer round's message retires the older rounds' (a coordinator cannot pile them up).
    const auto key = std::make_pair(s->round, static_cast<int>(s->phase));
    std::erase_if(secagg_, [&](const auto& kv) { return kv.first.first < key.first; });
    if (secagg_.empty() || secagg_.begin()->first.first == key.first) secagg_[key] = std::move(m);
  } else if (std::holds_alternative<AssignMsg>(m.body) || std::holds_alternative<CommandMsg>(m.body)) {
    commands_.push_back(std::move(m));
  } else {
    log(LogLevel::kWarning, "cleaved " + name_ + ": ignoring unexpected '" + body_kind_name(m.body) +
                                "' message from the coordinator");
  }
  return true;
}

std::optional<Message> JobChannel::pop_command() {
  if (commands_.empty()) return std::nullopt;
  Message m = std::move(commands_.front());
  commands_.pop_front();
  return m;
}

bool JobChannel::stop_queued() const {
  for (const auto& m : commands_)
    if (auto* c = std::get_if<CommandMsg>(&m.body))
      if (std::holds_alternative<FinishCmd>(c->command) || std::holds_alternative<ShutdownCmd>(c->command)) return true;
  return false;
}

std::optional<TensorMessage> JobChannel::take_tensor(TensorKind kind, int64_t step, int mb) {
  return tensors_.take(kind, step, mb);
}

std::optional<Message> JobChannel::take_secagg(int64_t round, SecAggPhase phase) {
  auto it = secagg_.find({round, static_cast<int>(phase)});
  if (it == secagg_.end()) return std::nullopt;
  Message m = std::move(it->second);
  secagg_.erase(it);
  return m;
}

std::optional<Message> JobChannel::take_weights(int stage) {
  auto it = weights_.find(stage);
  if (it == weights_.end()) return std::nullopt;
  Message m = std::move(it->second);
  weights_.erase(it);
  return m;
}

std::chrono::milliseconds JobChannel::silence() const {
  return std::chrono::duration_cast<Millis>(Clock::now() - last_heard_);
}

void JobChannel::send(const Message& m) {
  if (const auto* e = std::get_if<ErrorMsg>(&m.body); e && on_error) on_error(e->message);
  Status s = client_.send(m);
  if (!s)
    log(LogLevel::kWarning, "cleaved " + name_ + ": cannot send '" + std::string(body_kind_name(m.body)) +
                                "' to the coordinator: " + s.failure().message);
}

std::string job_interruption(const JobServing& job) {
  if (job.stop) return "the daemon is stopping";
  if (job.channel.stop_queued()) return "the coordinator stopped the job";
  if (job.channel.silence() > Millis(job.timeout_ms))
    return "the coordinator has been silent for " + std::to_string(job.channel.silence().count()) + " ms";
  return "";
}

JobEnd serve_job(const JobServing& job, const std::function<nlohmann::json()>& finish_detail,
                 const std::function<std::optional<JobEnd>(const Command&, uint64_t)>& handle,
                 const std::function<void()>& between) {
  JobChannel& channel = job.channel;
  for (;;) {
    if (job.stop) return JobEnd::abandoned;
    channel.poll(Millis(100));
    if (between) between();
    if (channel.silence() > Millis(job.timeout_ms)) {
      const std::string why = job.what + " abandoned: the coordinator has been silent for " +
                              std::to_string(channel.silence().count()) + " ms";
      log(LogLevel::kWarning, "cleaved " + job.name + ": " + why);
      if (channel.on_error) channel.on_error(why);
      return JobEnd::abandoned;
    }
    while (auto m = channel.pop_command()) {
      const uint64_t rid = m->request_id;
      if (std::holds_alternative<AssignMsg>(m->body)) {
        channel.send(error_message(ErrorCode::kUnexpectedKind, job.name + " is already running a " + job.what, rid));
        continue;
      }
      const Command& c = std::get<CommandMsg>(m->body).command;
      if (std::holds_alternative<ShutdownCmd>(c)) {
        channel.send(ack_message(rid, {{"op", "shutdown"}}));
        log(LogLevel::kInfo, "cleaved " + job.name + ": shutdown requested by the coordinator");
        return JobEnd::shutdown;
      }
      if (std::holds_alternative<FinishCmd>(c)) {
        nlohmann::json detail = finish_detail();
        detail["op"] = "finish";
        channel.send(ack_message(rid, detail));
        return JobEnd::finished;
      }
      if (auto end = handle(c, rid)) return *end;
    }
  }
}

Message error_message(ErrorCode code, const std::string& text, uint64_t request_id) {
  return message_of(ErrorMsg{code, text, request_id}, request_id);
}

Message ack_message(uint64_t request_id, const nlohmann::json& detail) {
  return message_of(AckMsg{request_id, detail.dump()}, request_id);
}

}  // namespace cleave
