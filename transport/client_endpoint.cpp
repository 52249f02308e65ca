// client_endpoint.cpp: the DEALER side (ClientEndpoint): one pinned server,
// reconnects, back-off after failed handshakes. Shared parts: endpoint_detail.h.
#include "transport/endpoint.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include <zmq.hpp>

#include "transport/endpoint_detail.h"
#include "transport/log.h"

namespace cleave::transport {

using namespace detail;

namespace {

std::string seconds_text(int ms) {
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

}  // namespace

struct ClientEndpoint::Impl {
  ClientOptions options;
  zmq::context_t context{1};
  zmq::socket_t socket;
  std::unique_ptr<Monitor> monitor;
  Counters counters;
  // Main thread only: whether the socket exists (not while backing off), and the back-off.
  bool open = false;
  Clock::time_point reopen_at;
  int backoff_ms = 1000;
  // Written by the monitor thread.
  mutable std::mutex state_mutex;
  mutable std::condition_variable state_cv;
  bool connected = false;
  bool failed = false;         // a handshake failed since the last service()
  uint64_t failures = 0;       // handshakes failed since the last successful one
  std::string failure_reason;  // why the last one failed
  // Signalled with state_cv: a receive waiting on the socket wakes for a
  // handshake's end too (a new connection, or a failed one, whose socket the next call closes).
  Wakeup handshake_ended;

  void on_event(uint16_t event, uint32_t value, const std::string& address) {
    std::lock_guard lock(state_mutex);
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      ++counters.handshakes_succeeded;
      connected = true;
      failures = 0;
      failure_reason.clear();
      state_cv.notify_all();
      handshake_ended.signal();
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      ++counters.disconnects;
      if (connected) log(LogLevel::kInfo, options.label + ": disconnected from " + address);
      connected = false;
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      note_failure("the server refused this client's key (ZAP status " + std::to_string(value) +
                   "): its .pub is not on the server's allow-list");
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      note_failure("the CURVE handshake failed: the server does not hold the secret key of the server key this "
                   "client was given (a wrong server key?), or it is not a cleave server");
    }
  }
  void note_failure(std::string why) {  // under state_mutex
    ++counters.handshakes_failed;
    ++failures;
    failed = true;
    failure_reason = std::move(why);
    state_cv.notify_all();
    handshake_ended.signal();
  }

  void open_socket() {
    {
      std::lock_guard lock(state_mutex);
      failed = false;
      connected = false;
    }
    socket = zmq::socket_t(context, zmq::socket_type::dealer);
    apply_tuning(socket, options.tuning);
    if (!options.insecure) {
      socket.set(zmq::sockopt::curve_serverkey, options.server_public_key);
      socket.set(zmq::sockopt::curve_publickey, options.keys.public_key);
      socket.set(zmq::sockopt::curve_secretkey, options.keys.secret_key);
    }
    monitor = std::make_unique<Monitor>(context, socket, [this](uint16_t event, uint32_t value, const std::string& a) {
      on_event(event, value, a);
    });
    socket.connect(options.connect);
    open = true;
  }
  void close_socket() {
    monitor.reset();
    socket.close();
    open = false;
  }

  // Main thread: after a failed handshake, closes the socket (libzmq would
  // retry at once, forever) and reopens it when the back-off has passed.
  void service() {
    bool just_failed = false, is_connected = false;
    std::string why;
    {
      std::lock_guard lock(state_mutex);
      just_failed = std::exchange(failed, false);
      is_connected = connected;
      why = failure_reason;
    }
    if (is_connected) backoff_ms = std::max(options.auth_backoff_initial_ms, 1);
    if (just_failed && open) {
      close_socket();
      reopen_at = Clock::now() + Millis(backoff_ms);
      log(LogLevel::kWarning, options.label + ": handshake with " + options.connect + " failed: " + why +
                                  "; retrying in " + seconds_text(backoff_ms));
      backoff_ms = std::min(backoff_ms * 2, std::max(options.auth_backoff_max_ms, backoff_ms));
    }
    if (!open && Clock::now() >= reopen_at) open_socket();
  }
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
  m.backoff_ms = std::max(o.auth_backoff_initial_ms, 1);
  m.open_socket();
}

ClientEndpoint::~ClientEndpoint() {
  if (!impl_) return;
  if (impl_->open) impl_->close_socket();
  impl_->context.close();
}

Status ClientEndpoint::send(const Message& message) {
  Impl& m = *impl_;
  m.service();
  if (!m.open)
    return Failure{FailureKind::kUnreachable, m.options.label + ": not connected to " + m.options.connect + " (" +
                                                  last_handshake_failure() + ")", {}};
  return send_frames(m.socket, nullptr, message, m.counters, m.options.label);
}

Result<Message> ClientEndpoint::receive(Millis timeout, const Wakeup* woken) {
  Impl& m = *impl_;
  m.service();
  if (!m.open) {  // backing off: wait (at most until the socket reopens, or a signal)
    auto left = std::max(Millis(0), std::chrono::duration_cast<Millis>(m.reopen_at - Clock::now()));
    if (timeout >= Millis(0)) left = std::min(left, timeout);  // a negative timeout has no limit, as poll_in's
    if (woken)
      woken->wait(static_cast<int>(left.count()));
    else
      std::this_thread::sleep_for(left);
    return Failure{FailureKind::kTimeout, m.options.label + ": not connected (" + last_handshake_failure() + ")", {}};
  }
  try {
    // A caller that can be woken is woken for a handshake's end too; the state
    // it announced is read by the caller's next call (service()).
    const Ready ready = wait_ready(m.socket, timeout, {woken, woken ? &m.handshake_ended : nullptr});
    if (woken) m.handshake_ended.clear();
    if (!ready.socket) {
      const std::string why = ready.woken ? "woken before a message came"
                                          : "no message within " + std::to_string(timeout.count()) + " ms";
      return Failure{FailureKind::kTimeout, m.options.label + ": " + why, {}};
    }
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
  impl_->service();
  std::lock_guard lock(impl_->state_mutex);
  return impl_->connected;
}

bool ClientEndpoint::wait_connected(Millis timeout) const {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    m.service();
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    std::unique_lock lock(m.state_mutex);
    if (m.connected || left <= Millis(0)) return m.connected;
    // Short waits: a failed handshake must be serviced (socket closed) promptly.
    m.state_cv.wait_for(lock, std::min(left, Millis(50)), [&] { return m.connected || m.failed; });
  }
}

uint64_t ClientEndpoint::failed_handshakes() const {
  std::lock_guard lock(impl_->state_mutex);
  return impl_->failures;
}

std::string ClientEndpoint::last_handshake_failure() const {
  std::lock_guard lock(impl_->state_mutex);
  return impl_->failure_reason;
}

EndpointStats ClientEndpoint::stats() const { return impl_->counters.snapshot(); }

int ClientEndpoint::poll_fd() const {
  return impl_->open ? static_cast<int>(impl_->socket.get(zmq::sockopt::fd)) : -1;
}

}  // namespace cleave::transport
