// endpoint.cpp: the ROUTER side (ServerEndpoint): ZAP, monitor, peers by
// authenticated name, key revocation. Shared parts: endpoint_detail.h.
#include "transport/endpoint.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>

#include "transport/allow_watch.h"
#include "transport/endpoint_detail.h"
#include "transport/log.h"
#include "transport/zap.h"

namespace cleave::transport {
namespace {

using namespace detail;

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

std::string hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

// The socket `fd` names now (its inode), or 0 when it names none: an fd
// number is reused once libzmq closes it, an inode is not.
uint64_t inode_of(int fd) {
  struct stat st {};
  return fd >= 0 && ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? static_cast<uint64_t>(st.st_ino) : 0;
}

// The connections that sent a message, by socket fd (ZMQ_SRCFD): whose key
// authenticated each, so that a revoked key's connections can be shut down.
// An fd number is reused once libzmq closes it, so each entry also keeps the
// socket's inode: shutdown() is called only while the fd still names that
// socket, and the monitor's accept / disconnect events drop stale entries.
// Thread-safe (the receive path, the monitor and the allow-list watcher use it).
class Connections {
 public:
  void note(int fd, const std::string& name, const std::string& key) {
    if (fd < 0) return;
    std::lock_guard lock(mutex_);
    auto it = entries_.find(fd);
    if (it != entries_.end() && it->second.name == name && it->second.key == key) return;
    entries_[fd] = Entry{name, key, inode_of(fd)};
  }
  void forget(int fd) {
    std::lock_guard lock(mutex_);
    entries_.erase(fd);
  }
  // Shuts down every connection whose (name, key) `admitted` refuses; returns "NAME (fd N)" of each.
  std::vector<std::string> close_unless(const std::function<bool(const std::string&, const std::string&)>& admitted) {
    std::vector<std::string> closed;
    std::lock_guard lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (admitted(it->second.name, it->second.key)) {
        ++it;
        continue;
      }
      if (inode_of(it->first) == it->second.inode) {
        ::shutdown(it->first, SHUT_RDWR);  // libzmq sees the connection end and closes it
        closed.push_back(it->second.name + " (fd " + std::to_string(it->first) + ")");
      }
      it = entries_.erase(it);
    }
    return closed;
  }

 private:
  struct Entry {
    std::string name, key;
    uint64_t inode = 0;
  };
  std::mutex mutex_;
  std::map<int, Entry> entries_;
};

}  // namespace

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
  std::atomic<uint64_t> revoked_connections{0};
  LogThrottle refused_log;
  Connections connections;

  struct PeerState {
    std::string routing_id;
    int fd = -1;
    uint64_t inode = 0;  // of the socket `fd` named when the peer's last message arrived
    Clock::time_point last_seen;
    bool connected = false;
    PeerTraffic traffic;
  };
  std::map<std::string, PeerState> peers;  // by name
  std::vector<PeerEvent> events;

  std::mutex closed_mutex;  // written by the monitor and watcher threads
  std::vector<int> closed_fds;
  std::vector<std::string> revoked_names;

  // The allow_path watcher (allow_watch.h) and how it is stopped.
  std::thread watcher;
  std::mutex watcher_mutex;
  std::condition_variable watcher_cv;
  bool stopping = false;

  // Turns what the background threads saw into peer state and events (main thread).
  void drain_closed_fds() {
    std::vector<int> fds;
    std::vector<std::string> revoked;
    {
      std::lock_guard lock(closed_mutex);
      fds.swap(closed_fds);
      revoked.swap(revoked_names);
    }
    for (const auto& name : revoked)
      if (auto it = peers.find(name); it != peers.end()) {
        it->second.connected = false;
        events.push_back({PeerEvent::Kind::kRevoked, name});
      }
    std::sort(fds.begin(), fds.end());
    fds.erase(std::unique(fds.begin(), fds.end()), fds.end());
    std::vector<int> later;
    for (int fd : fds)
      for (auto& [name, p] : peers) {
        if (!p.connected || p.fd != fd) continue;
        if (p.inode != 0 && inode_of(fd) == p.inode) {
          later.push_back(fd);  // see below
          continue;
        }
        p.connected = false;
        events.push_back({PeerEvent::Kind::kDisconnected, name});
        log(LogLevel::kInfo, options.label + ": peer " + name + " disconnected");
      }
    // The fd still names the socket the peer's last message came through: the
    // event is of an earlier connection that had the same fd number (a peer
    // that reconnects, or a new one, can be accepted and send before this
    // thread drains the old one's event), or libzmq reported the close of
    // this connection an instant before making it. Either way the peer is not
    // gone yet; the event is looked at again on the next drain.
    if (!later.empty()) {
      std::lock_guard lock(closed_mutex);
      closed_fds.insert(closed_fds.end(), later.begin(), later.end());
    }
  }

  void on_monitor_event(uint16_t event, uint32_t value, const std::string& address) {
    switch (event) {
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        ++counters.handshakes_failed;
        refused_log.log(LogLevel::kWarning, options.label + ": refused a connection on " + address +
                                                (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                                                     ? " (authentication denied)"
                                                     : " (handshake failed: not a CURVE peer, a client that "
                                                       "pinned another server key, or junk)"));
        break;
      case ZMQ_EVENT_ACCEPTED:  // a new connection: its fd number no longer names an old one
        connections.forget(static_cast<int>(value));
        break;
      case ZMQ_EVENT_DISCONNECTED: {
        ++counters.disconnects;
        connections.forget(static_cast<int>(value));
        std::lock_guard lock(closed_mutex);
        closed_fds.push_back(static_cast<int>(value));
        break;
      }
      default:
        break;
    }
  }

  std::vector<std::string> replace_allow_list(AllowList next) {
    const AllowList previous = zap->set_allow_list(next);
    std::vector<std::string> revoked;
    for (const auto& name : previous.names())
      if (next.key_of(name) != previous.key_of(name)) revoked.push_back(name);
    const auto closed = connections.close_unless([&next](const std::string& name, const std::string& key) {
      return next.name_of(key) == name;
    });
    revoked_connections += closed.size();
    for (const auto& name : revoked)
      log(LogLevel::kWarning, options.label + ": key of " + name +
                                  " revoked (no longer on the allow-list): its new connections are refused");
    for (const auto& c : closed) log(LogLevel::kWarning, options.label + ": closed the connection of revoked " + c);
    std::lock_guard lock(closed_mutex);
    revoked_names.insert(revoked_names.end(), revoked.begin(), revoked.end());
    return revoked;
  }

  void watch_allow_list() {
    AllowListWatcher watcher_state(options.allow_path);
    const auto poll_every = Millis(std::max(options.allow_poll_ms, 10));
    auto last_poll = Clock::now();
    std::unique_lock lock(watcher_mutex);
    while (!stopping) {
      watcher_cv.wait_for(lock, std::min(poll_every, Millis(100)));
      if (stopping) break;
      lock.unlock();
      // A reload request is checked often, the path itself at the poll interval.
      if (Clock::now() - last_poll >= poll_every || watcher_state.reload_requested()) {
        last_poll = Clock::now();
        if (auto next = watcher_state.poll(options.label)) replace_allow_list(std::move(*next));
      }
      lock.lock();
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
      [&m](uint16_t event, uint32_t value, const std::string& address) { m.on_monitor_event(event, value, address); });
  m.socket.bind(o.bind);
  m.endpoint = m.socket.get(zmq::sockopt::last_endpoint);
  if (!o.insecure && !o.allow_path.empty()) m.watcher = std::thread([&m] { m.watch_allow_list(); });
}

ServerEndpoint::~ServerEndpoint() {
  if (!impl_) return;
  {
    std::lock_guard lock(impl_->watcher_mutex);
    impl_->stopping = true;
  }
  impl_->watcher_cv.notify_all();
  if (impl_->watcher.joinable()) impl_->watcher.join();
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
    const uint64_t bytes = frames_bytes(frames, 1);
    m.counters.bytes_received += bytes;
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
    const std::string routing_id = frames[0].to_string();
    const int fd = frames[1].get(ZMQ_SRCFD);
    if (!m.options.insecure) {
      const char* key = zmq_msg_gets(frames[1].handle(), kKeyProperty);
      const std::string key_text = key ? key : "";
      if (m.zap->name_of(key_text) != name) {  // revoked since this connection authenticated
        m.connections.note(fd, name, key_text);  // and shut it down, with any other connection of a revoked key
        m.revoked_connections += m.connections
            .close_unless([&m](const std::string& n, const std::string& k) { return m.zap->name_of(k) == n; })
            .size();
        const std::string why = "its key was revoked (no longer on the allow-list)";
        m.counters.reject(m.options.label, name, why);
        return Failure{FailureKind::kRejected, why, name};
      }
      m.connections.note(fd, name, key_text);
    }
    Impl::PeerState& peer = m.peers[name];
    peer.traffic.bytes_received += bytes;
    auto decoded = decode_frames(frames, 1, m.options.tuning.limits);
    // Any authenticated traffic (valid or not) proves the connection is alive.
    peer.routing_id = routing_id;
    peer.fd = fd;
    peer.inode = inode_of(fd);
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
    ++peer.traffic.messages_received;
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
  const uint64_t sent_before = m.counters.bytes_sent;
  auto status = send_frames(m.socket, &it->second.routing_id, message, m.counters, m.options.label);
  if (status) {
    ++it->second.traffic.messages_sent;
    it->second.traffic.bytes_sent += m.counters.bytes_sent - sent_before;  // sends come from this thread only
  }
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

std::vector<std::string> ServerEndpoint::replace_allow_list(AllowList allow) {
  return impl_->replace_allow_list(std::move(allow));
}

std::map<std::string, PeerTraffic> ServerEndpoint::peer_traffic() const {
  std::map<std::string, PeerTraffic> out;
  for (const auto& [name, p] : impl_->peers) out[name] = p.traffic;
  return out;
}

int ServerEndpoint::poll_fd() const { return static_cast<int>(impl_->socket.get(zmq::sockopt::fd)); }

EndpointStats ServerEndpoint::stats() const {
  EndpointStats s = impl_->counters.snapshot();
  s.revoked_connections = impl_->revoked_connections;
  s.zap_admitted = impl_->zap->admitted();
  s.zap_denied = impl_->zap->denied();
  return s;
}

}  // namespace cleave::transport
