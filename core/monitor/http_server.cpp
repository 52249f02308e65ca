// http_server.cpp: see http_server.h. The thread's loop: poll the wake-up
// pipe, the listening socket and each connection; accept what waits; read a
// connection until its request head is complete, then write its reply, then
// drain what it still sends until it closes (closing with unread input would
// reset the connection and could lose the reply); close it at its deadline
// whatever its state.
#include "core/monitor/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/monitor/http_reply.h"

namespace cleave::monitor {
namespace {

using Clock = std::chrono::steady_clock;

struct Connection {
  enum class State { reading, writing, draining };
  int fd = -1;
  State state = State::reading;
  std::string in, out;
  size_t written = 0;
  Clock::time_point deadline;
};

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family != AF_INET6) return false;
  const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
}

// A listening, non-blocking socket on `address`; fills in the port bound and whether it is loopback only.
int listen_on(ListenAddress& address, bool& loopback) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string where = format_listen_address(address);
  const std::string port = std::to_string(address.port);
  if (const int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw std::runtime_error("cannot serve metrics on " + where + ": " + gai_strerror(rc));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* ai = found; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int on = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // a restart need not wait out TIME_WAIT
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) throw std::runtime_error("cannot serve metrics on " + where + ": " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  address.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                                   : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  loopback = is_loopback(bound);
  return fd;
}

}  // namespace

struct MetricsServer::Impl {
  ListenAddress address;
  bool loopback = false;
  std::function<std::string()> render;
  HttpServerOptions options;
  int listener = -1;
  int wake[2] = {-1, -1};  // the destructor writes to wake[1]
  std::list<Connection> connections;
  std::thread thread;

  void run();
  void accept_waiting();
  void read_from(Connection& c);
  void write_to(Connection& c);
  void close_all();
};

void MetricsServer::Impl::run() {
  for (;;) {
    try {
      std::vector<pollfd> fds = {{wake[0], POLLIN, 0}, {listener, POLLIN, 0}};
      auto wait = std::chrono::milliseconds(1000);
      const auto now = Clock::now();
      for (const Connection& c : connections) {
        fds.push_back({c.fd, static_cast<short>(c.state == Connection::State::writing ? POLLOUT : POLLIN), 0});
        wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now) +
                                  std::chrono::milliseconds(1));
      }
      const int timeout = static_cast<int>(std::max<int64_t>(wait.count(), 0));
      if (::poll(fds.data(), fds.size(), timeout) < 0) {
        if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // ENOMEM: try again soon
        continue;
      }
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) accept_waiting();
      size_t i = 2;
      for (auto it = connections.begin(); it != connections.end(); ++i) {
        Connection& c = *it;
        // Connections accepted in this round have no pollfd yet (i past the end): their turn is the next poll.
        const short ready = i < fds.size() && fds[i].fd == c.fd ? fds[i].revents : 0;
        if (ready & (POLLIN | POLLHUP | POLLERR)) read_from(c);
        if (ready & POLLOUT) write_to(c);
        if (c.fd < 0 || Clock::now() >= c.deadline) {
          if (c.fd >= 0) ::close(c.fd);
          it = connections.erase(it);
        } else {
          ++it;
        }
      }
    } catch (...) {
      close_all();  // e.g. out of memory: drop the scrapes, keep serving
    }
  }
}

void MetricsServer::Impl::accept_waiting() {
  for (;;) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left; anything else: the next poll tries again
    if (connections.size() >= static_cast<size_t>(options.max_connections)) {
      const std::string busy = http_status_reply("503 Service Unavailable", "too many connections");
      (void)::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      continue;
    }
    Connection c;
    c.fd = fd;
    c.deadline = Clock::now() + std::chrono::milliseconds(options.request_timeout_ms);
    connections.push_back(std::move(c));
  }
}

void MetricsServer::Impl::read_from(Connection& c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {  // closed (or failed) by the client: nothing more to do for it
      ::close(c.fd);
      c.fd = -1;
      return;
    }
    if (c.state != Connection::State::reading) continue;  // draining (or the client talks over its reply)
    c.in.append(buf, static_cast<size_t>(n));
    const size_t head = request_head_end(c.in);
    if (head > 0 && head <= options.max_request_bytes) {
      c.out = http_reply(std::string_view(c.in).substr(0, head), render);
    } else if (c.in.size() > options.max_request_bytes) {
      c.out = http_status_reply("431 Request Header Fields Too Large",
                                "the request head is over " + std::to_string(options.max_request_bytes) + " bytes");
    } else {
      continue;
    }
    c.in.clear();
    c.state = Connection::State::writing;
    return;
  }
}

void MetricsServer::Impl::write_to(Connection& c) {
  while (c.written < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      ::close(c.fd);
      c.fd = -1;
      return;
    }
    c.written += static_cast<size_t>(n);
  }
  // All written: say so, and wait (until the deadline) for the client to close its side.
  ::shutdown(c.fd, SHUT_WR);
  c.out.clear();
  c.state = Connection::State::draining;
}

void MetricsServer::Impl::close_all() {
  for (Connection& c : connections)
    if (c.fd >= 0) ::close(c.fd);
  connections.clear();
}

MetricsServer::MetricsServer(const ListenAddress& address, std::function<std::string()> render,
                             HttpServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.address = address;
  m.render = std::move(render);
  m.options = options;
  m.listener = listen_on(m.address, m.loopback);
  if (::pipe2(m.wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    ::close(m.listener);
    throw std::runtime_error(std::string("cannot serve metrics: pipe: ") + std::strerror(errno));
  }
  m.thread = std::thread([&m] { m.run(); });
}

MetricsServer::~MetricsServer() {
  Impl& m = *impl_;
  const char stop = 1;
  // If the byte cannot be written the pipe is full: a wake-up is pending anyway.
  // (A (void) cast does not silence glibc's warn_unused_result under _FORTIFY_SOURCE.)
  [[maybe_unused]] const ssize_t woken = ::write(m.wake[1], &stop, 1);
  m.thread.join();
  m.close_all();
  ::close(m.listener);
  ::close(m.wake[0]);
  ::close(m.wake[1]);
}

const ListenAddress& MetricsServer::bound() const { return impl_->address; }

std::string MetricsServer::url() const { return "http://" + format_listen_address(impl_->address) + "/metrics"; }

bool MetricsServer::loopback() const { return impl_->loopback; }

}  // namespace cleave::monitor
