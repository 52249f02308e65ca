// test_message.cpp: every message kind round-trips; malformed headers and
// payloads are rejected with a clear message and nothing crashes.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "transport/message.h"
#include "transport/schema/cleave_generated.h"

using namespace cleave::transport;

namespace {

const std::string kKey = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";

Result<Message> round_trip(const Message& m, const DecodeLimits& limits = {}) {
  const auto header = encode_header(m);
  return decode_message(header, m.payloads, limits);
}

Message with_body(Body body) {
  Message m;
  m.request_id = 42;
  m.body = std::move(body);
  return m;
}

Message sample_tensor(Encoding e = Encoding::kF32) {
  TensorMsg t;
  t.kind = TensorKind::kActivation;
  t.step = 5;
  t.micro_batch = 2;
  t.shape = {2, 3, 4};
  t.encoding = e;
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f - 3.0f;
  return make_tensor_message(t, std::make_shared<const std::vector<float>>(v));
}

}  // namespace

TEST_CASE("every message kind round-trips", "[transport][message]") {
  RegisterMsg reg{"jetson", {"cpu", "cuda:0"}, 8ull << 30, 6ull << 30, 410.5, "tcp://1.2.3.4:5",
                  kKey, "0.1.0", "{\"cores\":6}"};
  AssignMsg as;
  as.stage = 1;
  as.num_stages = 2;
  as.layer_begin = 3;
  as.layer_end = 7;
  as.model_spec_json = "{\"layers\":[1,2]}";
  as.optimizer.kind = "sgd";
  as.optimizer.lr = 0.1f;
  as.job = PipelineJob{1, 4, 7, 32};
  as.prev = PeerInfo{"tcp://a:1", kKey, "a"};
  as.link_encoding = Encoding::kInt8;
  const std::vector<Body> bodies = {
      reg, as, HeartbeatMsg{9, 1234}, CommandMsg{ShutdownCmd{}},
      AckMsg{7, "done"}, ErrorMsg{ErrorCode::kNotAssigned, "no stage", 3},
      MetricsMsg{1, 100, 42.5, 60, 64, 3.5, 0, 0, SplitPhase::kEval, 2, 0xabcdef0123, 5}};
  for (const Body& b : bodies) {
    INFO(body_kind_name(b));
    auto r = round_trip(with_body(b));
    REQUIRE(r.ok());
    CHECK(r->request_id == 42);
    CHECK(r->body == b);
    CHECK(r->payloads.empty());
  }
  // Absent neighbours stay absent.
  auto a = round_trip(with_body(as));
  CHECK(!std::get<AssignMsg>(a->body).next.has_value());

  for (Encoding e : {Encoding::kF32, Encoding::kF16, Encoding::kInt8}) {
    INFO(encoding_name(e));
    const Message m = sample_tensor(e);
    auto r = round_trip(m);
    REQUIRE(r.ok());
    const auto& t = std::get<TensorMsg>(r->body);
    CHECK(t == std::get<TensorMsg>(m.body));
    CHECK(r->payloads[0].size() == 24 * encoded_element_size(e));
    auto values = tensor_values(*r);
    REQUIRE(values.size() == 24);
    const float tol = e == Encoding::kF32 ? 0.0f : e == Encoding::kF16 ? 3e-3f : 3.0f / 127.0f;
    for (size_t i = 0; i < 24; ++i)
      CHECK(std::fabs(values[i] - (static_cast<float>(i) * 0.25f - 3.0f)) <= tol);
  }
  std::vector<float> w = {1, 2, 3, 4, 5};
  auto weights = round_trip(make_weights_message(WeightsMsg{2, 7, 640, 0}, w.data(), w.size(), nullptr));
  REQUIRE(weights.ok());
  CHECK(std::get<WeightsMsg>(weights->body) == WeightsMsg{2, 7, 640, 5});
  CHECK(weights_values(*weights) == w);
  auto probe = round_trip(make_probe_message(3, 1000, true));
  REQUIRE(probe.ok());
  CHECK(std::get<ProbeMsg>(probe->body) == ProbeMsg{3, 1000, true});
}

TEST_CASE("secure-aggregation messages round-trip and bad ones are refused", "[transport][message][secagg]") {
  SecAggMsg keys;
  keys.round = 3;
  keys.phase = SecAggPhase::kKeys;
  keys.items = {{2, std::vector<uint8_t>(32, 7), std::vector<uint8_t>(32, 9), std::vector<uint8_t>(96, 1)}};
  SecAggMsg unmask;
  unmask.round = 3;
  unmask.phase = SecAggPhase::kUnmask;
  unmask.survivors = {1, 3};
  unmask.dropped = {2};
  for (const SecAggMsg& s : {keys, unmask}) {
    INFO(secagg_phase_name(s.phase));
    auto r = round_trip(with_body(s));
    REQUIRE(r.ok());
    CHECK(std::get<SecAggMsg>(r->body) == s);
  }
  const std::vector<uint64_t> values = {0, 1, ~0ull, 0x0123456789abcdefull};
  auto masked = round_trip(make_secagg_masked_message(3, 600, values));
  REQUIRE(masked.ok());
  CHECK(std::get<SecAggMsg>(masked->body).sample_count == 600);
  CHECK(secagg_masked_values(*masked) == values);

  SECTION("a masked update whose frame is not num_elements x 8 bytes") {
    Message m = make_secagg_masked_message(3, 600, values);
    std::get<SecAggMsg>(m.body).num_elements = 5;
    const auto header = encode_header(make_secagg_masked_message(3, 600, {1, 2, 3, 4, 5}));
    auto r = decode_message(header, m.payloads);
    REQUIRE(!r.ok());
    CHECK(r.failure().message.find("secagg") != std::string::npos);
  }
  SECTION("a client index outside the roster's range is refused by the sender") {
    SecAggMsg bad = keys;
    bad.items[0].index = 0;
    CHECK_THROWS_AS(encode_header(with_body(bad)), std::invalid_argument);
    bad.items[0].index = 256;
    CHECK_THROWS_AS(encode_header(with_body(bad)), std::invalid_argument);
    SecAggMsg bad_set = unmask;
    bad_set.dropped = {-1};
    CHECK_THROWS_AS(encode_header(with_body(bad_set)), std::invalid_argument);
  }
}

TEST_CASE("f32 tensor payloads are not copied by the sender", "[transport][message]") {
  auto values = std::make_shared<const std::vector<float>>(std::vector<float>(6, 1.0f));
  TensorMsg t;
  t.shape = {2, 3};
  Message m = make_tensor_message(t, values);
  CHECK(static_cast<const void*>(m.payloads[0].data()) == static_cast<const void*>(values->data()));
  CHECK(values.use_count() == 2);  // the message shares ownership
}

TEST_CASE("malformed messages are rejected with a clear error", "[transport][message]") {
  const Message good = sample_tensor();
  const auto header = encode_header(good);

  SECTION("truncated header") {
    for (size_t n : {size_t{0}, size_t{4}, header.size() / 2, header.size() - 1}) {
      auto r = decode_message(std::span(header).first(n), good.payloads);
      REQUIRE(r.is(FailureKind::kRejected));
      CHECK(!r.failure().message.empty());
    }
  }
  SECTION("bit flips never crash and most are caught") {
    int rejected = 0, total = 0;
    for (size_t i = 0; i < header.size(); ++i)
      for (int bit = 0; bit < 8; ++bit) {
        auto h = header;
        h[i] ^= static_cast<std::byte>(1 << bit);
        auto r = decode_message(h, good.payloads);
        ++total;
        if (!r) {
          ++rejected;
          CHECK(!r.failure().message.empty());
        } else {
          // An accepted flip must still describe a consistent message.
          CHECK(validate_message(*r).empty());
        }
      }
    CHECK(rejected > total / 4);
  }
  SECTION("shape does not match the payload") {
    std::vector<std::byte> short_payload(good.payloads[0].size() - 4);
    std::vector<Payload> p = {Payload::copy_of(short_payload)};
    auto r = decode_message(header, p);
    REQUIRE(r.is(FailureKind::kRejected));
    CHECK_THAT(r.failure().message, Catch::Contains("payload frame is 92 bytes but the header implies 96"));
  }
  SECTION("missing or extra payload frames") {
    auto r = decode_message(header, {});
    REQUIRE(r.is(FailureKind::kRejected));
    CHECK_THAT(r.failure().message, Catch::Contains("1 payload frame(s) but 0 arrived"));
    std::vector<Payload> two = {good.payloads[0], good.payloads[0]};
    CHECK(decode_message(header, two).is(FailureKind::kRejected));
  }
  SECTION("oversized payload and header") {
    DecodeLimits small;
    small.max_payload_bytes = 64;
    auto r = decode_message(header, good.payloads, small);
    REQUIRE(r.is(FailureKind::kRejected));
    CHECK_THAT(r.failure().message, Catch::Contains("exceeds the limit 64"));
    small = {};
    small.max_header_bytes = 16;
    CHECK_THAT(decode_message(header, good.payloads, small).failure().message,
               Catch::Contains("header frame of"));
  }
  SECTION("not a cleave envelope") {
    std::vector<std::byte> junk(64, std::byte{0x41});
    auto r = decode_message(junk, {});
    REQUIRE(r.is(FailureKind::kRejected));
    CHECK_THAT(r.failure().message, Catch::Contains("not a cleave envelope"));
  }
}

namespace {

// Builds a header by hand (bypassing encode_header's checks).
std::vector<std::byte> raw_tensor_header(uint16_t version, std::vector<int64_t> shape, int64_t step,
                                         int8_t encoding = 0, float scale = 0.0f) {
  namespace fb = cleave::wire;
  flatbuffers::FlatBufferBuilder b;
  auto t = fb::CreateTensorDirect(b, fb::TensorKind::Activation, step, 0, &shape, fb::DType::Float32,
                                  static_cast<fb::Encoding>(encoding), scale);
  auto env = fb::CreateEnvelope(b, version, 1, fb::Body::Tensor, t.Union());
  fb::FinishEnvelopeBuffer(b, env);
  const auto* p = reinterpret_cast<const std::byte*>(b.GetBufferPointer());
  return {p, p + b.GetSize()};
}

}  // namespace

TEST_CASE("semantic checks name what is wrong", "[transport][message]") {
  std::vector<Payload> p16 = {Payload::copy_of(std::vector<std::byte>(16))};
  auto why = [&](std::vector<std::byte> h, std::vector<Payload> p) {
    auto r = decode_message(h, p);
    REQUIRE(r.is(FailureKind::kRejected));
    return r.failure().message;
  };
  CHECK(decode_message(raw_tensor_header(kProtocolVersion, {2, 2}, 0), p16).ok());
  CHECK_THAT(why(raw_tensor_header(99, {2, 2}, 0), p16), Catch::Contains("unsupported protocol version 99"));
  CHECK_THAT(why(raw_tensor_header(kProtocolVersion, {2, 2}, -1), p16), Catch::Contains("negative step"));
  CHECK_THAT(why(raw_tensor_header(kProtocolVersion, {2, -2}, 0), p16), Catch::Contains("negative"));
  CHECK_THAT(why(raw_tensor_header(kProtocolVersion, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 0), p16),
             Catch::Contains("rank 9 exceeds 8"));
  // Element count overflow (2^62 * 2^62) is caught before any multiplication wraps.
  CHECK_THAT(why(raw_tensor_header(kProtocolVersion, {int64_t{1} << 62, int64_t{1} << 62}, 0), p16),
             Catch::Contains("more elements than the payload limit"));
  CHECK_THAT(why(raw_tensor_header(kProtocolVersion, {2, 2}, 0, 7), p16), Catch::Contains("unknown encoding"));
  std::vector<Payload> p4 = {Payload::copy_of(std::vector<std::byte>(4))};
  CHECK_THAT(why(raw_tensor_header(kProtocolVersion, {2, 2}, 0, 2, -1.0f), p4),
             Catch::Contains("int8 scale"));
  // encode_header refuses to produce what decode_message would reject.
  Message bad = sample_tensor();
  std::get<TensorMsg>(bad.body).shape = {5, 5};
  CHECK_THROWS_WITH(encode_header(bad), Catch::Contains("header implies 100"));
  CHECK_THROWS_AS(encode_header(with_body(AssignMsg{3, 2, 0, 1, "", {}, {}, {}, {}, Encoding::kF32})),
                  std::invalid_argument);
  CHECK_THROWS_AS(encode_header(with_body(RegisterMsg{"x", {}, 1, 2, 0, "", "", "", ""})),
                  std::invalid_argument);
  CHECK_THROWS_WITH(encode_header(with_body(RegisterMsg{"x", {}, 2, 1, 0, "", "not-a-key", "", ""})),
                    Catch::Contains("Z85"));
}
