// test_secagg_round.cpp: secure aggregation's whole protocol in one process
// (core/runtime/common/secagg_round.h): five clients with random updates and
// sample counts; the unmasked sum equals the plain weighted mean within the
// quantization bound with everyone present, with one client dropping before
// its masked input and another after it; fewer than t reveals abandon the
// round; and the refusals that keep the coordinator from learning more than
// the sum: a roster key that fails its MAC, a second unmask request, an unmask
// that asks for both secrets of one client. Every message crosses the wire
// codec (encode_header / decode_message) as it would between processes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/fed/dp.h"
#include "core/fed/secagg_crypto.h"
#include "core/runtime/common/secagg_round.h"
#include "core/util/rng.h"
#include "transport/message.h"

using namespace cleave;
using namespace cleave::secagg;
using Catch::Contains;
using transport::Message;
using transport::SecAggMsg;
using transport::SecAggPhase;
using transport::SecAggSetup;

namespace {

constexpr int64_t kRound = 7;
constexpr size_t kElements = 1000;  // two ChaCha20 chunks: one whole, one partial

// A message after the wire: encoded, decoded and validated as a receiver would.
Message wire(const Message& m) {
  auto r = transport::decode_message(transport::encode_header(m), m.payloads);
  if (!r.ok()) FAIL("the codec refused a secure-aggregation message: " << r.failure().message);
  return std::move(r).value();
}

SecAggMsg wire(const SecAggMsg& s) { return std::get<SecAggMsg>(wire(transport::message_of(s)).body); }

// n clients with static CURVE key pairs and the round's updates.
struct Cluster {
  SecAggSetup setup;
  std::vector<KeyPair> statics;                  // [index - 1]
  std::vector<std::unique_ptr<ClientRound>> clients;
  std::vector<std::vector<double>> deltas;
  std::vector<int64_t> samples;
  std::unique_ptr<ServerRound> server;

  explicit Cluster(int n, int t, uint64_t seed, bool weight_by_samples = true) {
    setup.threshold = t;
    setup.range = 1.0f;
    setup.frac_bits = 16;  // the updates have 24-bit fractions: rounding really happens
    setup.weight_by_samples = weight_by_samples;
    Rng rng(seed);
    for (int i = 1; i <= n; ++i) {
      statics.push_back(make_key_pair());
      transport::PeerInfo p;
      p.name = std::string("c").append(std::to_string(i));  // (not "c" + ...: GCC 12's -Wrestrict false positive)
      p.public_key = z85_encode_key(statics.back().public_key);
      setup.clients.push_back(p);
      std::vector<double> d(kElements);
      for (double& x : d) x = rng.uniform(-0.5f, 0.5f);
      deltas.push_back(std::move(d));
      samples.push_back(1 + static_cast<int64_t>(rng.below(100)));
    }
    restart();
  }
  // Fresh round state on every side (same roster and updates).
  void restart() {
    clients.clear();
    for (const KeyPair& k : statics)
      clients.push_back(std::make_unique<ClientRound>(kRound, setup, k.secret_key.bytes, k.public_key));
    server = std::make_unique<ServerRound>(kRound, setup, kElements);
  }
  ClientRound& client(int index) { return *clients[static_cast<size_t>(index - 1)]; }

  void keys_and_shares() {
    for (auto& c : clients) server->on_keys(c->index(), wire(c->keys()));
    for (int u : server->key_senders()) server->on_shares(u, wire(client(u).shares(wire(server->roster_for(u)))));
  }
  // The masked inputs of every client but those in `silent`.
  void masked(const std::set<int>& silent, NoiseSource* noise = nullptr) {
    for (int u : server->share_senders()) {
      const SecAggMsg delivery = wire(server->delivery_for(u));
      if (silent.count(u)) continue;
      const auto i = static_cast<size_t>(u - 1);
      server->on_masked(u, wire(client(u).masked(delivery, deltas[i], samples[i], noise)));
    }
  }
  // The reveals of every survivor but those in `silent`.
  void reveals(const std::set<int>& silent) {
    const SecAggMsg unmask = wire(server->unmask());
    for (int u : unmask.survivors)
      if (!silent.count(u)) server->on_reveal(u, wire(client(u).reveal(unmask)));
  }
  double weight(int index) const {
    return setup.weight_by_samples ? static_cast<double>(samples[static_cast<size_t>(index - 1)]) : 1.0;
  }
};

// sum / total weight against the weighted mean of the survivors' updates in double.
void check_mean(const Cluster& c, const ServerRound::Sum& sum) {
  double total = 0;
  for (int u : sum.survivors) total += c.weight(u);
  REQUIRE(sum.total_weight == total);
  const double bound = quantization_bound(c.setup.frac_bits, static_cast<int>(sum.survivors.size()), total);
  REQUIRE(sum.weighted_sum.size() == kElements);
  double worst = 0;
  for (size_t i = 0; i < kElements; ++i) {
    double mean = 0;
    for (int u : sum.survivors) mean += c.weight(u) * c.deltas[static_cast<size_t>(u - 1)][i];
    mean /= total;
    worst = std::max(worst, std::fabs(sum.weighted_sum[i] / sum.total_weight - mean));
  }
  CHECK(worst <= bound * (1 + 1e-9));
  CHECK(worst > 0);  // quantization is really there: this is not the plain sum passed through
}

void check_audit(const ServerRound::Audit& a) {
  for (const auto& [index, count] : a.seed_shares) CHECK_FALSE(a.mask_key_shares.count(index));
}

}  // namespace

TEST_CASE("secagg round: five clients, the weighted mean within the quantization bound", "[runtime][secagg]") {
  Cluster c(5, 3, 1);
  c.keys_and_shares();
  c.masked({});
  c.reveals({});
  const ServerRound::Sum sum = c.server->finish(kElements);
  CHECK(sum.survivors == std::vector<int>{1, 2, 3, 4, 5});
  CHECK(sum.dropped.empty());
  check_mean(c, sum);
  const ServerRound::Audit a = c.server->audit();
  CHECK(a.seed_shares.size() == 5);
  for (const auto& [index, count] : a.seed_shares) CHECK(count == 5);
  CHECK(a.mask_key_shares.empty());
  check_audit(a);
  for (auto& client : c.clients) CHECK(client->clamped() == 0);
}

TEST_CASE("secagg round: one client drops before its masked input, another after it", "[runtime][secagg]") {
  Cluster c(5, 3, 2);
  c.keys_and_shares();
  c.masked({2});   // 2 shared its secrets, then went: its pairwise masks must be removed
  c.reveals({4});  // 4's masked input counts, though it never revealed
  const ServerRound::Sum sum = c.server->finish(kElements);
  CHECK(sum.survivors == std::vector<int>{1, 3, 4, 5});
  CHECK(sum.dropped == std::vector<int>{2});
  check_mean(c, sum);
  const ServerRound::Audit a = c.server->audit();
  CHECK(a.seed_shares == std::map<int, int>{{1, 3}, {3, 3}, {4, 3}, {5, 3}});
  CHECK(a.mask_key_shares == std::map<int, int>{{2, 3}});
  check_audit(a);
}

TEST_CASE("secagg round: fewer than t reveals abandon the round", "[runtime][secagg]") {
  Cluster c(5, 3, 3);
  c.keys_and_shares();
  c.masked({});
  c.reveals({3, 4, 5});
  CHECK_THROWS_WITH(c.server->finish(kElements),
                    "secure aggregation, round 7: only 2 of the t=3 shares needed arrived (clients that dropped: "
                    "client 'c3' (index 3), client 'c4' (index 4), client 'c5' (index 5)); the round is abandoned "
                    "and the previous global model kept");
  // Fewer than t masked inputs: the coordinator stops before asking anyone to unmask.
  c.restart();
  c.keys_and_shares();
  c.masked({1, 2, 3});
  CHECK_THROWS_WITH(c.server->unmask(), Contains("only 2 of the t=3 masked inputs needed arrived"));
}

TEST_CASE("secagg round: a roster key that is not the client's fails its MAC check", "[runtime][secagg]") {
  Cluster c(5, 3, 4);
  for (auto& client : c.clients) c.server->on_keys(client->index(), client->keys());
  const SecAggMsg good = c.server->roster_for(1);
  const KeyPair coordinator = make_key_pair();
  for (int field = 0; field < 3; ++field) {
    SecAggMsg bad = good;
    auto& item = bad.items[1];  // client 2's keys, as client 1 receives them
    REQUIRE(item.index == 2);
    if (field == 0) item.a.assign(coordinator.public_key.begin(), coordinator.public_key.end());
    if (field == 1) item.b[5] ^= 1;
    if (field == 2) item.mac[0] ^= 1;
    CHECK_THROWS_WITH(c.client(1).shares(bad), Contains("client 'c2' (index 2) fail their MAC check"));
  }
  // A roster below the threshold, or one that leaves out the receiver's own keys.
  SecAggMsg few = good;
  few.items.resize(2);
  CHECK_THROWS_WITH(c.client(1).shares(few), Contains("only 2 clients sent keys"));
  SecAggMsg without_self = good;
  without_self.items.erase(without_self.items.begin());
  CHECK_THROWS_WITH(c.client(1).shares(without_self), Contains("leaves out this client's own keys"));
  // The refusals spent nothing: the true roster is still taken.
  CHECK_NOTHROW(c.client(1).shares(good));
}

TEST_CASE("secagg round: a second unmask request is refused", "[runtime][secagg]") {
  Cluster c(5, 3, 5);
  c.keys_and_shares();
  c.masked({});
  const SecAggMsg unmask = c.server->unmask();
  CHECK_NOTHROW(c.client(1).reveal(unmask));
  CHECK_THROWS_WITH(c.client(1).reveal(unmask), Contains("a second unmask request"));
  // A coordinator that asks again with 2 "dropped" would get 2's mask key on top of its seed.
  SecAggMsg again = unmask;
  again.survivors = {1, 3, 4, 5};
  again.dropped = {2};
  CHECK_THROWS_WITH(c.client(1).reveal(again), Contains("a second unmask request"));
}

TEST_CASE("secagg round: an unmask that asks for both secrets of one client is refused", "[runtime][secagg]") {
  Cluster c(5, 3, 6);
  c.keys_and_shares();
  c.masked({});
  SecAggMsg both = c.server->unmask();
  both.dropped = {2};  // 2 also stays among the survivors
  CHECK_THROWS_WITH(c.client(1).reveal(both), Contains("asks for both secrets of client 'c2' (index 2)"));
  SecAggMsg partial = c.server->unmask();
  partial.survivors = {1, 3, 4};  // 5 in neither list
  CHECK_THROWS_WITH(c.client(1).reveal(partial), Contains("not the clients that shared secrets"));
  SecAggMsg not_me = c.server->unmask();
  not_me.survivors = {2, 3, 4, 5};
  not_me.dropped = {1};
  CHECK_THROWS_WITH(c.client(1).reveal(not_me), Contains("does not count this client among the survivors"));
  // The coordinator side refuses a reveal that hands it the wrong secret of a survivor.
  SecAggMsg r = c.client(1).reveal(c.server->unmask());
  r.items[1].b = {1};
  CHECK_THROWS_WITH(c.server->on_reveal(1, r), Contains("is not a 32-byte share"));
  check_audit(c.server->audit());
}

TEST_CASE("secagg round: a tampered share box is refused by its recipient", "[runtime][secagg]") {
  Cluster c(4, 2, 7);
  c.keys_and_shares();
  SecAggMsg delivery = c.server->delivery_for(1);
  delivery.items[0].a[50] ^= 1;
  const auto& d = c.deltas[0];
  CHECK_THROWS_WITH(c.client(1).masked(delivery, d, 10, nullptr), Contains("client 'c2' (index 2) does not open"));
}

TEST_CASE("secagg round: the coordinator refuses messages that do not belong", "[runtime][secagg]") {
  Cluster c(4, 2, 8);
  const SecAggMsg k1 = c.client(1).keys();
  SecAggMsg other_round = k1;
  other_round.round = kRound + 1;
  CHECK_THROWS_WITH(c.server->on_keys(1, other_round), Contains("of round 8"));
  CHECK_THROWS_WITH(c.server->on_keys(2, k1), Contains("not one item of the sender's own index"));
  CHECK_THROWS_WITH(c.server->on_keys(9, k1), Contains("not a roster index"));
  SecAggMsg short_macs = k1;
  short_macs.items[0].mac.resize(32);
  CHECK_THROWS_WITH(c.server->on_keys(1, short_macs), Contains("one 32-byte MAC per roster member"));
  c.server->on_keys(1, k1);
  CHECK_THROWS_WITH(c.server->on_keys(1, k1), Contains("a second keys message"));
  for (int i = 2; i <= 3; ++i) c.server->on_keys(i, c.client(i).keys());
  const SecAggMsg s1 = c.client(1).shares(c.server->roster_for(1));
  CHECK_THROWS_WITH(c.server->on_keys(4, c.client(4).keys()), Contains("too late"));  // U1 is announced
  SecAggMsg missing = s1;
  missing.items.pop_back();
  CHECK_THROWS_WITH(c.server->on_shares(1, missing), Contains("not one box for every other client"));
  CHECK_THROWS_WITH(c.server->on_shares(1, k1), Contains("is a keys message"));
  c.server->on_shares(1, s1);
  CHECK_THROWS_WITH(c.server->on_shares(4, s1), Contains("it sent no keys"));
}

TEST_CASE("secagg round: DP mode weighs every client 1, clips, clamps and adds each client's noise",
          "[runtime][secagg]") {
  Cluster c(5, 3, 9, /*weight_by_samples=*/false);
  c.setup.clip = 5;       // the updates' norms are about 9: every one is scaled down
  c.deltas[0][0] = 4.0f;  // 4 x (5 / norm) is still above the range, 1: clamped
  c.restart();
  c.keys_and_shares();
  c.masked({});
  c.reveals({});
  const ServerRound::Sum plain = c.server->finish(kElements);
  CHECK(plain.total_weight == 5);
  CHECK(c.client(1).clamped() == 1);
  CHECK(c.client(2).clamped() == 0);
  // What each client should have masked: its update clipped to norm 5, then clamped.
  for (auto& d : c.deltas) {
    double sq = 0;
    for (double x : d) sq += x * x;
    const double scale = 5 / std::sqrt(sq);
    REQUIRE(scale < 1);
    for (double& x : d) x = std::clamp(x * scale, -1.0, 1.0);
  }
  check_mean(c, plain);

  // Each client adds N(0, 0.01^2) per coordinate: the sum carries N(0, 5 x 0.01^2).
  c.setup.noise_stddev = 0.01f;
  c.restart();
  c.keys_and_shares();
  NoiseSource noise(42);
  CHECK_THROWS_WITH(c.client(1).masked(c.server->delivery_for(1), c.deltas[0], 1, nullptr),
                    Contains("no noise source"));
  c.masked({}, &noise);
  c.reveals({});
  const ServerRound::Sum noisy = c.server->finish(kElements);
  double sq = 0;
  for (size_t i = 1; i < kElements; ++i) {
    const double d = noisy.weighted_sum[i] - plain.weighted_sum[i];
    sq += d * d;
  }
  CHECK(std::sqrt(sq / (kElements - 1)) == Approx(0.01 * std::sqrt(5.0)).epsilon(0.1));
}

TEST_CASE("secagg round: setups that cannot work are refused", "[runtime][secagg]") {
  Cluster c(3, 2, 10);
  const KeyPair& k = c.statics[0];
  auto make = [&](SecAggSetup s) { return ClientRound(kRound, std::move(s), k.secret_key.bytes, k.public_key); };
  SecAggSetup s = c.setup;
  s.threshold = 1;
  CHECK_THROWS_WITH(make(s), Contains("threshold 1 outside [2, 3]"));
  s.threshold = 4;
  CHECK_THROWS_WITH(make(s), Contains("threshold 4 outside [2, 3]"));
  s = c.setup;
  s.range = 0;
  CHECK_THROWS_WITH(make(s), Contains("range"));
  s = c.setup;
  s.frac_bits = 41;
  CHECK_THROWS_WITH(make(s), Contains("frac_bits 41 outside 1..40"));
  s = c.setup;
  s.clients[1].public_key = s.clients[2].public_key;
  CHECK_THROWS_WITH(make(s), Contains("have the same key"));
  s = c.setup;
  s.clients[0].public_key = z85_encode_key(make_key_pair().public_key);
  CHECK_THROWS_WITH(make(s), Contains("not in the round's roster"));
  CHECK_THROWS_WITH(ClientRound(kRound, c.setup, k.secret_key.bytes, c.statics[1].public_key),
                    Contains("does not belong"));
  s = c.setup;
  s.clients.resize(1);
  CHECK_THROWS_WITH(ServerRound(kRound, s), Contains("1 clients, not within [2, 255]"));
}

TEST_CASE("secagg round: the quantization and overflow bounds", "[runtime][secagg]") {
  CHECK(quantization_bound(24, 4, 200) == Approx(4 * 0.5 * std::ldexp(1.0, -24) / 200));
  // 1e6 x 1 x 2^24 is about 2^44: fits.
  CHECK(overflow_refusal(1, 24, 1e6).empty());
  // 1e9 x 10 x 2^40 is about 2^73: refused; 2 x 1e10 x 2^28 fits in 2^63, 2 x 1e10 x 2^29 does not.
  CHECK_THAT(overflow_refusal(10, 40, 1e9), Contains("lower frac_bits to 28 or below"));
  CHECK(overflow_refusal(10, 28, 1e9).empty());
  CHECK_FALSE(overflow_refusal(10, 29, 1e9).empty());
  CHECK_THAT(overflow_refusal(1e10, 1, 1e9), Contains("lower the range"));
}
