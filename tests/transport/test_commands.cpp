// test_commands.cpp: every job command and job spec round-trips with its typed
// fields; a bad field is refused on both sides (encode throws, decode rejects
// with a message naming it); a peer of another protocol version can be told so.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <zmq.hpp>

#include "transport/endpoint.h"
#include "transport/message.h"
#include "transport/schema/cleave_generated.h"

using namespace cleave::transport;
namespace fb = cleave::wire;

namespace {

const std::string kKey = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";

Result<Message> round_trip(const Message& m) { return decode_message(encode_header(m), m.payloads); }

// Encodes an envelope holding `command` without the sender's checks, as a
// hostile or buggy peer could: what the receiver must refuse on its own.
template <typename Make>
std::vector<std::byte> raw_command(Make make_body, uint16_t version = kProtocolVersion) {
  flatbuffers::FlatBufferBuilder b;
  auto [type, body] = make_body(b);
  auto cmd = fb::CreateCommand(b, type, body);
  auto env = fb::CreateEnvelope(b, version, 5, fb::Body::Command, cmd.Union());
  fb::FinishEnvelopeBuffer(b, env);
  const auto* p = reinterpret_cast<const std::byte*>(b.GetBufferPointer());
  return std::vector<std::byte>(p, p + b.GetSize());
}

std::string rejection(const std::vector<std::byte>& header) {
  auto r = decode_message(header, {});
  REQUIRE(!r.ok());
  return r.failure().message;
}

OptimizerSpec odd_optimizer() {
  OptimizerSpec o;
  o.kind = "sgd";
  o.lr = 0.25f;
  o.momentum = 0.9f;
  o.dampening = 0.1f;
  o.weight_decay = 0.01f;
  o.nesterov = true;
  o.schedule = "cosine";
  o.warmup_steps = 7;
  o.total_steps = 99;
  o.min_lr = 1e-5f;
  return o;
}

}  // namespace

TEST_CASE("every command round-trips with its fields", "[transport][commands]") {
  const std::vector<Command> commands = {
      ProfileCmd{"{\"layers\":[]}", 33, odd_optimizer()},
      ProfileCmd{"{\"layers\":[]}", 1, std::nullopt},
      ProfileCmd{"{\"layers\":[]}", 8, std::nullopt, /*split_backward=*/true},
      ProfileCmd{"{\"layers\":[]}", 4, std::nullopt, false, /*in_flight=*/8},
      ProbeServeCmd{"dev2", kKey},
      ProbePeerCmd{"dev3", kKey, "tcp://127.0.0.1:5555"},
      ProbeStopCmd{"dev2"},
      ConnectCmd{"tcp://127.0.0.1:6000"},
      ConnectCmd{""},
      StepCmd{123456789012, 64, 4000, 7},
      FinishCmd{},
      ShutdownCmd{},
      CheckpointCmd{StateKind::kParams},
      CheckpointCmd{StateKind::kParamsAndOptimizer},
      FedRoundCmd{4, 3, 16, 0.05f, std::nullopt},
      FedRoundCmd{5, 1, 8, 0, SecAggSetup{3, {{"", kKey, "a"}, {"", kKey, "b"}, {"", kKey, "c"}}, 8, 20, 1.5f, 0.25f, false}},
      SplitRoundCmd{SplitPhase::kTrain, 2, {0, 2, 1, 0}},
      SplitRoundCmd{SplitPhase::kEval, 0, {}},
      SplitRoundCmd{SplitPhase::kAverage, 9, {}},
      SplitRoundCmd{SplitPhase::kDrop, 1, {2}},
      SplitRoundCmd{SplitPhase::kRejoin, 2, {0, 2}},
  };
  std::set<size_t> kinds;
  for (const Command& c : commands) {
    INFO(command_name(c));
    auto r = round_trip(command_message(c, 77));
    REQUIRE(r.ok());
    CHECK(r->request_id == 77);
    CHECK(std::get<CommandMsg>(r->body).command == c);
    kinds.insert(c.index());
  }
  CHECK(kinds.size() == std::variant_size_v<Command>);  // every kind is covered
}

TEST_CASE("every job spec round-trips inside an assignment", "[transport][commands]") {
  SplitJob server;
  server.role = SplitRole::kServer;
  server.labels_on_client = true;
  server.seed = 99;
  server.batch = 8;
  server.eval_batch = 100;
  server.epochs = 3;
  server.clients = {{"", kKey, "c0"}, {"", kKey, "c1"}};
  SplitJob client;
  client.role = SplitRole::kClient;
  client.client_index = 5;
  client.limit_test = 200;
  client.cut_back = 4;
  client.activation_noise = 0.5f;
  client.activation_clip = 2.0f;
  const std::vector<JobSpec> jobs = {PipelineJob{1, 8, 42, 128, 0xfeedbeefcafe1234, 3},
                                     PipelineJob{0, 4, 9, 64, 5, 1, /*recompute=*/true},
                                     PipelineJob{},
                                     PipelineJob{2, 4, 1, 64, 9, 0},  // zb1
                                     FedJob{32, 7, "fedprox"},
                                     server,
                                     client};
  for (const JobSpec& job : jobs) {
    INFO(job_kind_name(job));
    AssignMsg a;
    a.stage = 0;
    a.num_stages = 1;
    a.layer_end = 3;
    a.model_spec_json = "{}";
    a.optimizer = odd_optimizer();
    a.job = job;
    Message m;
    m.body = a;
    auto r = round_trip(m);
    REQUIRE(r.ok());
    CHECK(std::get<AssignMsg>(r->body) == a);
  }
}

TEST_CASE("a bad command field is refused by the sender and the receiver", "[transport][commands]") {
  SECTION("the sender's own checks") {
    for (const Command& bad : std::vector<Command>{
             StepCmd{-1, 8}, StepCmd{0, 0}, FedRoundCmd{0, 0, 8, 0, std::nullopt}, FedRoundCmd{0, 1, 8, -1.0f, std::nullopt},
             FedRoundCmd{0, 1, 8, std::numeric_limits<float>::quiet_NaN(), std::nullopt}, ProfileCmd{"{}", 0, std::nullopt},
             ProfileCmd{"", 4, std::nullopt}, ProfileCmd{"{}", 4, std::nullopt, false, 0},
             ProfileCmd{"{}", 4, std::nullopt, false, 1025}, ProbePeerCmd{"x", "not-a-key", "tcp://a:1"}, ProbeStopCmd{""},
             SplitRoundCmd{SplitPhase::kTrain, 0, {1, -2}},
             // secure aggregation: threshold above the roster, below 2; no range; too many fractional bits
             FedRoundCmd{0, 1, 8, 0, SecAggSetup{3, {{"", kKey, "a"}, {"", kKey, "b"}}, 8, 20, 0, 0, true}},
             FedRoundCmd{0, 1, 8, 0, SecAggSetup{1, {{"", kKey, "a"}, {"", kKey, "b"}}, 8, 20, 0, 0, true}},
             FedRoundCmd{0, 1, 8, 0, SecAggSetup{2, {{"", kKey, "a"}, {"", kKey, "b"}}, 0, 20, 0, 0, true}},
             FedRoundCmd{0, 1, 8, 0, SecAggSetup{2, {{"", kKey, "a"}, {"", kKey, "b"}}, 8, 41, 0, 0, true}}}) {
      INFO(command_name(bad));
      CHECK_THROWS_AS(encode_header(command_message(bad)), std::invalid_argument);
    }
  }
  SECTION("a pipeline schedule past zb1 (2)") {
    AssignMsg a;
    a.num_stages = 1;
    a.layer_end = 1;
    a.model_spec_json = "{}";
    a.optimizer = odd_optimizer();
    a.job = PipelineJob{3, 4, 1, 64, 9, 0};
    Message m;
    m.body = a;
    CHECK_THROWS_WITH(encode_header(m), Catch::Contains("unknown schedule 3"));
  }
  SECTION("a crafted negative step") {
    const auto h = raw_command([](auto& b) {
      return std::make_pair(fb::CommandBody::Step, fb::CreateStep(b, -5, 8).Union());
    });
    CHECK_THAT(rejection(h), Catch::Contains("negative step"));
  }
  SECTION("a crafted profile of no micro-batch in flight") {
    const auto h = raw_command([](auto& b) {
      return std::make_pair(fb::CommandBody::Profile, fb::CreateProfileDirect(b, "{}", 4, 0, false, 0).Union());
    });
    CHECK_THAT(rejection(h), Catch::Contains("in_flight must be in [1, 1024]"));
  }
  SECTION("a crafted zero batch") {
    const auto h = raw_command([](auto& b) {
      return std::make_pair(fb::CommandBody::FedRound, fb::CreateFedRound(b, 1, 1, 0, 0.f).Union());
    });
    CHECK_THAT(rejection(h), Catch::Contains("batch"));
  }
  SECTION("an unknown enum value") {
    const auto h = raw_command([](auto& b) {
      return std::make_pair(fb::CommandBody::Checkpoint,
                            fb::CreateCheckpoint(b, static_cast<fb::StateKind>(9)).Union());
    });
    CHECK_THAT(rejection(h), Catch::Contains("unknown state kind"));
  }
  SECTION("an unknown command kind") {
    const auto h = raw_command([](auto& b) {
      return std::make_pair(static_cast<fb::CommandBody>(60), fb::CreateEndJob(b).Union());
    });
    CHECK_THAT(rejection(h), Catch::Contains("unknown command kind"));
  }
  SECTION("a command without a kind") {
    const auto h = raw_command([](auto& b) {
      return std::make_pair(fb::CommandBody::NONE, flatbuffers::Offset<void>());
    });
    CHECK_THAT(rejection(h), Catch::Contains("command"));
  }
  SECTION("an assignment without a job") {
    flatbuffers::FlatBufferBuilder b;
    auto opt = fb::CreateOptimizerSpecDirect(b, "adam");
    auto a = fb::CreateAssignDirect(b, 0, 1, 0, 1, "{}", opt);
    auto env = fb::CreateEnvelope(b, kProtocolVersion, 1, fb::Body::Assign, a.Union());
    fb::FinishEnvelopeBuffer(b, env);
    const auto* p = reinterpret_cast<const std::byte*>(b.GetBufferPointer());
    CHECK_THAT(rejection({p, p + b.GetSize()}), Catch::Contains("no job"));
  }
}

TEST_CASE("a peer of another protocol version is told which versions differ", "[transport][commands]") {
  const auto old = raw_command([](auto& b) { return std::make_pair(fb::CommandBody::EndJob, fb::CreateEndJob(b).Union()); },
                               static_cast<uint16_t>(kProtocolVersion - 1));
  CHECK(envelope_version(old) == kProtocolVersion - 1);
  CHECK_THAT(rejection(old), Catch::Contains("unsupported protocol version"));
  CHECK(!envelope_version(std::vector<std::byte>(16, std::byte{0x41})).has_value());
  CHECK(!envelope_version({}).has_value());

  // The reply is an Error envelope of the peer's own version: Error keeps its
  // place in the union and its fields, so the old peer can read it.
  const auto reply = encode_version_error(kProtocolVersion - 1, "speaks 2, you speak 1");
  CHECK(envelope_version(reply) == kProtocolVersion - 1);
  std::vector<uint64_t> aligned((reply.size() + 7) / 8);
  std::memcpy(aligned.data(), reply.data(), reply.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(aligned.data());
  flatbuffers::Verifier v(bytes, reply.size());
  REQUIRE(fb::VerifyEnvelopeBuffer(v));
  const auto* env = fb::GetEnvelope(bytes);
  REQUIRE(env->body_type() == fb::Body::Error);
  CHECK(static_cast<int>(fb::Body::Error) == 8);
  CHECK(env->body_as_Error()->code() == fb::ErrorCode::UnsupportedVersion);
  CHECK(env->body_as_Error()->message()->str() == "speaks 2, you speak 1");
}

TEST_CASE("a daemon of another protocol version is refused at registration, naming both versions",
          "[transport][commands]") {
  ServerOptions so;
  so.bind = "tcp://127.0.0.1:*";
  so.insecure = true;
  so.label = "test coordinator";
  ServerEndpoint server(so);
  zmq::context_t zctx;
  zmq::socket_t dealer(zctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(server.endpoint());

  // What a daemon of the previous version sends first.
  const uint16_t old_version = kProtocolVersion - 1;
  flatbuffers::FlatBufferBuilder b;
  auto reg = fb::CreateRegisterDirect(b, "old-board");
  auto env = fb::CreateEnvelope(b, old_version, 1, fb::Body::Register, reg.Union());
  fb::FinishEnvelopeBuffer(b, env);
  REQUIRE(dealer.send(zmq::buffer(b.GetBufferPointer(), b.GetSize()), zmq::send_flags::none));

  auto r = server.receive(std::chrono::milliseconds(3000));
  REQUIRE(!r.ok());
  CHECK_THAT(r.failure().message, Catch::Contains("unsupported protocol version"));

  zmq::message_t reply;
  dealer.set(zmq::sockopt::rcvtimeo, 3000);
  REQUIRE(dealer.recv(reply, zmq::recv_flags::none));
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(reply.data()), reply.size());
  REQUIRE(envelope_version(bytes) == old_version);  // readable by the old daemon
  std::vector<uint64_t> aligned((reply.size() + 7) / 8);
  std::memcpy(aligned.data(), reply.data(), reply.size());
  const auto* e = fb::GetEnvelope(aligned.data())->body_as_Error();
  REQUIRE(e != nullptr);
  CHECK(e->code() == fb::ErrorCode::UnsupportedVersion);
  const std::string text = e->message()->str();
  CHECK_THAT(text, Catch::Contains("version " + std::to_string(kProtocolVersion)));
  CHECK_THAT(text, Catch::Contains("version " + std::to_string(old_version)));
}
