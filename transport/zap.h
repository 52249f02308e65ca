// zap.h: the ZAP (ZeroMQ Authentication Protocol, RFC 27) handler.
//
// libzmq admits ANY CURVE client key unless a ZAP handler is bound in the
// socket's context, so every binding endpoint runs one (fail closed). The
// handler binds inproc://zeromq.zap.01 in the given context (one handler per
// context), answers on its own thread, admits CURVE clients whose public key
// is on the allow-list (User-Id = the allow-list name, readable on every
// received frame as zmq_msg_gets(msg, "User-Id")), admits NULL-mechanism
// clients only when constructed with allow_null (the --insecure mode), and
// denies and logs everything else.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "transport/keys.h"

namespace cleave::transport {

class ZapHandler {
 public:
  // Binds the ZAP endpoint in `context` (throws zmq::error_t if one is bound
  // already) and starts the handler thread. `label` prefixes log lines.
  ZapHandler(zmq::context_t& context, AllowList allow, bool allow_null, std::string label);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  uint64_t admitted() const { return admitted_.load(); }
  uint64_t denied() const { return denied_.load(); }

 private:
  void run();

  zmq::socket_t socket_;
  AllowList allow_;
  bool allow_null_;
  std::string label_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> denied_{0};
  std::thread thread_;
};

}  // namespace cleave::transport
