// endpoint_detail.h: what the server and client endpoints share (internal to
// transport/: endpoint.cpp is the ROUTER side, client_endpoint.cpp the DEALER
// side): counters, socket options, the socket monitor thread, multipart send
// and receive, and the validation of received frames.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "transport/endpoint.h"
#include "transport/wakeup.h"

namespace cleave::transport::detail {

using Clock = std::chrono::steady_clock;

// Largest number of payload frames any kind carries, plus slack for the check.
constexpr size_t kMaxFrames = 8;

struct Counters {
  std::atomic<uint64_t> sent{0}, received{0}, rejected{0}, bytes_sent{0}, bytes_received{0};
  std::atomic<uint64_t> handshakes_failed{0}, handshakes_succeeded{0}, disconnects{0};
  mutable std::mutex mutex;
  std::string last_rejection;

  EndpointStats snapshot() const {
    EndpointStats s;
    s.messages_sent = sent;
    s.messages_received = received;
    s.messages_rejected = rejected;
    s.bytes_sent = bytes_sent;
    s.bytes_received = bytes_received;
    s.handshakes_failed = handshakes_failed;
    s.handshakes_succeeded = handshakes_succeeded;
    s.disconnects = disconnects;
    std::lock_guard lock(mutex);
    s.last_rejection = last_rejection;
    return s;
  }
  // Counts and logs one rejected message.
  void reject(const std::string& label, const std::string& peer, const std::string& why);
};

// Linger, timeouts, high-water marks, heartbeats and ZMQ_MAXMSGSIZE (before any connect or bind).
void apply_tuning(zmq::socket_t& s, const SocketTuning& t);
// Throws std::invalid_argument unless `k` is a matching pair of Z85 keys.
void check_keypair(const KeyPair& k, const char* who);

// Socket monitor on its own thread: decodes events and hands them to `on_event`.
class Monitor {
 public:
  using Handler = std::function<void(uint16_t event, uint32_t value, const std::string& address)>;
  Monitor(zmq::context_t& ctx, zmq::socket_t& watched, Handler handler);
  ~Monitor();

 private:
  void run();

  Handler handler_;
  zmq::socket_t pair_;
  Wakeup stop_;  // signalled by the destructor: the thread sleeps until an event or this
  std::thread thread_;
};

// Sends [routing_id] header payloads... Returns a failure instead of throwing.
Status send_frames(zmq::socket_t& socket, const std::string* routing_id, const Message& message,
                   Counters& counters, const std::string& label);
// Receives one multipart message (after poll said it is ready).
bool recv_all(zmq::socket_t& socket, std::vector<zmq::message_t>& frames);
// Validates [header, payload...] (from frames[first]) into a Message; frames are shared, not copied.
Result<Message> decode_frames(std::vector<zmq::message_t>& frames, size_t first, const DecodeLimits& limits);
uint64_t frames_bytes(const std::vector<zmq::message_t>& frames, size_t first);
// Sleeps until `socket` has input, one of `woken` (null entries ignored) is
// signalled, or `timeout` passes (negative: no timeout), and says which.
struct Ready {
  bool socket = false;  // the socket has input
  bool woken = false;   // a Wakeup was signalled
};
Ready wait_ready(zmq::socket_t& socket, Millis timeout, std::initializer_list<const Wakeup*> woken);
// wait_ready's `socket`: true when the socket has input.
bool poll_in(zmq::socket_t& socket, Millis timeout, std::initializer_list<const Wakeup*> woken = {});
// Sleeps, with no timeout, until `socket` has input (true) or `woken` is
// signalled (false): how a helper thread waits for work and is told to stop.
bool wait_in(zmq::socket_t& socket, const Wakeup& woken);

}  // namespace cleave::transport::detail
