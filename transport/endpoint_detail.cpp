// endpoint_detail.cpp: see endpoint_detail.h.
#include "transport/endpoint_detail.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <zmq_addon.hpp>

#include "transport/log.h"

namespace cleave::transport {
namespace detail {

void Counters::reject(const std::string& label, const std::string& peer, const std::string& why) {
  ++rejected;
  {
    std::lock_guard lock(mutex);
    last_rejection = why;
  }
  log(LogLevel::kWarning, label + ": rejected message" + (peer.empty() ? "" : " from " + peer) + ": " + why);
}

void apply_tuning(zmq::socket_t& s, const SocketTuning& t) {
  s.set(zmq::sockopt::linger, t.linger_ms);
  s.set(zmq::sockopt::sndtimeo, t.send_timeout_ms);
  s.set(zmq::sockopt::sndhwm, t.high_water_mark);
  s.set(zmq::sockopt::rcvhwm, t.high_water_mark);
  s.set(zmq::sockopt::heartbeat_ivl, t.heartbeat_interval_ms);
  s.set(zmq::sockopt::heartbeat_timeout, t.heartbeat_timeout_ms);
  s.set(zmq::sockopt::heartbeat_ttl, t.heartbeat_timeout_ms);
  s.set(zmq::sockopt::handshake_ivl, t.handshake_timeout_ms);
  s.set(zmq::sockopt::maxmsgsize, transport_frame_cap(t.limits));
  s.set(zmq::sockopt::reconnect_ivl, t.reconnect_ms);
  s.set(zmq::sockopt::reconnect_ivl_max, t.reconnect_max_ms);
}

void check_keypair(const KeyPair& k, const char* who) {
  if (!is_z85_key(k.public_key) || !is_z85_key(k.secret_key))
    throw std::invalid_argument(std::string(who) + ": key pair is not two 40-character Z85 keys");
  if (public_key_of(k.secret_key) != k.public_key)
    throw std::invalid_argument(std::string(who) + ": public key does not belong to the secret key");
}

Monitor::Monitor(zmq::context_t& ctx, zmq::socket_t& watched, Handler handler) : handler_(std::move(handler)) {
  static std::atomic<uint64_t> counter{0};
  const std::string addr = "inproc://cleave-monitor-" + std::to_string(++counter);
  if (zmq_socket_monitor(watched.handle(), addr.c_str(), ZMQ_EVENT_ALL) != 0) throw zmq::error_t();
  pair_ = zmq::socket_t(ctx, zmq::socket_type::pair);
  pair_.set(zmq::sockopt::linger, 0);
  pair_.connect(addr);
  thread_ = std::thread([this] { run(); });
}

Monitor::~Monitor() {
  stop_.signal();
  if (thread_.joinable()) thread_.join();
  pair_.close();
}

void Monitor::run() {
  for (;;) {
    try {
      if (!wait_in(pair_, stop_)) return;  // the destructor's
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(pair_, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
      if (frames.size() < 2 || frames[0].size() < 6) continue;
      uint16_t event;
      uint32_t value;
      std::memcpy(&event, frames[0].data(), 2);
      std::memcpy(&value, static_cast<const char*>(frames[0].data()) + 2, 4);
      handler_(event, value, frames[1].to_string());
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
    }
  }
}

namespace {

void free_owner(void* /*data*/, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }

zmq::message_t payload_frame(const Payload& p) {
  if (p.size() == 0) return zmq::message_t();
  if (!p.owner()) return zmq::message_t(p.data(), p.size());  // unowned: copy
  auto* hint = new std::shared_ptr<const void>(p.owner());
  // libzmq never writes through the pointer; it calls free_owner when done.
  return zmq::message_t(const_cast<std::byte*>(p.data()), p.size(), &free_owner, hint);
}

}  // namespace

Status send_frames(zmq::socket_t& socket, const std::string* routing_id, const Message& message,
                   Counters& counters, const std::string& label) {
  const std::vector<std::byte> header = encode_header(message);  // throws on a sender bug
  const size_t frames = 1 + message.payloads.size();
  try {
    if (routing_id) {
      if (!socket.send(zmq::buffer(*routing_id), zmq::send_flags::sndmore))
        return Failure{FailureKind::kTimeout, label + ": send timed out (peer queue full)", {}};
    }
    zmq::message_t hdr(header.data(), header.size());
    if (!socket.send(hdr, frames > 1 ? zmq::send_flags::sndmore : zmq::send_flags::none))
      return Failure{FailureKind::kTimeout, label + ": send timed out (peer queue full or not connected)", {}};
    uint64_t bytes = header.size();
    for (size_t i = 0; i < message.payloads.size(); ++i) {
      zmq::message_t frame = payload_frame(message.payloads[i]);
      bytes += message.payloads[i].size();
      const bool last = i + 1 == message.payloads.size();
      if (!socket.send(frame, last ? zmq::send_flags::none : zmq::send_flags::sndmore))
        return Failure{FailureKind::kTimeout, label + ": send timed out mid-message", {}};
    }
    ++counters.sent;
    counters.bytes_sent += bytes;
    return Done{};
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH)
      return Failure{FailureKind::kUnreachable, label + ": peer is not connected", {}};
    if (e.num() == ETERM) return Failure{FailureKind::kClosed, label + ": context terminated", {}};
    return Failure{FailureKind::kUnreachable, label + ": send failed: " + e.what(), {}};
  }
}

bool recv_all(zmq::socket_t& socket, std::vector<zmq::message_t>& frames) {
  frames.clear();
  auto n = zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait);
  return n.has_value() && *n > 0;
}

Result<Message> decode_frames(std::vector<zmq::message_t>& frames, size_t first,
                              const DecodeLimits& limits) {
  const size_t count = frames.size() - first;
  if (count == 0) return Failure{FailureKind::kRejected, "empty message (no header frame)", {}};
  if (count > kMaxFrames)
    return Failure{FailureKind::kRejected,
                   "message has " + std::to_string(count) + " frames (at most " +
                       std::to_string(kMaxFrames) + " allowed)", {}};
  std::vector<Payload> payloads;
  for (size_t i = first + 1; i < frames.size(); ++i) {
    auto owned = std::make_shared<zmq::message_t>(std::move(frames[i]));
    const void* data = owned->data();
    const size_t size = owned->size();
    payloads.push_back(Payload::borrow(data, size, std::move(owned)));
  }
  const auto& h = frames[first];
  return decode_message(std::span<const std::byte>(static_cast<const std::byte*>(h.data()), h.size()),
                        payloads, limits);
}

uint64_t frames_bytes(const std::vector<zmq::message_t>& frames, size_t first) {
  uint64_t n = 0;
  for (size_t i = first; i < frames.size(); ++i) n += frames[i].size();
  return n;
}

Ready wait_ready(zmq::socket_t& socket, Millis timeout, std::initializer_list<const Wakeup*> woken) {
  zmq::pollitem_t items[3] = {{socket.handle(), 0, ZMQ_POLLIN, 0}};
  int n = 1;
  for (const Wakeup* w : woken) {
    if (!w) continue;
    if (n == 3) throw std::logic_error("poll_in: at most two Wakeups");
    items[n++] = {nullptr, w->fd(), ZMQ_POLLIN, 0};
  }
  zmq::poll(items, static_cast<size_t>(n), timeout);
  bool any = false;
  for (int i = 1; i < n; ++i) any = any || (items[i].revents & ZMQ_POLLIN) != 0;
  return {(items[0].revents & ZMQ_POLLIN) != 0, any};
}

bool poll_in(zmq::socket_t& socket, Millis timeout, std::initializer_list<const Wakeup*> woken) {
  return wait_ready(socket, timeout, woken).socket;
}

bool wait_in(zmq::socket_t& socket, const Wakeup& woken) {
  return !wait_ready(socket, Millis(-1), {&woken}).woken;
}

}  // namespace detail

int64_t transport_frame_cap(const DecodeLimits& limits) {
  const uint64_t biggest = std::max(limits.max_header_bytes, limits.max_payload_bytes);
  const uint64_t cap = biggest > (uint64_t{1} << 61) ? (uint64_t{1} << 62) : biggest * 2;
  return static_cast<int64_t>(cap);
}

DecodeLimits payload_limits(size_t largest_payload_bytes) {
  DecodeLimits limits;
  const size_t room = largest_payload_bytes / 16 + (size_t{64} << 10);
  limits.max_payload_bytes = largest_payload_bytes > (size_t{1} << 60) ? (size_t{1} << 60) : largest_payload_bytes + room;
  return limits;
}

}  // namespace cleave::transport
