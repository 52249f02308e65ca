// peer_pool.h: the coordinator's view of the daemons of one run (federated
// and split learning): who registered, who is alive, and every message kind
// each one sent.
//
// receive() is the only way messages are read: it keeps the daemons'
// heartbeats going, notices disconnects and silence (a daemon silent for
// `peer_timeout_ms` while nothing waits unread is declared dead; one that
// disconnected, once what it sent before is read), counts each sender's
// message kinds for the run's audit, and swallows heartbeats.
//
// It is also the first gate of who may send what (docs/protocol.md): a
// sender is known by its authenticated key (the ZAP User-Id), never by what
// it writes. Anyone on the allow-list may register; every other message is
// accepted only from a peer of this run's roster (add()) that is still in its
// job (not released). Messages from anyone else are refused: counted by
// reason (refused_json(), the result's "refused_messages"), logged once per
// sender and reason, and never seen by the driver. Drivers refuse what the
// roster alone cannot tell (the wrong role, a step outside the window) with
// refuse().
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transport/endpoint.h"
#include "transport/message.h"

namespace cleave {

struct PoolPeer {
  std::string name;
  transport::RegisterMsg reg;
  nlohmann::json details;  // the register message's details_json
  bool dead = false;
  std::string dead_reason;
  bool released = false;  // its job ended (or it has none): no heartbeats, no health checks
};

class PeerPool {
 public:
  // `who` prefixes log lines ("cleave fed"); `interrupted` (may be empty) is
  // polled by receive() and makes it throw std::runtime_error("interrupted").
  PeerPool(transport::ServerEndpoint& server, std::string who, int peer_timeout_ms,
           std::function<bool()> interrupted);

  // A request id not used before in this session (one counter for every request).
  uint64_t next_request_id() { return ++last_request_id_; }

  // Next message within `timeout` that is not a heartbeat (see above).
  std::optional<transport::Received> receive(transport::Millis timeout);

  // Adds a registered peer (health checks and heartbeats cover it from now on).
  PoolPeer& add(const std::string& name, const transport::RegisterMsg& reg, nlohmann::json details);
  // A peer registering again after it was declared dead: alive, in no job yet, its registration now.
  PoolPeer& revive(const std::string& name, const transport::RegisterMsg& reg, nlohmann::json details);
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  PoolPeer& at(const std::string& name) { return peers_.at(index_.at(name)); }
  std::vector<PoolPeer>& peers() { return peers_; }
  // Stops heartbeats and health checks for `name` (it may exit now).
  void release(const std::string& name);
  // Logs and records why `name` is dead (first reason wins).
  void mark_dead(const std::string& name, const std::string& why);
  // Health checks and heartbeats run only while monitoring (after set-up begins).
  void set_monitoring(bool on) { monitoring_ = on; }
  // Message kinds each peer sent: {peer: {kind: count}} (rejected messages as "rejected-invalid").
  nlohmann::json message_kinds(const std::string& peer) const;
  // Counts a refused message of `peer` under `reason` (snake_case, e.g.
  // "not_in_job") and logs `text` the first time this peer is refused for it.
  void refuse(const std::string& peer, const std::string& reason, const std::string& text);
  // Counts a refusal the caller has logged itself.
  void count_refused(const std::string& reason) { ++refused_[reason]; }
  // {reason: count} of every message refused so far.
  nlohmann::json refused_json() const { return nlohmann::json(refused_); }
  // Sends `m` to every live, unreleased peer (errors ignored: a dead peer is noticed by the health checks).
  void send_all(const transport::Message& m);
  // Text appended to "peer X disconnected" log lines, e.g. " (round 3)".
  std::function<std::string()> context;
  // Called at the end of every receive() with what it returns (nullptr when
  // nothing): how the session's metrics follow the run (session_monitor.h).
  std::function<void(const transport::Received*)> observer;

 private:
  uint64_t last_request_id_ = 0;
  void check_health();
  std::optional<transport::Received> receive_one(transport::Millis timeout);
  std::optional<transport::Received> read_one(transport::Millis timeout);  // one message through the gate

  transport::ServerEndpoint& server_;
  std::string who_;
  int peer_timeout_ms_;
  std::function<bool()> interrupted_;
  std::vector<PoolPeer> peers_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::map<std::string, int64_t>> kinds_;
  std::map<std::string, int64_t> refused_;                 // reason -> count
  std::map<std::string, std::set<std::string>> refused_logged_;  // peer -> reasons already logged
  bool monitoring_ = false;
  bool inbox_drained_ = false;  // the last receive found nothing waiting
  std::vector<transport::PeerEvent> gone_;  // disconnects and revocations not yet acted on (receive_one)
  std::chrono::steady_clock::time_point last_heartbeat_ = std::chrono::steady_clock::now();
  uint64_t heartbeat_seq_ = 0;
};

}  // namespace cleave
