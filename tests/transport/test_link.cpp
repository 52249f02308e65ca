// test_link.cpp: TensorLinks in both homes (in-process, ZeroMQ + CURVE),
// per-link encodings, the bandwidth throttle and parse_bandwidth.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <thread>

#include "transport/link.h"

using namespace cleave::transport;
using namespace std::chrono_literals;

namespace {

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::cos(static_cast<float>(i) * 0.37f) * 4.0f;
  return v;
}

float max_err(const std::vector<float>& a, std::span<const float> b) {
  float e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
  return e;
}

// Exercise one pair of link ends: activation forward, gradient back.
void exchange(TensorLink& down, TensorLink& up, Encoding e) {
  const auto v = ramp(512);
  REQUIRE(down.send(TensorMessage::from_vector(TensorKind::kActivation, 7, 3, {4, 128}, v)).ok());
  auto act = up.receive(3000ms);
  REQUIRE(act.ok());
  CHECK(act->kind == TensorKind::kActivation);
  CHECK(act->step == 7);
  CHECK(act->micro_batch == 3);
  CHECK(act->shape == std::vector<int64_t>{4, 128});
  REQUIRE(act->count == v.size());
  const float bound = e == Encoding::kF32 ? 0.0f : e == Encoding::kF16 ? 4.0f / 2048 : 4.0f / 254 * 1.001f;
  CHECK(max_err(v, act->values()) <= bound);
  REQUIRE(up.send(TensorMessage::from_vector(TensorKind::kGradient, 7, 3, {4, 128}, v)).ok());
  auto grad = down.receive(3000ms);
  REQUIRE(grad.ok());
  CHECK(grad->kind == TensorKind::kGradient);
  CHECK(max_err(v, grad->values()) <= bound);
  CHECK(down.stats().payload_bytes_sent == v.size() * encoded_element_size(e));
  CHECK(up.receive(50ms).is(FailureKind::kTimeout));
}

// The two ends of a stage link: stage 1 serves, admitting stage 0's key; stage 0 dials.
struct StageKeys {
  KeyPair stage0 = generate_keypair(), stage1 = generate_keypair();

  ServerOptions server() const {
    ServerOptions so;
    so.keys = stage1;
    so.allow.add("stage0", stage0.public_key);
    so.label = "stage1";
    return so;
  }
  ClientOptions client(const ServerEndpoint& s) const {
    ClientOptions co;
    co.connect = s.endpoint();
    co.keys = stage0;
    co.server_public_key = stage1.public_key;
    co.label = "stage0";
    return co;
  }
};

}  // namespace

TEST_CASE("in-process links carry tensors in every encoding", "[transport][link]") {
  for (Encoding e : {Encoding::kF32, Encoding::kF16, Encoding::kInt8}) {
    INFO(encoding_name(e));
    auto [a, b] = make_in_process_link_pair(e);
    exchange(*a, *b, e);
  }
  // f32 with an owner is zero-copy in process.
  auto [a, b] = make_in_process_link_pair();
  auto msg = TensorMessage::from_vector(TensorKind::kInput, 0, 0, {2}, {1.0f, 2.0f});
  REQUIRE(a->send(msg).ok());
  auto r = b->receive(100ms);
  REQUIRE(r.ok());
  CHECK(r->data == msg.data);
  CHECK_THROWS_AS(a->send(TensorMessage::borrow(TensorKind::kInput, 0, 0, {3}, msg.data, 2, msg.owner)),
                  std::invalid_argument);
  a.reset();
  CHECK(b->receive(100ms).is(FailureKind::kClosed));
}

TEST_CASE("ZeroMQ + CURVE links between two stages", "[transport][link]") {
  const StageKeys keys;
  for (Encoding e : {Encoding::kF32, Encoding::kF16, Encoding::kInt8}) {
    INFO(encoding_name(e));
    ServerEndpoint peer_server(keys.server());
    auto down = dial_tensor_link(keys.client(peer_server), e);
    auto up = serve_tensor_link(peer_server, "stage0", e);
    exchange(*down, *up, e);
    CHECK(down->describe().find(encoding_name(e)) != std::string::npos);
  }
}

// A link pump reads with a zero timeout and then sleeps on the socket's
// descriptor, which does not signal again for a message ZeroMQ already holds:
// the dialler's hello must not hide the tensor queued behind it.
TEST_CASE("a zero-timeout receive skips the dialler's hello to the tensor queued behind it", "[transport][link]") {
  const StageKeys keys;
  ServerEndpoint peer_server(keys.server());
  auto down = dial_tensor_link(keys.client(peer_server), Encoding::kF32);  // says hello
  auto up = serve_tensor_link(peer_server, "stage0", Encoding::kF32);
  REQUIRE(down->send(TensorMessage::from_vector(TensorKind::kActivation, 0, 0, {2}, {1.0f, 2.0f})).ok());
  std::this_thread::sleep_for(500ms);  // both are in the server's queue now
  auto got = up->receive(0ms);
  REQUIRE(got.ok());
  CHECK(got->kind == TensorKind::kActivation);
  CHECK(up->receive(0ms).is(FailureKind::kTimeout));  // and nothing else is
}

TEST_CASE("the throttle holds a link to its bandwidth", "[transport][link]") {
  auto [a, b] = make_in_process_link_pair();
  const double rate = 2e6;  // 2 MB/s
  auto slow = throttle_link(std::move(a), rate);
  const auto v = std::vector<float>(25000, 1.0f);  // 100 kB per message
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 6; ++i)
    REQUIRE(slow->send(TensorMessage::from_vector(TensorKind::kActivation, 0, i, {25000}, v)).ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // 600 kB at 2 MB/s: at least ~0.25 s once the first message's burst is spent.
  CHECK(seconds >= 0.24);
  for (int i = 0; i < 6; ++i) REQUIRE(b->receive(1000ms).ok());
  CHECK_THROWS_AS(throttle_link(nullptr, 1.0), std::invalid_argument);
  auto [c, d] = make_in_process_link_pair();
  CHECK_THROWS_AS(throttle_link(std::move(c), 0.0), std::invalid_argument);
}

TEST_CASE("parse_bandwidth", "[transport][link]") {
  CHECK(parse_bandwidth("100mbit") == Approx(12.5e6));
  CHECK(parse_bandwidth("1gbit") == Approx(125e6));
  CHECK(parse_bandwidth("1.5Gbit/s") == Approx(187.5e6));
  CHECK(parse_bandwidth("10MB/s") == Approx(10e6));
  CHECK(parse_bandwidth("512KiB/s") == Approx(512.0 * 1024));
  CHECK(parse_bandwidth("800kbps") == Approx(100e3));
  CHECK(parse_bandwidth("12500000") == Approx(12.5e6));
  CHECK(parse_bandwidth("10 MB/s") == Approx(10e6));
  CHECK_THROWS_WITH(parse_bandwidth("fast"), Catch::Contains("'fast'"));
  CHECK_THROWS_WITH(parse_bandwidth("10parsecs"), Catch::Contains("unknown"));
  CHECK_THROWS_AS(parse_bandwidth("0mbit"), std::invalid_argument);
  CHECK_THROWS_AS(parse_bandwidth("1.2.3mbit"), std::invalid_argument);
}

TEST_CASE("labels travel as f32 on every link encoding", "[transport][link]") {
  // Class indices through int8 (scale 9/127) would come back as 0.992, 2.05, ...
  const std::vector<float> labels = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 7};
  const KeyPair s0 = generate_keypair(), s1 = generate_keypair();
  for (Encoding e : {Encoding::kF16, Encoding::kInt8}) {
    INFO(encoding_name(e));
    auto [a, b] = make_in_process_link_pair(e);
    REQUIRE(a->send(TensorMessage::from_vector(TensorKind::kLabels, 1, 0, {12}, labels)).ok());
    auto got = b->receive(1000ms);
    REQUIRE(got.ok());
    CHECK(got->to_vector() == labels);
    CHECK(a->wire_bytes(*got) == labels.size() * 4);
    CHECK(b->stats().payload_bytes_received == labels.size() * 4);
    // Over ZeroMQ + CURVE too.
    ServerOptions so;
    so.keys = s1;
    so.allow.add("s0", s0.public_key);
    so.label = "s1";
    ServerEndpoint server(so);
    ClientOptions co;
    co.connect = server.endpoint();
    co.keys = s0;
    co.server_public_key = s1.public_key;
    co.label = "s0";
    auto down = dial_tensor_link(co, e);
    auto up = serve_tensor_link(server, "s0", e);
    REQUIRE(down->send(TensorMessage::from_vector(TensorKind::kLabels, 1, 0, {12}, labels)).ok());
    auto zgot = up->receive(3000ms);
    REQUIRE(zgot.ok());
    CHECK(zgot->to_vector() == labels);
    CHECK(down->stats().payload_bytes_sent == labels.size() * 4);
    CHECK(up->stats().payload_bytes_received == labels.size() * 4);
  }
}
