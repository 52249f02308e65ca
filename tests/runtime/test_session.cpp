// test_session.cpp: the coordinator session every driver is built on —
// registration (what is offered, the timeout message), one request-id
// counter, the release of daemons, the orderly stop on error, and the
// metrics a session publishes when a coordinator monitor is installed.
#include <catch2/catch.hpp>

#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>

#include "core/runtime/coordinator/session.h"
#include "core/runtime/coordinator/session_monitor.h"
#include "log_capture.h"
#include "transport/endpoint.h"

using namespace cleave;
using namespace cleave::transport;
using namespace std::chrono_literals;

namespace {

SessionOptions plain(const std::string& who) {
  SessionOptions o;
  o.who = who;
  o.listen = "tcp://127.0.0.1:*";
  o.insecure = true;
  o.peer_timeout_ms = 5000;
  return o;
}

std::unique_ptr<ClientEndpoint> daemon_at(const std::string& endpoint) {
  ClientOptions co;
  co.connect = endpoint;
  co.insecure = true;
  co.label = "fake daemon";
  return std::make_unique<ClientEndpoint>(co);
}

Message registration(const std::string& name) {
  RegisterMsg r;
  r.device_name = name;
  r.details_json = name == "with-data" ? "{\"fed_client\": true, \"samples\": 5}" : "not json";
  return message_of(r);
}

// Registers `daemon` with `session` and returns the name the session knows it by.
std::string register_one(Session& session, ClientEndpoint& daemon) {
  REQUIRE(daemon.send(registration("dev")).ok());
  std::string name;
  session.register_until(
      10000, [&] { return !name.empty(); },
      [&](const Registration& r) {
        name = r.peer;
        session.pool().add(r.peer, r.reg, r.details);
      },
      [](const std::string&) { return std::string("timeout"); });
  return name;
}

// The next command the fake daemon receives.
Command next_command(ClientEndpoint& c) {
  for (int i = 0; i < 50; ++i) {
    auto r = c.receive(100ms);
    if (r)
      if (auto* cmd = std::get_if<CommandMsg>(&r->body)) return cmd->command;
  }
  FAIL("no command arrived");
  return FinishCmd{};
}

}  // namespace

TEST_CASE("a session offers each new registration once, with its details parsed", "[runtime][session]") {
  std::string listening;
  SessionOptions o = plain("cleave test");
  o.on_listening = [&](const std::string& e) { listening = e; };
  Session session(o);
  CHECK(listening == session.server().endpoint());
  auto a = daemon_at(listening), b = daemon_at(listening);
  REQUIRE(a->send(registration("with-data")).ok());
  REQUIRE(b->send(registration("without")).ok());
  REQUIRE(a->send(registration("with-data")).ok());  // a retry: not offered again once added

  std::vector<Registration> seen;
  std::vector<nlohmann::json> details;
  session.register_until(
      10000, [&] { return session.pool().peers().size() == 2; },
      [&](const Registration& r) {
        details.push_back(r.details);
        session.pool().add(r.peer, r.reg, r.details);
      },
      [](const std::string&) { return std::string("unexpected timeout"); });
  REQUIRE(details.size() == 2);
  std::set<bool> has_data;
  for (const auto& d : details) {
    CHECK(d.is_object());  // "not json" became {}
    has_data.insert(d.value("fed_client", false));
  }
  CHECK(has_data == std::set<bool>{true, false});
}

TEST_CASE("registration that does not complete fails with the driver's message", "[runtime][session]") {
  Session session(plain("cleave test"));
  auto a = daemon_at(session.server().endpoint());
  REQUIRE(a->send(registration("lonely")).ok());
  const auto t0 = std::chrono::steady_clock::now();
  std::string registered;
  CHECK_THROWS_WITH(session.register_until(
                        1500, [] { return false; },
                        [&](const Registration& r) { session.pool().add(r.peer, r.reg, r.details); },
                        [&](const std::string& names) {
                          registered = names;
                          return "only 1 of 2 registered (" + names + ")";
                        }),
                    Catch::Contains("only 1 of 2 registered"));
  CHECK(std::chrono::steady_clock::now() - t0 >= 1500ms);
  CHECK_THAT(registered, Catch::StartsWith("insecure-"));  // the names registered so far
}

TEST_CASE("request ids come from one counter, and release ends jobs and shuts daemons down",
          "[runtime][session]") {
  Session session(plain("cleave test"));
  std::set<uint64_t> ids;
  for (int i = 0; i < 1000; ++i) ids.insert(session.next_request_id());
  CHECK(ids.size() == 1000);
  CHECK(*ids.begin() > 0);

  auto a = daemon_at(session.server().endpoint());
  const std::string name = register_one(session, *a);
  session.release({name}, /*shutdown=*/true);
  CHECK(std::holds_alternative<FinishCmd>(next_command(*a)));
  CHECK(std::holds_alternative<ShutdownCmd>(next_command(*a)));
}

TEST_CASE("a job that throws releases its daemons and the error reaches the caller", "[runtime][session]") {
  Session session(plain("cleave test"));
  auto a = daemon_at(session.server().endpoint());
  const std::string name = register_one(session, *a);

  CHECK_THROWS_WITH(session.run_job({name}, false, []() -> int { throw std::runtime_error("stage 1 died"); }),
                    "stage 1 died");
  CHECK(std::holds_alternative<FinishCmd>(next_command(*a)));

  // And on success the daemons are released too, after the body's result.
  CHECK(session.run_job({name}, false, [] { return 7; }) == 7);
  CHECK(std::holds_alternative<FinishCmd>(next_command(*a)));
}

// A daemon on its last job acknowledges the finish request and exits at once:
// its ack and its disconnect reach a coordinator that was busy elsewhere
// together. The ack is read first; only then is the daemon gone (the official
// CI on a loaded machine failed two runs so: "device dev1 (stage 0)
// disconnected at step 8", the ack unread behind the disconnect).
TEST_CASE("a daemon's last message before it disconnects is read before it is declared dead",
          "[runtime][session]") {
  Session session(plain("cleave test"));
  auto a = daemon_at(session.server().endpoint());
  const std::string name = register_one(session, *a);
  PeerPool& pool = session.pool();
  pool.set_monitoring(true);
  REQUIRE(a->send(message_of(AckMsg{42, "{\"op\": \"finish\"}"}, 42)).ok());
  a.reset();  // closes its socket: the ack is flushed (linger), then the connection ends
  // Busy elsewhere: the disconnect's monitor event is in by the time we look.
  for (int i = 0; i < 50 && session.server().stats().disconnects == 0; ++i) std::this_thread::sleep_for(20ms);
  REQUIRE(session.server().stats().disconnects == 1);
  std::this_thread::sleep_for(100ms);

  auto got = pool.receive(100ms);
  REQUIRE(got);
  CHECK(got->peer == name);
  CHECK(std::holds_alternative<AckMsg>(got->message.body));
  CHECK_FALSE(pool.at(name).dead);  // what the driver checks right after each receive

  // Then, with nothing more from it, it is declared dead.
  for (int i = 0; i < 20 && !pool.at(name).dead; ++i) (void)pool.receive(20ms);
  CHECK(pool.at(name).dead);
  CHECK(pool.at(name).dead_reason == "disconnected");
}

TEST_CASE("a message the transport rejects is logged once, and counted in the audit", "[runtime][session]") {
  cleave::testing::LogCapture logs;
  Session session(plain("cleave test"));
  // Raw junk on a plain DEALER: a frame no cleave endpoint would send.
  zmq::context_t ctx;
  zmq::socket_t junk(ctx, zmq::socket_type::dealer);
  junk.set(zmq::sockopt::linger, 0);
  junk.connect(session.server().endpoint());
  junk.send(zmq::str_buffer("not a cleave message"), zmq::send_flags::none);
  const auto t0 = std::chrono::steady_clock::now();
  while (logs.count("rejected") == 0 && std::chrono::steady_clock::now() - t0 < 5s) (void)session.pool().receive(50ms);
  for (int i = 0; i < 10; ++i) (void)session.pool().receive(20ms);  // a second line would be written by now
  INFO("log: " << logs.count("rejected") << " line(s)");
  CHECK(logs.count("rejected") == 1);  // the finding: the endpoint and the pool each logged it
  CHECK(session.server().stats().messages_rejected == 1);
}

TEST_CASE("with a coordinator monitor installed, a session publishes its roster, refusals, step and failure",
          "[runtime][session][metrics]") {
  const auto installed = std::make_shared<CoordinatorMonitor>("127.0.0.1:0", "test");
  install_coordinator_monitor(installed);
  struct Uninstall {
    ~Uninstall() { install_coordinator_monitor(nullptr); }
  } uninstall;
  const monitor::Registry& r = installed->registry();
  std::string name;
  {
    Session session(plain("cleave fed"));
    CHECK(r.value("cleave_coordinator_running", {}) == 1);
    CHECK(r.value("cleave_coordinator_current_job", {{"kind", "fed"}}) == 1);
    auto member = daemon_at(session.server().endpoint());
    auto outsider = daemon_at(session.server().endpoint());
    name = register_one(session, *member);
    MetricsMsg mm;
    mm.step = 7;
    REQUIRE(outsider->send(message_of(mm)).ok());  // not in the job: refused
    mm.step = 6;
    REQUIRE(member->send(message_of(mm)).ok());
    for (int i = 0; i < 20; ++i) (void)session.pool().receive(50ms);
    session.release({name}, false);  // a Finish: bytes sent to the member
    CHECK_THROWS(session.stop_on_error([]() -> int { throw std::runtime_error("round 3: \"dev9\" failed"); }, [] {}));
  }
  CHECK(r.value("cleave_coordinator_running", {}) == 0);
  CHECK(r.value("cleave_coordinator_current_job", {{"kind", "fed"}}, -1) == -1);
  CHECK(r.value("cleave_coordinator_runs_total", {{"kind", "fed"}}) == 1);
  CHECK(r.value("cleave_coordinator_devices_registered", {}) == 1);
  CHECK(r.value("cleave_coordinator_devices_live", {}) == 1);
  CHECK(r.value("cleave_coordinator_device_up", {{"device", name}}) == 1);
  CHECK(r.value("cleave_coordinator_step", {}) == 6);  // the refused message's step does not count
  CHECK(r.value("cleave_coordinator_refused_messages_total", {{"reason", "not_in_job"}}) == 1);
  CHECK(r.value("cleave_coordinator_peer_bytes_received_total", {{"peer", name}}) > 0);
  CHECK(r.value("cleave_coordinator_peer_bytes_sent_total", {{"peer", name}}) > 0);
  CHECK(r.value("cleave_coordinator_errors_total", {}) == 1);
  CHECK(r.value("cleave_coordinator_last_error_info", {{"message", "round 3: \"dev9\" failed"}}) == 1);
  // As a scrape reads it: the quotes escaped.
  const std::string text = installed->registry().render();
  CHECK(text.find("cleave_coordinator_last_error_info{message=\"round 3: \\\"dev9\\\" failed\"} 1\n") !=
        std::string::npos);
}
