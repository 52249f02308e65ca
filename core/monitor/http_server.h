// http_server.h: the metrics endpoint — a small HTTP/1.1 server on its own
// thread that answers GET /metrics with the text `render` returns
// (http_reply.h says what every other request gets).
//
// Written on POSIX sockets rather than over libmicrohttpd or cpp-httplib: it
// serves one read-only page, and libcleave.so (which embeds it, in the
// daemon) then needs no new shared library and no exported symbol.
//
// A scraper cannot hurt the process it watches: one thread poll()s every
// connection (non-blocking sockets), so a client that connects and sends
// nothing, or dribbles, holds only its own slot until its deadline
// (request_timeout_ms from accept, read and write together) and never
// delays another scrape; a request head over max_request_bytes gets 431;
// over max_connections at once, a new one gets 503 and is closed; writes
// never raise SIGPIPE; nothing the thread meets ends the process (an
// exception drops the connections and the server serves on).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/monitor/listen_address.h"

namespace cleave::monitor {

struct HttpServerOptions {
  size_t max_request_bytes = 8192;  // request line + headers
  int request_timeout_ms = 5000;    // from accept until the reply is written
  int max_connections = 16;         // open at once
};

class MetricsServer {
 public:
  // Binds `address` (port 0: a free one) and starts serving. Throws
  // std::runtime_error naming the address and the reason when it cannot (a
  // host that does not resolve, the port in use, no permission).
  MetricsServer(const ListenAddress& address, std::function<std::string()> render, HttpServerOptions options = {});
  // Stops the thread and closes every connection.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The address bound, with the port the system picked for port 0.
  const ListenAddress& bound() const;
  // "http://127.0.0.1:9464/metrics", "http://[::1]:9464/metrics".
  std::string url() const;
  // True when only this machine can connect (127.0.0.0/8, ::1).
  bool loopback() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave::monitor
