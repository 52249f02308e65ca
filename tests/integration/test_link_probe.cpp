// test_link_probe.cpp: daemon-to-daemon link probes (core/runtime/daemon/link_probe.h)
// over real CURVE endpoints on loopback: each direction is measured through
// its sender's throttle, so a --bandwidth-limit shows up in exactly one
// direction, and the echo server admits only the prober's key.
#include <catch2/catch.hpp>

#include "core/runtime/daemon/link_probe.h"
#include "transport/keys.h"

using namespace cleave;

namespace {

transport::ClientOptions dial(const ProbeEchoServer& server, const transport::KeyPair& me,
                              const transport::KeyPair& server_keys) {
  transport::ClientOptions o;
  o.connect = server.endpoint();
  o.keys = me;
  o.server_public_key = server_keys.public_key;
  o.label = "probe test";
  return o;
}

}  // namespace

TEST_CASE("link probes measure each direction through its sender's throttle", "[probe]") {
  const auto a = transport::generate_keypair(), b = transport::generate_keypair();
  const double limit = 20e6 / 8;  // 20 Mbit/s in bytes/s
  {
    // B (the echo server) sends at most 20 Mbit/s: only B -> A is slow.
    ProbeEchoServer server("tcp://127.0.0.1:*", b, "a", a.public_key, limit);
    const LinkMeasurement m = probe_peer_link(dial(server, a, b), 0);
    INFO("out " << m.mbps_out << " Mbit/s, in " << m.mbps_in << " Mbit/s, latency " << m.latency_ms << " ms");
    CHECK(m.mbps_in <= 22);  // a token bucket never lets more through (10% for timer slack)
    CHECK(m.mbps_in >= 8);   // and a loaded machine does not halve it
    CHECK(m.mbps_out > 40);  // the other direction is loopback
    CHECK(m.latency_ms > 0);
    CHECK(m.latency_ms < 1000);
  }
  {
    // A (the prober) is the throttled one: only A -> B is slow.
    ProbeEchoServer server("tcp://127.0.0.1:*", b, "a", a.public_key, 0);
    const LinkMeasurement m = probe_peer_link(dial(server, a, b), limit);
    INFO("out " << m.mbps_out << " Mbit/s, in " << m.mbps_in << " Mbit/s");
    CHECK(m.mbps_out <= 22);
    CHECK(m.mbps_out >= 8);
    CHECK(m.mbps_in > 40);
  }
}

TEST_CASE("a link probe from a key the echo server does not admit gets no answer", "[probe]") {
  const auto a = transport::generate_keypair(), b = transport::generate_keypair(), stranger = transport::generate_keypair();
  ProbeEchoServer server("tcp://127.0.0.1:*", b, "a", a.public_key, 0);
  transport::ClientOptions o = dial(server, stranger, b);
  CHECK_THROWS_WITH(probe_peer_link(o, 0, transport::Millis(1500)), Catch::Contains("no answer"));
}
