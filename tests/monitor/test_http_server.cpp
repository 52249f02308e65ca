// test_http_server.cpp: core/monitor/http_server.h and listen_address.h over
// real loopback sockets — /metrics, 404, 405, garbage, an oversized head, a
// renderer that throws, too many connections, a port in use, and a client
// that connects and sends nothing, which must not hold up the next scrape.
// Each exchange reads with a socket timeout, so a server that blocks fails
// the case instead of hanging it.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/monitor/http_server.h"
#include "core/monitor/listen_address.h"
#include "monitor/http_client.h"

using namespace cleave::monitor;
using namespace cleave::testing;
using namespace std::string_literals;

namespace {

const char* kBody = "# HELP up Whether it is up.\n# TYPE up gauge\nup 1\n";

std::string status_line(const std::string& reply) { return reply.substr(0, reply.find("\r\n")); }

MetricsServer loopback_server(HttpServerOptions options = {}) {
  return MetricsServer(parse_listen_address("127.0.0.1:0"), [] { return std::string(kBody); }, options);
}

}  // namespace

TEST_CASE("listen addresses: HOST:PORT with IPv6 in brackets, anything else names the problem", "[monitor]") {
  const ListenAddress a = parse_listen_address("127.0.0.1:9464");
  CHECK(a.host == "127.0.0.1");
  CHECK(a.port == 9464);
  CHECK(parse_listen_address("[::1]:0").host == "::1");
  CHECK(parse_listen_address("0.0.0.0:65535").port == 65535);
  CHECK(parse_listen_address("localhost:9464").host == "localhost");
  CHECK(format_listen_address(parse_listen_address("[::1]:80")) == "[::1]:80");
  for (const char* bad : {"nonsense", "127.0.0.1", "127.0.0.1:", ":9464", "127.0.0.1:65536", "127.0.0.1:-1",
                          "127.0.0.1:94x", "::1:9464", "[::1:9464", "[nope]:9464", "[]:1", "bad host:1", "a/b:1"}) {
    INFO(bad);
    try {
      parse_listen_address(bad);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("is not HOST:PORT") != std::string::npos);
    }
  }
}

TEST_CASE("GET /metrics answers 200 with the text format's content type and the rendered body", "[monitor]") {
  MetricsServer server = loopback_server();
  CHECK(server.bound().port > 0);
  CHECK(server.loopback());
  CHECK(server.url() == "http://127.0.0.1:" + std::to_string(server.bound().port) + "/metrics");
  const std::string reply = http_get(server.bound().port);
  CHECK(status_line(reply) == "HTTP/1.1 200 OK");
  CHECK(reply.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n") != std::string::npos);
  CHECK(reply.find("\r\nContent-Length: " + std::to_string(std::string(kBody).size()) + "\r\n") != std::string::npos);
  CHECK(http_body(reply) == kBody);
  // A query string is ignored; HTTP/1.0 and a bare-LF client are served too; HEAD gets no body.
  CHECK(http_body(http_get(server.bound().port, "/metrics?x=1")) == kBody);
  CHECK(http_body(http_exchange(server.bound().port, "GET /metrics HTTP/1.0\n\n")) == kBody);
  const std::string head = http_exchange(server.bound().port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK(status_line(head) == "HTTP/1.1 200 OK");
  CHECK(http_body(head).empty());
}

TEST_CASE("other paths get 404, other methods 405, garbage 400 and an oversized head 431", "[monitor]") {
  MetricsServer server = loopback_server();
  const int port = server.bound().port;
  CHECK(status_line(http_get(port, "/")) == "HTTP/1.1 404 Not Found");
  CHECK(status_line(http_get(port, "/metricsx")) == "HTTP/1.1 404 Not Found");
  const std::string post = http_exchange(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  CHECK(status_line(post) == "HTTP/1.1 405 Method Not Allowed");
  CHECK(post.find("\r\nAllow: GET, HEAD\r\n") != std::string::npos);
  CHECK(status_line(http_exchange(port, "DELETE /metrics HTTP/1.1\r\n\r\n")) == "HTTP/1.1 405 Method Not Allowed");
  // A TLS ClientHello's first bytes (with NULs), a bare method, no version, another protocol, two spaces.
  for (const std::string& garbage : {"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n"s, "GET\r\n\r\n"s, "GET /metrics\r\n\r\n"s,
                                     "GET /metrics SPDY/3\r\n\r\n"s, "GET  /metrics HTTP/1.1\r\n\r\n"s}) {
    INFO(garbage);
    CHECK(status_line(http_exchange(port, garbage)) == "HTTP/1.1 400 Bad Request");
  }
  const std::string huge = "GET /metrics HTTP/1.1\r\nX-Filler: " + std::string(20000, 'a') + "\r\n\r\n";
  CHECK(status_line(http_exchange(port, huge)) == "HTTP/1.1 431 Request Header Fields Too Large");
  // After all that, it still serves.
  CHECK(http_body(http_get(port)) == kBody);
}

TEST_CASE("a client that connects and sends nothing neither blocks the next scrape nor stays past its deadline",
          "[monitor]") {
  {
    // Silent and dribbling clients whose deadline (30 s) is far past the scrapes' read timeout (5 s):
    // a server that served connections one after another would fail every scrape below.
    HttpServerOptions patient;
    patient.request_timeout_ms = 30000;
    MetricsServer server = loopback_server(patient);
    const int port = server.bound().port;
    std::vector<int> waiting;
    for (int i = 0; i < 3; ++i) waiting.push_back(connect_loopback(port));
    waiting.push_back(connect_loopback(port));
    REQUIRE(::send(waiting.back(), "GET /met", 8, MSG_NOSIGNAL) == 8);
    for (int i = 0; i < 3; ++i) CHECK(http_body(http_get(port)) == kBody);
    for (int fd : waiting) ::close(fd);
  }
  // With a short deadline, the server closes a silent client and an unfinished request, unanswered,
  // well before the reads' own 10 s timeout.
  HttpServerOptions brief;
  brief.request_timeout_ms = 300;
  MetricsServer server = loopback_server(brief);
  const int silent = connect_loopback(server.bound().port, 10000);
  const int dribbler = connect_loopback(server.bound().port, 10000);
  REQUIRE(::send(dribbler, "GET /met", 8, MSG_NOSIGNAL) == 8);
  for (int fd : {silent, dribbler}) {
    bool timed_out = false;
    CHECK(read_until_closed(fd, &timed_out).empty());
    CHECK_FALSE(timed_out);
    ::close(fd);
  }
  CHECK(http_body(http_get(server.bound().port)) == kBody);
}

TEST_CASE("more connections than allowed get 503, a renderer that throws gets 500, both leave the server serving",
          "[monitor]") {
  HttpServerOptions options;
  options.max_connections = 2;
  options.request_timeout_ms = 20000;
  MetricsServer server = loopback_server(options);
  const int port = server.bound().port;
  const int a = connect_loopback(port), b = connect_loopback(port);
  // The two slots are taken once the server has accepted them; until then a scrape may still get one.
  std::string reply;
  for (int tries = 0; tries < 250 && status_line(reply) != "HTTP/1.1 503 Service Unavailable"; ++tries) {
    reply = http_get(port);
    if (status_line(reply) != "HTTP/1.1 503 Service Unavailable") ::usleep(20000);  // not full yet (or no reply): wait
  }
  CHECK(status_line(reply) == "HTTP/1.1 503 Service Unavailable");
  ::close(a);
  ::close(b);
  // Freed slots are taken again once the server sees the closes.
  for (int tries = 0; tries < 250 && status_line(reply) != "HTTP/1.1 200 OK"; ++tries) {
    ::usleep(20000);
    reply = http_get(port);
  }
  CHECK(status_line(reply) == "HTTP/1.1 200 OK");

  std::atomic<int> renders{0};
  MetricsServer failing(parse_listen_address("127.0.0.1:0"), [&]() -> std::string {
    if (++renders == 1) throw std::runtime_error("a collector failed");
    return kBody;
  });
  const std::string failed = http_get(failing.bound().port);
  CHECK(status_line(failed) == "HTTP/1.1 500 Internal Server Error");
  CHECK(failed.find("a collector failed") == std::string::npos);  // internals stay out of the reply
  CHECK(http_body(http_get(failing.bound().port)) == kBody);
}

TEST_CASE("a port in use or an address not on this machine is a start-up error naming the address", "[monitor]") {
  MetricsServer first = loopback_server();
  const std::string taken = "127.0.0.1:" + std::to_string(first.bound().port);
  try {
    MetricsServer second(parse_listen_address(taken), [] { return std::string(); });
    FAIL("bound a port in use");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "cannot serve metrics on " + taken + ": Address already in use");
  }
  // An address this machine does not have (TEST-NET-1, RFC 5737): no name lookup needed to fail.
  CHECK_THROWS_WITH(MetricsServer(parse_listen_address("192.0.2.1:0"), [] { return std::string(); }),
                    "cannot serve metrics on 192.0.2.1:0: Cannot assign requested address");
}
