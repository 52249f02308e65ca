// test_link_probe.cpp: daemon-to-daemon link probes (core/runtime/daemon/link_probe.h)
// over real CURVE endpoints on loopback: each direction is measured through
// its sender's throttle, so a --bandwidth-limit shows up in exactly one
// direction, and the echo server admits only the prober's key. The rate
// bounds hold on a loaded machine (see DirectionCheck).
#include <catch2/catch.hpp>

#include <string>

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

// The properties a probe must show on a loaded 2-core machine too. A token
// bucket never lets more through than its rate, so the throttled direction
// stays under the limit (10% for timer slack) in every probe. Load can only
// make a measurement slower, so the lower bounds (the throttled direction is
// not far below its limit; the other direction is clearly faster than the
// limit, i.e. not throttled) may take a few probes to show.
struct DirectionCheck {
  explicit DirectionCheck(double limit) : limit_mbps(limit) {}
  double limit_mbps;
  int probes = 0;
  bool throttled_reaches_limit = false, other_exceeds_limit = false;
  std::string seen;  // every probe's rates, for the failure message
  // Checks one probe; returns true once both lower bounds have been seen.
  bool add(double throttled, double other) {
    ++probes;
    seen += " [throttled " + std::to_string(throttled) + ", other " + std::to_string(other) + " Mbit/s]";
    CHECK(throttled <= 1.1 * limit_mbps);
    CHECK(throttled > 0);
    CHECK(other > 0);
    throttled_reaches_limit = throttled_reaches_limit || throttled >= 0.4 * limit_mbps;
    other_exceeds_limit = other_exceeds_limit || other > 1.5 * limit_mbps;
    return throttled_reaches_limit && other_exceeds_limit;
  }
};

constexpr int kMaxProbes = 3;

}  // namespace

TEST_CASE("link probes measure each direction through its sender's throttle", "[probe]") {
  const auto a = transport::generate_keypair(), b = transport::generate_keypair();
  const double limit_mbps = 20;
  const double limit = limit_mbps * 1e6 / 8;  // bytes/s
  {
    // B (the echo server) sends at most 20 Mbit/s: only B -> A is slow.
    ProbeEchoServer server("tcp://127.0.0.1:*", b, "a", a.public_key, limit);
    DirectionCheck check(limit_mbps);
    for (bool done = false; !done && check.probes < kMaxProbes;) {
      const LinkMeasurement m = probe_peer_link(dial(server, a, b), 0);
      INFO("probe " << check.probes + 1 << ": out " << m.mbps_out << " Mbit/s, in " << m.mbps_in
                    << " Mbit/s, latency " << m.latency_ms << " ms");
      done = check.add(m.mbps_in, m.mbps_out);
      CHECK(m.latency_ms > 0);
      CHECK(m.latency_ms < 1000);
    }
    INFO("probes:" << check.seen);
    CHECK(check.throttled_reaches_limit);
    CHECK(check.other_exceeds_limit);
  }
  {
    // A (the prober) is the throttled one: only A -> B is slow.
    ProbeEchoServer server("tcp://127.0.0.1:*", b, "a", a.public_key, 0);
    DirectionCheck check(limit_mbps);
    for (bool done = false; !done && check.probes < kMaxProbes;) {
      const LinkMeasurement m = probe_peer_link(dial(server, a, b), limit);
      INFO("probe " << check.probes + 1 << ": out " << m.mbps_out << " Mbit/s, in " << m.mbps_in << " Mbit/s");
      done = check.add(m.mbps_out, m.mbps_in);
    }
    INFO("probes:" << check.seen);
    CHECK(check.throttled_reaches_limit);
    CHECK(check.other_exceeds_limit);
  }
}

TEST_CASE("a link probe from a key the echo server does not admit gets no answer", "[probe]") {
  const auto a = transport::generate_keypair(), b = transport::generate_keypair(), stranger = transport::generate_keypair();
  ProbeEchoServer server("tcp://127.0.0.1:*", b, "a", a.public_key, 0);
  transport::ClientOptions o = dial(server, stranger, b);
  CHECK_THROWS_WITH(probe_peer_link(o, 0, transport::Millis(1500)), Catch::Contains("no answer"));
}
