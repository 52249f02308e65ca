// endpoint.cpp: ROUTER/DEALER endpoints, socket monitor, zero-copy multipart send.
#include "transport/endpoint.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "transport/log.h"
#include "transport/zap.h"

namespace cleave::transport {
namespace {

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
  void reject(const std::string& label, const std::string& peer, const std::string& why) {
    ++rejected;
    {
      std::lock_guard lock(mutex);
      last_rejection = why;
    }
    log(LogLevel::kWarning, label + ": rejected message" + (peer.empty() ? "" : " from " + peer) +
                                ": " + why);
  }
};

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
  s.set(zmq::sockopt::reconnect_ivl, 100);
  s.set(zmq::sockopt::reconnect_ivl_max, 2000);
}

void check_keypair(const KeyPair& k, const char* who) {
  if (!is_z85_key(k.public_key) || !is_z85_key(k.secret_key))
    throw std::invalid_argument(std::string(who) + ": key pair is not two 40-character Z85 keys");
  if (public_key_of(k.secret_key) != k.public_key)
    throw std::invalid_argument(std::string(who) + ": public key does not belong to the secret key");
}

// Socket monitor on its own thread: decodes events and hands them to `on_event`.
class Monitor {
 public:
  using Handler = std::function<void(uint16_t event, uint32_t value, const std::string& address)>;
  Monitor(zmq::context_t& ctx, zmq::socket_t& watched, Handler handler) : handler_(std::move(handler)) {
    static std::atomic<uint64_t> counter{0};
    const std::string addr = "inproc://cleave-monitor-" + std::to_string(++counter);
    if (zmq_socket_monitor(watched.handle(), addr.c_str(), ZMQ_EVENT_ALL) != 0)
      throw zmq::error_t();
    pair_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    pair_.set(zmq::sockopt::linger, 0);
    pair_.connect(addr);
    thread_ = std::thread([this] { run(); });
  }
  ~Monitor() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    pair_.close();
  }

 private:
  void run() {
    while (!stop_.load()) {
      try {
        zmq::pollitem_t item{pair_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) == 0) continue;
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

  Handler handler_;
  zmq::socket_t pair_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void free_owner(void* /*data*/, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }

zmq::message_t payload_frame(const Payload& p) {
  if (p.size() == 0) return zmq::message_t();
  if (!p.owner()) return zmq::message_t(p.data(), p.size());  // unowned: copy
  auto* hint = new std::shared_ptr<const void>(p.owner());
  // libzmq never writes through the pointer; it calls free_owner when done.
  return zmq::message_t(const_cast<std::byte*>(p.data()), p.size(), &free_owner, hint);
}

// Sends [routing_id] header payloads... Returns a failure instead of throwing.
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

// Receives one multipart message (after poll said it is ready).
bool recv_all(zmq::socket_t& socket, std::vector<zmq::message_t>& frames) {
  frames.clear();
  auto n = zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait);
  return n.has_value() && *n > 0;
}

// Validates [header, payload...] into a Message; frames are shared, not copied.
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

// A peer whose envelope speaks another protocol version is told so, in an
// error envelope of its own version (message.h: encode_version_error), so its
// log says why it is refused instead of retrying in silence.
void tell_other_version(zmq::socket_t& socket, const std::string& routing_id, const zmq::message_t& header,
                        const std::string& peer) {
  const auto version = envelope_version(std::span<const std::byte>(static_cast<const std::byte*>(header.data()),
                                                                   header.size()));
  if (!version || *version == kProtocolVersion) return;
  const auto bytes = encode_version_error(
      *version, "this peer speaks cleave protocol version " + std::to_string(kProtocolVersion) + " but " + peer +
                    " speaks version " + std::to_string(*version) + ": run the same cleave release on both sides");
  try {
    if (socket.send(zmq::buffer(routing_id), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      (void)socket.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // Best effort: the refusal is logged on this side either way.
  }
}

uint64_t frames_bytes(const std::vector<zmq::message_t>& frames, size_t first) {
  uint64_t n = 0;
  for (size_t i = first; i < frames.size(); ++i) n += frames[i].size();
  return n;
}

std::string hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

bool poll_in(zmq::socket_t& socket, Millis timeout) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  return zmq::poll(&item, 1, timeout) > 0;
}

}  // namespace

int64_t transport_frame_cap(const DecodeLimits& limits) {
  const uint64_t biggest = std::max(limits.max_header_bytes, limits.max_payload_bytes);
  const uint64_t cap = biggest > (uint64_t{1} << 61) ? (uint64_t{1} << 62) : biggest * 2;
  return static_cast<int64_t>(cap);
}

// ---------------------------------------------------------------------------
// ServerEndpoint

struct ServerEndpoint::Impl {
  ServerOptions options;
  zmq::context_t context{1};
  std::unique_ptr<ZapHandler> zap;
  zmq::socket_t socket;
  std::unique_ptr<Monitor> monitor;
  std::string endpoint;
  Counters counters;

  struct PeerState {
    std::string routing_id;
    int fd = -1;
    Clock::time_point last_seen;
    bool connected = false;
  };
  std::map<std::string, PeerState> peers;  // by name
  std::vector<PeerEvent> events;

  std::mutex closed_mutex;  // written by the monitor thread
  std::vector<int> closed_fds;

  void drain_closed_fds() {
    std::vector<int> fds;
    {
      std::lock_guard lock(closed_mutex);
      fds.swap(closed_fds);
    }
    for (int fd : fds)
      for (auto& [name, p] : peers)
        if (p.connected && p.fd == fd) {
          p.connected = false;
          events.push_back({PeerEvent::Kind::kDisconnected, name});
          log(LogLevel::kInfo, options.label + ": peer " + name + " disconnected");
        }
  }
};

ServerEndpoint::ServerEndpoint(ServerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  const ServerOptions& o = m.options;
  if (!o.insecure) {
    check_keypair(o.keys, "ServerEndpoint");
    if (o.allow.empty())
      throw std::invalid_argument("ServerEndpoint: empty allow-list (no client could connect); "
                                  "add the clients' .pub files");
  } else {
    log(LogLevel::kWarning, o.label + ": --insecure: plain TCP without CURVE encryption or "
                                      "authentication; anyone who can reach " + o.bind +
                                      " can read and inject messages");
  }
  m.zap = std::make_unique<ZapHandler>(m.context, o.allow, o.insecure, o.label);
  m.socket = zmq::socket_t(m.context, zmq::socket_type::router);
  apply_tuning(m.socket, o.tuning);
  m.socket.set(zmq::sockopt::router_mandatory, 1);
  m.socket.set(zmq::sockopt::zap_domain, "cleave");
  if (!o.insecure) {
    m.socket.set(zmq::sockopt::curve_server, 1);
    m.socket.set(zmq::sockopt::curve_secretkey, o.keys.secret_key);
  }
  m.monitor = std::make_unique<Monitor>(m.context, m.socket,
      [&m](uint16_t event, uint32_t value, const std::string& address) {
        switch (event) {
          case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
          case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
          case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            ++m.counters.handshakes_failed;
            log(LogLevel::kWarning, m.options.label + ": refused a connection on " + address +
                                        (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                                             ? " (authentication denied)"
                                             : " (handshake failed: not a CURVE peer or junk)"));
            break;
          case ZMQ_EVENT_DISCONNECTED: {
            ++m.counters.disconnects;
            std::lock_guard lock(m.closed_mutex);
            m.closed_fds.push_back(static_cast<int>(value));
            break;
          }
          default:
            break;
        }
      });
  m.socket.bind(o.bind);
  m.endpoint = m.socket.get(zmq::sockopt::last_endpoint);
}

ServerEndpoint::~ServerEndpoint() {
  if (!impl_) return;
  impl_->monitor.reset();
  impl_->socket.close();
  impl_->zap.reset();
  impl_->context.close();
}

const std::string& ServerEndpoint::endpoint() const { return impl_->endpoint; }
const std::string& ServerEndpoint::public_key() const { return impl_->options.keys.public_key; }

Result<Received> ServerEndpoint::receive(Millis timeout) {
  Impl& m = *impl_;
  m.drain_closed_fds();
  try {
    if (!poll_in(m.socket, timeout))
      return Failure{FailureKind::kTimeout, m.options.label + ": no message within " +
                                                std::to_string(timeout.count()) + " ms", {}};
    std::vector<zmq::message_t> frames;
    if (!recv_all(m.socket, frames))
      return Failure{FailureKind::kTimeout, m.options.label + ": no message", {}};
    m.counters.bytes_received += frames_bytes(frames, 1);
    std::string name;
    if (frames.size() >= 2) {
      if (m.options.insecure) {
        name = "insecure-" + hex(frames[0].to_string());
      } else {
        const char* uid = zmq_msg_gets(frames[1].handle(), "User-Id");
        name = uid ? uid : "";
      }
    }
    if (name.empty()) {  // cannot happen with our ZAP handler; refuse rather than guess
      m.counters.reject(m.options.label, "?", "message without an authenticated User-Id");
      return Failure{FailureKind::kRejected, "message without an authenticated User-Id", {}};
    }
    Impl::PeerState& peer = m.peers[name];
    const std::string routing_id = frames[0].to_string();
    const int fd = frames.size() >= 2 ? frames[1].get(ZMQ_SRCFD) : -1;
    auto decoded = decode_frames(frames, 1, m.options.tuning.limits);
    // Any authenticated traffic (valid or not) proves the connection is alive.
    peer.routing_id = routing_id;
    peer.fd = fd;
    peer.last_seen = Clock::now();
    if (!decoded) {
      m.counters.reject(m.options.label, name, decoded.failure().message);
      tell_other_version(m.socket, routing_id, frames[1], name);
      return Failure{FailureKind::kRejected, decoded.failure().message, name};
    }
    if (!peer.connected) {
      peer.connected = true;
      m.events.push_back({PeerEvent::Kind::kConnected, name});
    }
    ++m.counters.received;
    return Received{name, std::move(decoded).value()};
  } catch (const zmq::error_t& e) {
    return Failure{FailureKind::kClosed, m.options.label + ": receive failed: " + e.what(), {}};
  }
}

Status ServerEndpoint::send(const std::string& peer, const Message& message) {
  Impl& m = *impl_;
  m.drain_closed_fds();
  auto it = m.peers.find(peer);
  if (it == m.peers.end())
    return Failure{FailureKind::kUnreachable, m.options.label + ": peer '" + peer +
                                                  "' has not connected", peer};
  auto status = send_frames(m.socket, &it->second.routing_id, message, m.counters, m.options.label);
  if (!status && status.failure().kind == FailureKind::kUnreachable && it->second.connected) {
    it->second.connected = false;
    m.events.push_back({PeerEvent::Kind::kDisconnected, peer});
  }
  if (!status) return Failure{status.failure().kind, status.failure().message, peer};
  return status;
}

std::vector<PeerEvent> ServerEndpoint::take_peer_events() {
  impl_->drain_closed_fds();
  std::vector<PeerEvent> out;
  out.swap(impl_->events);
  return out;
}

std::vector<std::string> ServerEndpoint::connected_peers() {
  impl_->drain_closed_fds();
  std::vector<std::string> out;
  for (const auto& [name, p] : impl_->peers)
    if (p.connected) out.push_back(name);
  return out;
}

std::optional<Millis> ServerEndpoint::since_last_seen(const std::string& peer) const {
  auto it = impl_->peers.find(peer);
  if (it == impl_->peers.end()) return std::nullopt;
  return std::chrono::duration_cast<Millis>(Clock::now() - it->second.last_seen);
}

EndpointStats ServerEndpoint::stats() const {
  EndpointStats s = impl_->counters.snapshot();
  s.zap_admitted = impl_->zap->admitted();
  s.zap_denied = impl_->zap->denied();
  return s;
}

// ---------------------------------------------------------------------------
// ClientEndpoint

struct ClientEndpoint::Impl {
  ClientOptions options;
  zmq::context_t context{1};
  zmq::socket_t socket;
  std::unique_ptr<Monitor> monitor;
  Counters counters;
  mutable std::mutex state_mutex;
  mutable std::condition_variable state_cv;
  bool connected = false;
};

ClientEndpoint::ClientEndpoint(ClientOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  const ClientOptions& o = m.options;
  if (!o.insecure) {
    check_keypair(o.keys, "ClientEndpoint");
    if (!is_z85_key(o.server_public_key))
      throw std::invalid_argument("ClientEndpoint: server public key is not a 40-character Z85 key");
  } else {
    log(LogLevel::kWarning, o.label + ": --insecure: connecting to " + o.connect +
                                " over plain TCP without CURVE encryption or authentication");
  }
  m.socket = zmq::socket_t(m.context, zmq::socket_type::dealer);
  apply_tuning(m.socket, o.tuning);
  if (!o.insecure) {
    m.socket.set(zmq::sockopt::curve_serverkey, o.server_public_key);
    m.socket.set(zmq::sockopt::curve_publickey, o.keys.public_key);
    m.socket.set(zmq::sockopt::curve_secretkey, o.keys.secret_key);
  }
  m.monitor = std::make_unique<Monitor>(m.context, m.socket,
      [&m](uint16_t event, uint32_t, const std::string& address) {
        bool changed = false;
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
          ++m.counters.handshakes_succeeded;
          std::lock_guard lock(m.state_mutex);
          changed = !m.connected;
          m.connected = true;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
          ++m.counters.disconnects;
          std::lock_guard lock(m.state_mutex);
          changed = m.connected;
          m.connected = false;
          log(LogLevel::kInfo, m.options.label + ": disconnected from " + address);
        } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
                   event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                   event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
          ++m.counters.handshakes_failed;
          log(LogLevel::kWarning, m.options.label + ": handshake with " + address +
                                      " failed (server refused our key or has another key)");
        }
        if (changed) m.state_cv.notify_all();
      });
  m.socket.connect(o.connect);
}

ClientEndpoint::~ClientEndpoint() {
  if (!impl_) return;
  impl_->monitor.reset();
  impl_->socket.close();
  impl_->context.close();
}

Status ClientEndpoint::send(const Message& message) {
  return send_frames(impl_->socket, nullptr, message, impl_->counters, impl_->options.label);
}

Result<Message> ClientEndpoint::receive(Millis timeout) {
  Impl& m = *impl_;
  try {
    if (!poll_in(m.socket, timeout))
      return Failure{FailureKind::kTimeout, m.options.label + ": no message within " +
                                                std::to_string(timeout.count()) + " ms", {}};
    std::vector<zmq::message_t> frames;
    if (!recv_all(m.socket, frames)) return Failure{FailureKind::kTimeout, m.options.label + ": no message", {}};
    m.counters.bytes_received += frames_bytes(frames, 0);
    auto decoded = decode_frames(frames, 0, m.options.tuning.limits);
    if (!decoded) {
      m.counters.reject(m.options.label, "server", decoded.failure().message);
      return decoded;
    }
    ++m.counters.received;
    return decoded;
  } catch (const zmq::error_t& e) {
    return Failure{FailureKind::kClosed, m.options.label + ": receive failed: " + e.what(), {}};
  }
}

bool ClientEndpoint::connected() const {
  std::lock_guard lock(impl_->state_mutex);
  return impl_->connected;
}

bool ClientEndpoint::wait_connected(Millis timeout) const {
  std::unique_lock lock(impl_->state_mutex);
  return impl_->state_cv.wait_for(lock, timeout, [&] { return impl_->connected; });
}

EndpointStats ClientEndpoint::stats() const { return impl_->counters.snapshot(); }

}  // namespace cleave::transport
