// http_client.h: the test side of the metrics endpoint — a raw TCP client
// that sends bytes and reads the reply until the server closes, with a
// receive timeout so a server that hangs fails the test instead of hanging it.
#pragma once

#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace cleave::testing {

// A socket connected to 127.0.0.1:`port` (-1 when the connection fails),
// whose reads give up after `timeout_ms`.
inline int connect_loopback(int port, int timeout_ms = 5000) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends on `fd` until it closes; "" plus `timed_out`
// when a read waited past the socket's timeout.
inline std::string read_until_closed(int fd, bool* timed_out = nullptr) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && timed_out) *timed_out = true;
    return n < 0 ? std::string() : out;
  }
}

// Sends `request` as it is to 127.0.0.1:`port` and returns the whole reply
// ("" when the connection failed or the reply did not come within `timeout_ms`).
inline std::string http_exchange(int port, const std::string& request, int timeout_ms = 5000) {
  const int fd = connect_loopback(port, timeout_ms);
  if (fd < 0) return "";
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply = read_until_closed(fd);
  ::close(fd);
  return reply;
}

// The reply to GET `path`.
inline std::string http_get(int port, const std::string& path = "/metrics", int timeout_ms = 5000) {
  return http_exchange(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n", timeout_ms);
}

// The body of a reply (after the blank line), "" when there is none.
inline std::string http_body(const std::string& reply) {
  const size_t at = reply.find("\r\n\r\n");
  return at == std::string::npos ? "" : reply.substr(at + 4);
}

// The value of the first sample line that starts with `series` (a metric name
// with its labels as rendered, e.g. `cleaved_jobs_total{kind="stage",outcome="finished"}`),
// or -1 when there is none.
inline double metric_value(const std::string& text, const std::string& series) {
  size_t at = 0;
  while ((at = text.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + series.size() + 1));
    at += series.size();
  }
  return -1;
}

}  // namespace cleave::testing
