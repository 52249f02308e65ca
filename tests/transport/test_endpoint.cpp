// test_endpoint.cpp: the security spec (refused clients never reach the
// application while an allowed one is served), validation over the wire, peer
// identity, replies, and disconnect detection. 127.0.0.1 and ephemeral ports only.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "transport/endpoint.h"
#include "transport/log.h"
#include "transport/schema/cleave_generated.h"
#include "transport/wakeup.h"
#include "log_capture.h"

using namespace cleave::transport;
using namespace std::chrono_literals;
using cleave::testing::LogCapture;

namespace {


struct Keys {
  KeyPair server = generate_keypair();
  KeyPair good = generate_keypair();
  KeyPair intruder = generate_keypair();
};

SocketTuning small_limits() {
  SocketTuning t;
  t.limits.max_header_bytes = 64 << 10;
  t.limits.max_payload_bytes = 1 << 20;  // ZMQ_MAXMSGSIZE = 2 MiB
  t.heartbeat_interval_ms = 200;
  t.heartbeat_timeout_ms = 1000;
  t.handshake_timeout_ms = 1000;
  t.send_timeout_ms = 2000;
  t.linger_ms = 0;
  return t;
}

ServerOptions server_options(const Keys& k) {
  ServerOptions o;
  o.keys = k.server;
  o.allow.add("good", k.good.public_key);
  o.tuning = small_limits();
  o.label = "test-server";
  return o;
}

ClientOptions client_options(const ServerEndpoint& s, const KeyPair& keys) {
  ClientOptions o;
  o.connect = s.endpoint();
  o.keys = keys;
  o.server_public_key = s.public_key();
  o.tuning = small_limits();
  return o;
}

Message heartbeat(uint64_t seq) {
  Message m;
  m.request_id = seq;
  m.body = HeartbeatMsg{seq, 0};
  return m;
}

int port_of(const std::string& endpoint) { return std::stoi(endpoint.substr(endpoint.rfind(':') + 1)); }

// Waits up to `limit` for `pred`, returning whether it became true.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

std::vector<std::byte> tensor_header(uint16_t version, std::vector<int64_t> shape) {
  namespace fb = cleave::wire;
  flatbuffers::FlatBufferBuilder b;
  auto t = fb::CreateTensorDirect(b, fb::TensorKind::Activation, 1, 0, &shape);
  fb::FinishEnvelopeBuffer(b, fb::CreateEnvelope(b, version, 1, fb::Body::Tensor, t.Union()));
  const auto* p = reinterpret_cast<const std::byte*>(b.GetBufferPointer());
  return {p, p + b.GetSize()};
}

// Context switches (voluntary and not) of each thread of this process, by thread id.
std::map<std::string, long> switches_by_thread() {
  std::map<std::string, long> out;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(t.path() / "status");
    long n = 0;
    for (std::string line; std::getline(in, line);)
      if (line.starts_with("voluntary_ctxt_switches:") || line.starts_with("nonvoluntary_ctxt_switches:"))
        n += std::stol(line.substr(line.find(':') + 1));
    out[t.path().filename().string()] = n;
  }
  return out;
}

// A client refused by `server` (it pinned another server key), its socket
// closed for a back-off of `backoff_ms`.
std::unique_ptr<ClientEndpoint> refused_client(ServerEndpoint& server, const Keys& k, int backoff_ms) {
  ClientOptions o = client_options(server, k.good);
  o.server_public_key = generate_keypair().public_key;
  o.auth_backoff_initial_ms = backoff_ms;
  auto client = std::make_unique<ClientEndpoint>(o);
  const auto t0 = std::chrono::steady_clock::now();
  while (client->failed_handshakes() == 0 && std::chrono::steady_clock::now() - t0 < 10000ms)
    (void)client->receive(100ms);
  REQUIRE(client->failed_handshakes() == 1);
  (void)client->receive(0ms);        // it closes the socket when it next looks
  REQUIRE(client->poll_fd() == -1);  // closed for the back-off
  return client;
}

}  // namespace

TEST_CASE("unknown key, no-CURVE client and raw TCP junk are refused while an allowed client is served",
          "[transport][security]") {
  LogCapture logs;
  Keys k;
  ServerEndpoint server(server_options(k));
  REQUIRE(server.endpoint().rfind("tcp://127.0.0.1:", 0) == 0);

  ClientEndpoint good(client_options(server, k.good));
  ClientEndpoint intruder(client_options(server, k.intruder));  // valid CURVE, unknown key
  ClientOptions plain = client_options(server, k.good);
  plain.insecure = true;  // no CURVE at all
  ClientEndpoint no_curve(plain);
  // Raw TCP socket writing junk.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_of(server.endpoint())));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  std::string junk(4096, '\0');
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 7919) & 0xff);
  junk[0] = static_cast<char>(0xff);  // looks like a ZMTP greeting start, then garbage
  REQUIRE(::write(fd, junk.data(), junk.size()) > 0);

  // Whether a refused client's send is even queued depends on how soon its
  // handshake failed (a socket with no connected peer refuses to queue; under
  // qemu the refusal often comes first): either way none of it may arrive.
  for (uint64_t i = 0; i < 10; ++i) {
    (void)intruder.send(heartbeat(1000 + i));
    (void)no_curve.send(heartbeat(2000 + i));
    REQUIRE(good.send(heartbeat(i)).ok());
  }
  // The application sees exactly the allowed client's 10 messages, in order.
  for (uint64_t i = 0; i < 10; ++i) {
    auto r = server.receive(3000ms);
    REQUIRE(r.ok());
    CHECK(r->peer == "good");
    CHECK(std::get<HeartbeatMsg>(r->message.body).sequence == i);
  }
  CHECK(server.receive(300ms).is(FailureKind::kTimeout));
  // Refusals are counted and logged.
  CHECK(eventually([&] { return server.stats().zap_denied >= 1; }));
  CHECK(eventually([&] { return server.stats().handshakes_failed >= 2; }));
  CHECK(logs.contains("is not on the allow-list"));
  CHECK(logs.contains("refused a connection"));
  CHECK(!intruder.connected());
  CHECK(!no_curve.connected());
  CHECK(good.connected());
  // Still serving after the refusals.
  REQUIRE(good.send(heartbeat(99)).ok());
  auto last = server.receive(3000ms);
  REQUIRE(last.ok());
  CHECK(std::get<HeartbeatMsg>(last->message.body).sequence == 99);
  CHECK(server.stats().messages_received == 11);
  CHECK(server.stats().messages_rejected == 0);
  ::close(fd);
}

TEST_CASE("a client pinned to the wrong server key never connects", "[transport][security]") {
  LogCapture logs;
  Keys k;
  ServerEndpoint server(server_options(k));
  ClientOptions o = client_options(server, k.good);
  o.server_public_key = generate_keypair().public_key;  // impostor's key
  ClientEndpoint client(o);
  // The send is queued, or refused as unreachable when the handshake has
  // already failed (then the socket is closed for the back-off): a race with
  // the server's refusal. Either way nothing arrives.
  const Status sent = client.send(heartbeat(1));
  INFO((sent.ok() ? std::string("queued") : sent.failure().message));
  CHECK((sent.ok() || sent.is(FailureKind::kUnreachable)));
  CHECK(server.receive(500ms).is(FailureKind::kTimeout));
  CHECK(!client.connected());
}

TEST_CASE("truncated, bit-flipped, oversized, wrong-version and shape-mismatched messages are rejected",
          "[transport][validation]") {
  LogCapture logs;
  Keys k;
  ServerEndpoint server(server_options(k));
  // A raw authenticated DEALER, so the test can write arbitrary frames.
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::curve_serverkey, server.public_key());
  raw.set(zmq::sockopt::curve_publickey, k.good.public_key);
  raw.set(zmq::sockopt::curve_secretkey, k.good.secret_key);
  raw.set(zmq::sockopt::reconnect_ivl, 50);
  raw.connect(server.endpoint());

  const auto good_header = tensor_header(kProtocolVersion, {4, 4});
  const std::vector<std::byte> good_payload(64);
  auto send_frames = [&](std::vector<std::vector<std::byte>> frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      raw.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  };
  auto expect_rejected = [&](const std::string& needle) {
    auto r = server.receive(3000ms);
    REQUIRE(r.is(FailureKind::kRejected));
    CHECK(r.failure().peer == "good");
    CHECK_THAT(r.failure().message, Catch::Contains(needle));
  };
  auto expect_valid = [&] {
    auto r = server.receive(3000ms);
    REQUIRE(r.ok());
    CHECK(r->peer == "good");
    CHECK(std::get<TensorMsg>(r->message.body).shape == std::vector<int64_t>{4, 4});
  };

  send_frames({good_header, good_payload});
  expect_valid();
  // Truncated header.
  send_frames({std::vector<std::byte>(good_header.begin(), good_header.begin() + good_header.size() / 2),
               good_payload});
  expect_rejected("");
  // Bit flip in the file identifier.
  auto flipped = good_header;
  flipped[5] ^= std::byte{0x10};
  send_frames({flipped, good_payload});
  expect_rejected("not a cleave envelope");
  // Oversized: a 1.5 MiB payload frame against a 1 MiB limit.
  send_frames({tensor_header(kProtocolVersion, {3 << 17}), std::vector<std::byte>(3 << 19)});
  expect_rejected("exceeds the limit");
  // Wrong version.
  send_frames({tensor_header(kProtocolVersion + 1, {4, 4}), good_payload});
  expect_rejected("unsupported protocol version");
  // Shape x dtype != payload bytes.
  send_frames({tensor_header(kProtocolVersion, {4, 5}), good_payload});
  expect_rejected("payload frame is 64 bytes but the header implies 80");
  // Too many frames.
  send_frames({good_header, good_payload, good_payload, good_payload, good_payload, good_payload,
               good_payload, good_payload, good_payload});
  expect_rejected("frames (at most");
  send_frames({good_header, good_payload});
  expect_valid();
  const EndpointStats s = server.stats();
  CHECK(s.messages_rejected == 6);
  CHECK(s.messages_received == 2);
  CHECK(logs.contains("rejected message from good"));

  // Beyond ZMQ_MAXMSGSIZE (2x the limit) libzmq drops the connection; the
  // server keeps serving and the dealer reconnects.
  send_frames({tensor_header(kProtocolVersion, {1 << 20}), std::vector<std::byte>(4 << 20)});
  CHECK(server.receive(500ms).is(FailureKind::kTimeout));
  CHECK(eventually([&] { return server.stats().disconnects >= 1; }));
  bool served = false;
  for (int attempt = 0; attempt < 20 && !served; ++attempt) {
    send_frames({good_header, good_payload});
    auto r = server.receive(250ms);
    served = r.ok();
  }
  CHECK(served);
}

TEST_CASE("server and client exchange every kind and the server knows who sent what",
          "[transport][endpoint]") {
  Keys k;
  ServerOptions so = server_options(k);
  const KeyPair second = generate_keypair();
  so.allow.add("second", second.public_key);
  ServerEndpoint server(so);
  ClientEndpoint a(client_options(server, k.good));
  ClientEndpoint b(client_options(server, second));

  Message reg;
  reg.request_id = 1;
  reg.body = RegisterMsg{"device-a", {"cpu"}, 1000, 500, 3.5, "tcp://127.0.0.1:1", k.good.public_key, "0.1", ""};
  REQUIRE(a.send(reg).ok());
  Message reg_b = reg;
  std::get<RegisterMsg>(reg_b.body).device_name = "device-b";
  std::get<RegisterMsg>(reg_b.body).public_key = second.public_key;
  REQUIRE(b.send(reg_b).ok());
  std::map<std::string, std::string> seen;
  for (int i = 0; i < 2; ++i) {
    auto r = server.receive(3000ms);
    REQUIRE(r.ok());
    seen[r->peer] = std::get<RegisterMsg>(r->message.body).device_name;
  }
  CHECK(seen["good"] == "device-a");
  CHECK(seen["second"] == "device-b");

  // Replies are routed to the named peer only.
  AssignMsg as;
  as.stage = 0;
  as.num_stages = 2;
  as.layer_end = 3;
  as.next = PeerInfo{"tcp://127.0.0.1:2", second.public_key, "second"};
  Message assign;
  assign.request_id = 2;
  assign.body = as;
  REQUIRE(server.send("good", assign).ok());
  auto got = a.receive(3000ms);
  REQUIRE(got.ok());
  CHECK(std::get<AssignMsg>(got->body) == as);
  CHECK(b.receive(200ms).is(FailureKind::kTimeout));
  CHECK(server.send("nobody", assign).is(FailureKind::kUnreachable));

  // Tensors in every encoding, client -> server and back.
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<float>(i)) * 10.0f;
  auto shared = std::make_shared<const std::vector<float>>(values);
  for (Encoding e : {Encoding::kF32, Encoding::kF16, Encoding::kInt8}) {
    TensorMsg t;
    t.kind = TensorKind::kActivation;
    t.step = 4;
    t.shape = {10, 100};
    t.encoding = e;
    REQUIRE(a.send(make_tensor_message(t, shared)).ok());
    auto r = server.receive(3000ms);
    REQUIRE(r.ok());
    auto back = tensor_values(r->message);
    REQUIRE(back.size() == values.size());
    const float tol = e == Encoding::kF32 ? 0.0f : e == Encoding::kF16 ? 10.0f / 1024 : 10.0f / 254 * 1.001f;
    for (size_t i = 0; i < values.size(); ++i) REQUIRE(std::fabs(back[i] - values[i]) <= tol);
    t.kind = TensorKind::kGradient;
    REQUIRE(server.send("good", make_tensor_message(t, shared)).ok());
    auto g = a.receive(3000ms);
    REQUIRE(g.ok());
    CHECK(std::get<TensorMsg>(g->body).kind == TensorKind::kGradient);
  }
  // Weights, metrics, control, ack, error, probe.
  std::vector<float> w(300, 0.5f);
  REQUIRE(a.send(make_weights_message(WeightsMsg{0, 3, 64, 0}, w.data(), w.size(), nullptr)).ok());
  auto wr = server.receive(3000ms);
  REQUIRE(wr.ok());
  CHECK(weights_values(wr->message) == w);
  for (Body body : std::vector<Body>{MetricsMsg{0, 3, 1.5, 10, 16, 2.0, 0, 0, SplitPhase::kTrain, 0}, AckMsg{2, ""},
                                     ErrorMsg{ErrorCode::kInternal, "boom", 2}}) {
    Message m;
    m.body = body;
    REQUIRE(a.send(m).ok());
    auto r = server.receive(3000ms);
    REQUIRE(r.ok());
    CHECK(r->message.body == body);
  }
  const Message ctl = command_message(FinishCmd{});
  REQUIRE(server.send("second", ctl).ok());
  auto c = b.receive(3000ms);
  REQUIRE(c.ok());
  CHECK(std::holds_alternative<FinishCmd>(std::get<CommandMsg>(c->body).command));
  REQUIRE(a.send(make_probe_message(1, 4096, true)).ok());
  auto p = server.receive(3000ms);
  REQUIRE(p.ok());
  CHECK(p->message.payloads[0].size() == 4096);
}

TEST_CASE("a dead peer is noticed within seconds on both sides", "[transport][endpoint]") {
  Keys k;
  ServerEndpoint server(server_options(k));
  auto client = std::make_unique<ClientEndpoint>(client_options(server, k.good));
  REQUIRE(client->send(heartbeat(1)).ok());
  REQUIRE(server.receive(3000ms).ok());
  REQUIRE(client->wait_connected(3000ms));
  auto events = server.take_peer_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == PeerEvent::Kind::kConnected);
  CHECK(server.connected_peers() == std::vector<std::string>{"good"});
  CHECK(server.since_last_seen("good").has_value());
  client.reset();
  bool gone = eventually([&] {
    for (const auto& e : server.take_peer_events())
      if (e.kind == PeerEvent::Kind::kDisconnected && e.peer == "good") return true;
    return false;
  });
  CHECK(gone);
  CHECK(server.connected_peers().empty());
  // The disconnect is seen on the connection's descriptor; ZeroMQ's ROUTER
  // retires the peer's pipe a moment later (its I/O thread and the socket
  // hand the pipe's end back and forth), and a send in between is accepted
  // and dropped. Within seconds every send says the peer is unreachable.
  CHECK(eventually([&] { return server.send("good", heartbeat(2)).is(FailureKind::kUnreachable); }));

  // Client side: the server goes away.
  auto server2 = std::make_unique<ServerEndpoint>(server_options(k));
  ClientEndpoint c2(client_options(*server2, k.good));
  REQUIRE(c2.wait_connected(3000ms));
  server2.reset();
  CHECK(eventually([&] { return !c2.connected(); }));
  CHECK(c2.stats().disconnects >= 1);
}

// libzmq gives a new connection the lowest free fd, which is often the one a
// connection just closed had; its close reaches the server's thread later, on
// the monitor. Here it arrives while the server is in a receive that then
// returns the new connection's first message (the coordinator of
// test_hostile_links saw a daemon's registration undone that way).
TEST_CASE("a closed connection's event does not undo a new one that got its fd number", "[transport][endpoint]") {
  Keys k;
  ServerEndpoint server(server_options(k));
  auto first = std::make_unique<ClientEndpoint>(client_options(server, k.good));
  REQUIRE(first->wait_connected(3000ms));  // accepted and authenticated; it never sends
  std::unique_ptr<ClientEndpoint> second;
  std::thread peer([&] {
    first.reset();
    eventually([&] { return server.stats().disconnects >= 1; });  // the monitor has queued the close
    std::this_thread::sleep_for(20ms);
    second = std::make_unique<ClientEndpoint>(client_options(server, k.good));
    (void)second->send(heartbeat(1));
  });
  auto got = server.receive(5000ms);  // started before the close, so it drains nothing
  peer.join();
  REQUIRE(got.ok());
  REQUIRE(server.stats().disconnects == 1);
  (void)server.receive(0ms);  // drains the close
  for (const auto& e : server.take_peer_events()) CHECK(e.kind == PeerEvent::Kind::kConnected);
  CHECK(server.connected_peers() == std::vector<std::string>{"good"});
  REQUIRE(second->send(heartbeat(2)).ok());
  CHECK(server.receive(3000ms).ok());
  CHECK(server.connected_peers() == std::vector<std::string>{"good"});

  // The new connection's own close is still seen.
  second.reset();
  CHECK(eventually([&] {
    for (const auto& e : server.take_peer_events())
      if (e.kind == PeerEvent::Kind::kDisconnected) return true;
    return false;
  }));
  CHECK(server.connected_peers().empty());
}

TEST_CASE("insecure endpoints talk plain TCP and log a warning", "[transport][security]") {
  LogCapture logs;
  ServerOptions so;
  so.insecure = true;
  so.tuning = small_limits();
  ServerEndpoint server(so);
  ClientOptions co;
  co.connect = server.endpoint();
  co.insecure = true;
  co.tuning = small_limits();
  ClientEndpoint client(co);
  CHECK(logs.contains("--insecure"));
  REQUIRE(client.send(heartbeat(5)).ok());
  auto r = server.receive(3000ms);
  REQUIRE(r.ok());
  CHECK(r->peer.rfind("insecure-", 0) == 0);
  REQUIRE(server.send(r->peer, heartbeat(6)).ok());
  CHECK(client.receive(3000ms).ok());
  // A secure server refuses to start without an allow-list.
  Keys k;
  ServerOptions empty;
  empty.keys = k.server;
  CHECK_THROWS_WITH(ServerEndpoint(empty), Catch::Contains("empty allow-list"));
}

TEST_CASE("a client pinned to the wrong server key backs off instead of retrying every 100 ms",
          "[transport][security]") {
  LogCapture logs;
  Keys k;
  ServerEndpoint server(server_options(k));
  ClientOptions o = client_options(server, k.good);
  o.server_public_key = generate_keypair().public_key;  // impostor's key
  o.auth_backoff_initial_ms = 400;                      // waits 400, 800, 1600 ms ...
  ClientEndpoint client(o);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < 2000ms) (void)client.receive(100ms);
  // libzmq alone would have tried ~15 times; the back-off allows attempts at 0, 0.4, 1.2 s.
  CHECK(client.failed_handshakes() >= 2);
  CHECK(client.failed_handshakes() <= 4);
  CHECK(client.last_handshake_failure().find("wrong server key") != std::string::npos);
  size_t retry_lines = 0, server_lines = 0;
  {
    std::lock_guard lock(logs.mutex);
    for (const auto& l : logs.lines) {
      retry_lines += l.find("retrying in") != std::string::npos;
      server_lines += l.find("refused a connection") != std::string::npos;
    }
  }
  CHECK(retry_lines == client.failed_handshakes());  // one line per back-off step
  CHECK(server_lines == 1);                          // the rest are counted, logged with the next report
  CHECK(server.stats().handshakes_failed >= 2);
}

// An idle daemon waits for the coordinator up to a second at a time; a signal
// on the Wakeup (a stop, a release request) must end that wait at once, on an
// open connection and while the client backs off after a refused handshake.
TEST_CASE("a client's receive ends when its Wakeup is signalled, connected or backing off", "[transport]") {
  Keys k;
  ServerEndpoint server(server_options(k));
  auto ends_early = [](ClientEndpoint& client) {
    Wakeup woken;
    std::thread signaller([&] {
      std::this_thread::sleep_for(50ms);
      woken.signal();
    });
    const auto t0 = std::chrono::steady_clock::now();
    auto r = client.receive(20000ms, &woken);
    const auto waited = std::chrono::steady_clock::now() - t0;
    signaller.join();
    REQUIRE(r.is(FailureKind::kTimeout));
    CHECK(waited < 10000ms);  // the signal, not the 20 s timeout, ended it
    // It says why it ended: never "no message within 20000 ms" after 50 ms.
    CHECK(r.failure().message.find("no message within") == std::string::npos);
    // Left signalled: the next wait returns at once too, until the owner clears it.
    const auto t1 = std::chrono::steady_clock::now();
    CHECK(client.receive(20000ms, &woken).is(FailureKind::kTimeout));
    CHECK(std::chrono::steady_clock::now() - t1 < 10000ms);
  };
  SECTION("connected") {
    ClientEndpoint client(client_options(server, k.good));
    REQUIRE(client.wait_connected(5000ms));
    ends_early(client);
    // A receive that runs its whole time says so.
    auto quiet = client.receive(50ms);
    REQUIRE(quiet.is(FailureKind::kTimeout));
    CHECK(quiet.failure().message.find("no message within 50 ms") != std::string::npos);
    // Still a working connection afterwards.
    REQUIRE(client.send(heartbeat(1)).ok());
    auto r = server.receive(5000ms);
    REQUIRE(r.ok());
    REQUIRE(server.send(r->peer, heartbeat(2)).ok());
    CHECK(client.receive(5000ms).ok());
  }
  SECTION("backing off") {
    LogCapture logs;
    auto client = refused_client(server, k, 60000);  // the socket closes for 60 s
    ends_early(*client);
  }
}

// A negative timeout is no limit (as on a connected socket): backing off, the
// receive waits until the socket reopens instead of returning at once, which
// would have its caller spin.
TEST_CASE("a client's receive without a time limit waits out its back-off", "[transport]") {
  Keys k;
  ServerEndpoint server(server_options(k));
  auto client = refused_client(server, k, 1000);
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(client->receive(Millis(-1)).is(FailureKind::kTimeout));
  const auto waited = std::chrono::steady_clock::now() - t1;
  CHECK(waited >= 300ms);   // most of the 1 s back-off (some passed before t1)
  CHECK(waited < 10000ms);  // and not forever
}

TEST_CASE("a control message over 1 MiB is refused by kind and the endpoint keeps serving",
          "[transport][security]") {
  LogCapture logs;
  Keys k;
  ServerOptions so = server_options(k);
  so.tuning.limits = DecodeLimits{};  // model-file sized headers allowed, for assign only
  ServerEndpoint server(so);
  ClientOptions co = client_options(server, k.good);
  co.tuning.limits = DecodeLimits{};
  ClientEndpoint client(co);
  RegisterMsg r;
  r.device_name = "good";
  r.details_json = "\"" + std::string(2u << 20, 'x') + "\"";
  REQUIRE(client.send(message_of(r)).ok());
  REQUIRE(client.send(heartbeat(2)).ok());
  auto first = server.receive(5000ms);
  REQUIRE(first.is(FailureKind::kRejected));
  CHECK(first.failure().message.find("exceeds the limit of 1048576 bytes for control messages") != std::string::npos);
  CHECK(first.failure().peer == "good");
  auto second = server.receive(5000ms);
  REQUIRE(second.ok());
  CHECK(std::holds_alternative<HeartbeatMsg>(second.value().message.body));
  CHECK(server.stats().messages_rejected == 1);
}

TEST_CASE("payload_limits keeps the header caps and sets the frame cap from the payload", "[transport]") {
  const DecodeLimits l = payload_limits(size_t{512} << 20);
  CHECK(l.max_control_bytes == (1u << 20));
  CHECK(l.max_payload_bytes >= (size_t{512} << 20));
  CHECK(l.max_payload_bytes < (size_t{545} << 20));
  CHECK(transport_frame_cap(l) < (int64_t{1090} << 20));  // far below the 2 GiB of the defaults
  CHECK(transport_frame_cap(payload_limits(1u << 20)) == int64_t{2} * DecodeLimits{}.max_header_bytes);
}

TEST_CASE("replacing the allow-list revokes a key: event, connection shut down, reconnect and queued messages refused",
          "[transport][security]") {
  LogCapture logs;
  Keys k;
  ServerOptions so = server_options(k);
  so.allow.add("intruder-but-listed", k.intruder.public_key);
  ServerEndpoint server(so);
  ClientOptions co = client_options(server, k.good);
  co.auth_backoff_initial_ms = 100;
  ClientEndpoint good(co);
  ClientEndpoint other(client_options(server, k.intruder));
  REQUIRE(good.send(heartbeat(1)).ok());
  REQUIRE(other.send(heartbeat(1)).ok());
  for (int i = 0; i < 2; ++i) REQUIRE(server.receive(5000ms).ok());
  (void)server.take_peer_events();
  // Queued before the revocation: must not be accepted after it.
  for (uint64_t i = 2; i < 6; ++i) REQUIRE(good.send(heartbeat(i)).ok());
  std::this_thread::sleep_for(200ms);

  AllowList reduced;
  reduced.add("intruder-but-listed", k.intruder.public_key);
  CHECK(server.replace_allow_list(reduced) == std::vector<std::string>{"good"});
  const auto events = server.take_peer_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == PeerEvent::Kind::kRevoked);
  CHECK(events[0].peer == "good");
  CHECK(server.stats().revoked_connections == 1);
  CHECK(logs.contains("key of good revoked"));
  // Whatever was still queued from good is refused; other's traffic is served.
  REQUIRE(other.send(heartbeat(7)).ok());
  bool other_served = false;
  for (int i = 0; i < 8 && !other_served; ++i) {
    auto r = server.receive(300ms);
    if (r.ok()) {
      CHECK(r.value().peer != "good");
      other_served = r.value().peer == "intruder-but-listed";
    }
  }
  CHECK(other_served);
  // good reconnects and is refused by ZAP.
  CHECK(eventually([&] {
    (void)good.receive(50ms);
    return good.failed_handshakes() > 0;
  }));
  CHECK(good.last_handshake_failure().find("refused this client's key") != std::string::npos);
  CHECK(server.stats().zap_denied >= 1);
}

TEST_CASE("the server counts each peer's traffic, and the peers' counts add up to the endpoint's",
          "[transport][endpoint]") {
  Keys k;
  ServerOptions so = server_options(k);
  const KeyPair second = generate_keypair();
  so.allow.add("second", second.public_key);
  ServerEndpoint server(so);
  ClientEndpoint a(client_options(server, k.good));
  ClientEndpoint b(client_options(server, second));
  for (int i = 1; i <= 3; ++i) REQUIRE(a.send(heartbeat(i)).ok());  // not 0: FlatBuffers leaves defaults out
  REQUIRE(b.send(heartbeat(9)).ok());
  for (int i = 0; i < 4; ++i) REQUIRE(server.receive(3000ms).ok());
  REQUIRE(server.send("good", heartbeat(100)).ok());
  REQUIRE(server.send("good", heartbeat(101)).ok());
  CHECK(server.send("nobody", heartbeat(102)).is(FailureKind::kUnreachable));  // counted nowhere

  const auto traffic = server.peer_traffic();
  REQUIRE(traffic.size() == 2);
  const PeerTraffic& ta = traffic.at("good");
  const PeerTraffic& tb = traffic.at("second");
  CHECK(ta.messages_received == 3);
  CHECK(tb.messages_received == 1);
  CHECK(ta.messages_sent == 2);
  CHECK(tb.messages_sent == 0);
  CHECK(ta.bytes_received == 3 * tb.bytes_received);  // three heartbeats of one size against one
  CHECK(tb.bytes_sent == 0);
  const EndpointStats s = server.stats();
  CHECK(ta.bytes_sent + tb.bytes_sent == s.bytes_sent);
  CHECK(ta.bytes_received + tb.bytes_received == s.bytes_received);
}

// An idle daemon runs a server endpoint and a client endpoint for years on a
// board or a phone: their helper threads (socket monitors, the ZAP handler)
// must sleep until there is something to do, not wake every few milliseconds
// to look at a stop flag (they did: 50 and 20 times a second).
TEST_CASE("an idle endpoint's helper threads sleep until an event, and still stop and see events",
          "[transport][endpoint]") {
  Keys k;
  const auto before = switches_by_thread();
  auto server = std::make_unique<ServerEndpoint>(server_options(k));  // no peers yet: nothing to wake for
  std::this_thread::sleep_for(200ms);  // the threads' start-up
  std::set<std::string> helpers;
  std::map<std::string, long> start;
  for (const auto& [tid, n] : switches_by_thread())
    if (!before.count(tid)) {
      helpers.insert(tid);
      start[tid] = n;
    }
  REQUIRE(helpers.size() >= 2);  // at least the monitor and the ZAP handler
  std::this_thread::sleep_for(1000ms);
  long woke = 0;
  for (const auto& [tid, n] : switches_by_thread())
    if (helpers.count(tid)) woke += n - start[tid];
  CHECK(woke <= 10);  // a 20 ms poll alone is 50

  // Still serving: a client's handshake goes through the ZAP handler, and its
  // end is seen through the monitor; the destructor stops both threads.
  {
    ClientEndpoint good(client_options(*server, k.good));
    REQUIRE(good.send(heartbeat(1)).ok());
    REQUIRE(server->receive(3000ms).ok());
  }
  CHECK(eventually([&] {
    for (const PeerEvent& e : server->take_peer_events())
      if (e.kind == PeerEvent::Kind::kDisconnected && e.peer == "good") return true;
    return false;
  }));
  const auto t0 = std::chrono::steady_clock::now();
  server.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}
