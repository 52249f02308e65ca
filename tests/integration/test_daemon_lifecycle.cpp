// test_daemon_lifecycle.cpp: a real cleaved against a coordinator played by
// the test with the project's own transport: a daemon whose coordinator falls
// silent mid-job abandons the job, gives its memory back and registers again,
// ready for the next job; a daemon refuses commands that do not fit its state.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <csignal>

#include <chrono>
#include <thread>

#include "core/model/model_spec.h"
#include "core/pipeline/schedule.h"
#include "core/runtime/common/wire.h"
#include "integration/daemon_cluster.h"
#include "transport/endpoint.h"
#include "transport/keys.h"

using namespace cleave;
using namespace cleave::transport;
using namespace std::chrono_literals;

namespace {

// The coordinator's side of one daemon's connection, kept deliberately thin.
class FakeCoordinator {
 public:
  explicit FakeCoordinator(const testing::DaemonCluster& cluster, const std::string& bind = "tcp://127.0.0.1:*") {
    ServerOptions so;
    so.bind = bind;
    so.keys = load_secret_key(cluster.coordinator_key());
    so.allow = AllowList::load(cluster.allow());
    so.label = "test coordinator";
    server_ = std::make_unique<ServerEndpoint>(so);
  }
  std::string endpoint() const { return server_->endpoint(); }

  // The next message of kind T from the daemon (heartbeats answered), within `timeout`.
  template <typename T>
  std::pair<T, Message> next(std::chrono::milliseconds timeout) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < timeout) {
      auto r = server_->receive(100ms);
      if (!r) continue;
      peer_ = r->peer;
      if (auto* b = std::get_if<T>(&r->message.body)) return {*b, r->message};
    }
    FAIL("no " << typeid(T).name() << " from the daemon within " << timeout.count() << " ms");
    throw std::logic_error("unreachable");
  }
  void send(const Message& m) { REQUIRE(server_->send(peer_, m).ok()); }
  uint64_t admitted() const { return server_->stats().zap_admitted; }  // CURVE handshakes its ZAP handler let in

 private:
  std::unique_ptr<ServerEndpoint> server_;
  std::string peer_;
};

constexpr uint64_t kJobId = 0x5eed0000beefULL;
constexpr uint32_t kPlanEpoch = 2;

AssignMsg single_stage(const ModelSpec& spec, int64_t batch) {
  AssignMsg a;
  a.stage = 0;
  a.num_stages = 1;
  a.layer_begin = 0;
  a.layer_end = spec.num_layers();
  a.model_spec_json = spec.to_json().dump();
  a.optimizer = to_wire(OptimizerConfig{});
  a.job = PipelineJob{schedule_to_wire(ScheduleKind::gpipe), 1, 3, batch, kJobId, kPlanEpoch};
  return a;
}

Message tensor(TensorKind kind, int64_t step, Shape shape, float value) {
  TensorMsg h{kind, step, 0, shape, Encoding::kF32, 0.f};
  auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(numel(shape)), value);
  return make_tensor_message(h, v);
}

int wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < timeout) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(50ms);
  }
  return -2;
}

}  // namespace

TEST_CASE("a daemon that loses its coordinator mid-job frees its memory and registers again",
          "[integration][daemon]") {
  testing::DaemonCluster cluster(1);
  FakeCoordinator coord(cluster);
  const pid_t pid = cluster.start(1, coord.endpoint(),
                                  {"--max-jobs", "3", "--coordinator-timeout", "1500", "--memory-limit", "256M"});
  const ModelSpec spec = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json");
  const int64_t batch = 8;

  auto [first, m0] = coord.next<RegisterMsg>(20s);
  REQUIRE(first.memory_total == 256ull << 20);
  const uint64_t idle_free = first.memory_free;

  // A job: build the stage and run one real step, so the device holds weights,
  // optimizer state and the step's activations.
  Message assign;
  assign.request_id = 11;
  assign.body = single_stage(spec, batch);
  coord.send(assign);
  auto [ack, ma] = coord.next<AckMsg>(20s);
  CHECK(ack.request_id == 11);
  coord.send(command_message(ConnectCmd{}, 12));
  (void)coord.next<AckMsg>(10s);
  coord.send(command_message(StepCmd{0, batch, 0, kPlanEpoch}, 13));
  coord.send(tensor(TensorKind::kInput, 0, batched(batch, spec.input), 0.5f));
  coord.send(tensor(TensorKind::kLabels, 0, {batch}, 3.0f));
  auto [metrics, mm] = coord.next<MetricsMsg>(20s);
  CHECK(metrics.sample_count == batch);
  CHECK(metrics.job_id == kJobId);  // the coordinator tells a stale plan's metrics by these
  CHECK(metrics.plan_epoch == kPlanEpoch);

  // Now the coordinator falls silent. The daemon must give up on the job after
  // --coordinator-timeout and come back as a free device.
  const auto t_silent = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(2500ms);
  auto [again, m1] = coord.next<RegisterMsg>(20s);
  CHECK(std::chrono::steady_clock::now() - t_silent >= 1500ms);
  CHECK(again.memory_free == idle_free);  // every byte of the abandoned stage is back
  CHECK_THAT(cluster.log(1), Catch::Contains("silent"));

  // And it serves the next job as if nothing happened.
  assign.request_id = 21;
  coord.send(assign);
  auto [ack2, ma2] = coord.next<AckMsg>(20s);
  CHECK(ack2.request_id == 21);
  coord.send(command_message(ShutdownCmd{}, 22));
  CHECK(wait_exit(pid, 10s) == 0);
}

TEST_CASE("a daemon answers commands that do not fit its state with errors and keeps serving",
          "[integration][daemon]") {
  testing::DaemonCluster cluster(1);
  FakeCoordinator coord(cluster);
  const pid_t pid = cluster.start(1, coord.endpoint(), {"--max-jobs", "1"});
  (void)coord.next<RegisterMsg>(20s);

  coord.send(command_message(StepCmd{0, 8}, 5));  // no stage yet
  auto [e1, me1] = coord.next<ErrorMsg>(10s);
  CHECK(e1.code == ErrorCode::kNotAssigned);
  CHECK(e1.request_id == 5);

  const ModelSpec spec = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json");
  Message assign;
  assign.request_id = 6;
  assign.body = single_stage(spec, 8);
  coord.send(assign);
  (void)coord.next<AckMsg>(20s);
  coord.send(assign);  // a second assignment while one runs
  auto [e2, me2] = coord.next<ErrorMsg>(10s);
  CHECK_THAT(e2.message, Catch::Contains("already running a stage"));
  coord.send(command_message(FedRoundCmd{0, 1, 8, 0, std::nullopt}, 7));  // another job kind's command
  auto [e3, me3] = coord.next<ErrorMsg>(10s);
  CHECK(e3.code == ErrorCode::kBadMessage);
  CHECK_THAT(e3.message, Catch::Contains("fed_round"));
  coord.send(command_message(StepCmd{0, 8, 0, kPlanEpoch - 1}, 9));  // a step of an earlier plan: not run
  auto [e4, me4] = coord.next<ErrorMsg>(10s);
  CHECK(e4.request_id == 9);
  CHECK_THAT(e4.message, Catch::Contains("refused step 0 of plan 1: its stage belongs to plan 2"));

  coord.send(command_message(FinishCmd{}, 8));
  auto [fin, mf] = coord.next<AckMsg>(10s);
  CHECK(fin.request_id == 8);
  CHECK_THAT(fin.detail, Catch::Contains("\"op\":\"finish\""));
  CHECK(wait_exit(pid, 10s) == 0);  // --max-jobs 1: the job ran, the daemon is done
}

// Between jobs a registered daemon sleeps until a message or its next
// registration, a second away: SIGTERM (through the SDK's stop and its
// Wakeup) must end that sleep at once rather than at the next registration.
TEST_CASE("a registered idle daemon stops at once on SIGTERM, not at its next registration", "[integration][daemon]") {
  testing::DaemonCluster cluster(1);
  FakeCoordinator coord(cluster);
  const pid_t pid = cluster.start(1, coord.endpoint(), {"--max-jobs", "1"});
  (void)coord.next<RegisterMsg>(20s);
  (void)coord.next<RegisterMsg>(5s);  // registered and idle: it has begun its second's sleep
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(kill(pid, SIGTERM) == 0);
  const int code = wait_exit(pid, 10s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  INFO("exited " << took.count() << " ms after SIGTERM\n" << cluster.log(1));
  CHECK(code == 0);
  CHECK(took < 700ms);  // the next registration was ~1 s away
}

// An unconnected daemon waits up to 5 s at a time for its coordinator: the
// handshake's end must wake it, so that it registers as soon as it is
// connected, not at the end of that wait.
TEST_CASE("a daemon dialling a coordinator that is not up yet registers as soon as the handshake is done",
          "[integration][daemon]") {
  testing::DaemonCluster cluster(1);
  std::string endpoint;
  {
    FakeCoordinator probe(cluster);  // a free port: bound, then released
    endpoint = probe.endpoint();
  }
  const pid_t pid = cluster.start(1, endpoint, {"--max-jobs", "1"});
  std::this_thread::sleep_for(2000ms);  // started, probed its GFLOP/s and waiting
  FakeCoordinator coord(cluster, endpoint);
  const auto t0 = std::chrono::steady_clock::now();
  while (coord.admitted() == 0 && std::chrono::steady_clock::now() - t0 < 20s) std::this_thread::sleep_for(2ms);
  REQUIRE(coord.admitted() > 0);
  const auto admitted_at = std::chrono::steady_clock::now();
  (void)coord.next<RegisterMsg>(20s);
  const auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - admitted_at);
  INFO("registered " << gap.count() << " ms after its key was admitted\n" << cluster.log(1));
  CHECK(gap < 700ms);  // the handshake's end woke it, not the end of its 5 s wait
  REQUIRE(kill(pid, SIGTERM) == 0);
  CHECK(wait_exit(pid, 10s) == 0);
}
