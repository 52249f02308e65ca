// zap.h: the ZAP (ZeroMQ Authentication Protocol, RFC 27) handler.
//
// libzmq admits ANY CURVE client key unless a ZAP handler is bound in the
// socket's context, so every binding endpoint runs one (fail closed). The
// handler binds inproc://zeromq.zap.01 in the given context (one handler per
// context), answers on its own thread, admits CURVE clients whose public key
// is on the allow-list (User-Id = the allow-list name, readable on every
// received frame as zmq_msg_gets(msg, "User-Id"), and the key itself as the
// connection's metadata property kKeyProperty), admits NULL-mechanism clients
// only when constructed with allow_null (the --insecure mode), and denies
// everything else. Refusals are logged rate-limited (the first, then a count
// per interval: a peer retrying a wrong key cannot flood the log).
//
// The allow-list may be replaced at any time from another thread
// (set_allow_list): handshakes after the call see the new list.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "transport/keys.h"
#include "transport/log.h"
#include "transport/wakeup.h"

namespace cleave::transport {

// Metadata property of an admitted CURVE connection: its public key (Z85).
inline constexpr const char* kKeyProperty = "X-Cleave-Key";

class ZapHandler {
 public:
  // Binds the ZAP endpoint in `context` (throws zmq::error_t if one is bound
  // already) and starts the handler thread. `label` prefixes log lines.
  ZapHandler(zmq::context_t& context, AllowList allow, bool allow_null, std::string label);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Replaces the allow-list (thread-safe); returns the previous one.
  AllowList set_allow_list(AllowList allow);
  // A copy of the current allow-list (thread-safe).
  AllowList allow_list() const;
  // The current name of `public_key_z85`, or nullopt when it is not admitted (thread-safe).
  std::optional<std::string> name_of(const std::string& public_key_z85) const;

  uint64_t admitted() const { return admitted_.load(); }
  uint64_t denied() const { return denied_.load(); }

 private:
  void run();
  // Status code, text and User-Id for one request; `key` gets the client's key.
  void decide(const std::string& mechanism, const zmq::message_t* credentials, const std::string& address,
              std::string& status, std::string& text, std::string& user_id, std::string& key);

  zmq::socket_t socket_;
  mutable std::mutex allow_mutex_;
  AllowList allow_;
  bool allow_null_;
  std::string label_;
  LogThrottle refusals_;
  Wakeup stop_;  // signalled by the destructor: the thread sleeps until a request or this
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> denied_{0};
  std::thread thread_;
};

}  // namespace cleave::transport
