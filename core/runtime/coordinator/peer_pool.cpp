// peer_pool.cpp: see peer_pool.h.
#include "core/runtime/coordinator/peer_pool.h"

#include <stdexcept>

#include "transport/log.h"

namespace cleave {

using namespace transport;
using Clock = std::chrono::steady_clock;

PeerPool::PeerPool(ServerEndpoint& server, std::string who, int peer_timeout_ms, std::function<bool()> interrupted)
    : server_(server), who_(std::move(who)), peer_timeout_ms_(peer_timeout_ms), interrupted_(std::move(interrupted)) {}

PoolPeer& PeerPool::add(const std::string& name, const RegisterMsg& reg, nlohmann::json details) {
  if (auto it = index_.find(name); it != index_.end()) return peers_[it->second];
  index_[name] = peers_.size();
  peers_.push_back({name, reg, std::move(details), false, ""});
  return peers_.back();
}

PoolPeer& PeerPool::revive(const std::string& name, const RegisterMsg& reg, nlohmann::json details) {
  PoolPeer& p = add(name, reg, details);
  p.reg = reg;
  p.details = std::move(details);
  p.dead = false;
  p.dead_reason.clear();
  p.released = false;
  return p;
}

void PeerPool::release(const std::string& name) {
  if (auto it = index_.find(name); it != index_.end()) peers_[it->second].released = true;
}

void PeerPool::mark_dead(const std::string& name, const std::string& why) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  PoolPeer& p = peers_[it->second];
  if (p.dead || p.released) return;
  p.dead = true;
  p.dead_reason = why;
  log(LogLevel::kWarning, who_ + ": " + name + " " + why + (context ? context() : std::string()));
}

void PeerPool::check_health() {
  if (interrupted_ && interrupted_()) throw std::runtime_error("interrupted");
  if (!monitoring_) return;
  for (const PeerEvent& e : server_.take_peer_events())
    if (e.kind == PeerEvent::Kind::kDisconnected || e.kind == PeerEvent::Kind::kRevoked) gone_.push_back(e);
  if (Clock::now() - last_heartbeat_ > Millis(300)) {
    last_heartbeat_ = Clock::now();
    HeartbeatMsg hb;
    hb.sequence = ++heartbeat_seq_;
    Message m;
    m.body = hb;
    send_all(m);
  }
  // Silence counts only once everything that arrived has been read: a
  // coordinator that was descheduled must not blame peers whose messages wait
  // in its own queue.
  if (!inbox_drained_) return;
  for (const auto& p : peers_) {
    if (p.dead || p.released) continue;
    auto since = server_.since_last_seen(p.name);
    if (since && *since > Millis(peer_timeout_ms_))
      mark_dead(p.name, "stopped responding (silent for " + std::to_string(since->count() / 1000.0).substr(0, 4) + " s)");
  }
}

std::optional<Received> PeerPool::receive(Millis timeout) {
  std::optional<Received> got = receive_one(timeout);
  if (observer) observer(got ? &*got : nullptr);
  return got;
}

std::optional<Received> PeerPool::receive_one(Millis timeout) {
  check_health();
  if (!gone_.empty()) {
    // What a peer sent before it went (a daemon on its last job acks the
    // finish request and exits) is readable still: it is handed out first,
    // and the peer is dead once nothing is waiting.
    if (auto got = read_one(Millis(0))) return got;
    if (!inbox_drained_) return std::nullopt;  // one was read and swallowed: look again
    for (const PeerEvent& e : gone_)
      mark_dead(e.peer, e.kind == PeerEvent::Kind::kRevoked ? "key revoked" : "disconnected");
    gone_.clear();
  }
  return read_one(timeout);
}

std::optional<Received> PeerPool::read_one(Millis timeout) {
  auto r = server_.receive(timeout);
  inbox_drained_ = !r && r.is(FailureKind::kTimeout);
  if (!r) {
    // The endpoint logged it; the audit counts it.
    if (r.is(FailureKind::kRejected)) ++kinds_[r.failure().peer]["rejected-invalid"];
    return std::nullopt;
  }
  const Received& got = r.value();
  ++kinds_[got.peer][body_kind_name(got.message.body)];
  if (std::holds_alternative<HeartbeatMsg>(got.message.body)) return std::nullopt;
  if (std::holds_alternative<RegisterMsg>(got.message.body)) return std::move(r.value());
  auto it = index_.find(got.peer);
  if (it == index_.end()) {
    refuse(got.peer, "not_in_job",
           std::string("refused a ") + body_kind_name(got.message.body) + " message from " + got.peer +
               ": it is not part of this run (further ones are counted in \"refused_messages\", not logged)");
    return std::nullopt;
  }
  if (peers_[it->second].released) return std::nullopt;  // its job ended: late replies change nothing
  return std::move(r.value());
}

void PeerPool::refuse(const std::string& peer, const std::string& reason, const std::string& text) {
  ++refused_[reason];
  if (refused_logged_[peer].insert(reason).second) log(LogLevel::kWarning, who_ + ": " + text);
}

nlohmann::json PeerPool::message_kinds(const std::string& peer) const {
  auto it = kinds_.find(peer);
  return it == kinds_.end() ? nlohmann::json::object() : nlohmann::json(it->second);
}

void PeerPool::send_all(const Message& m) {
  for (const auto& p : peers_)
    if (!p.dead && !p.released) (void)server_.send(p.name, m);
}

}  // namespace cleave
