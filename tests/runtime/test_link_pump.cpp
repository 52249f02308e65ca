// A stage link on its own thread (core/runtime/daemon/link_pump.h): sends
// return while the link is still sending, full queues push back instead of
// dropping, arrivals wait for their turn, and failures name the peer.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime/daemon/link_pump.h"

using namespace cleave;
using namespace std::chrono_literals;
using transport::FailureKind;
using transport::TensorKind;
using transport::TensorMessage;

namespace {

TensorMessage tensor(int64_t step, int mb, float value) {
  return TensorMessage::from_vector(TensorKind::kActivation, step, mb, {1, 3}, {value, value + 1, value + 2});
}

// A link whose send blocks while `hold` is set, which refuses its first
// `unreachable` sends as the not-yet-greeted serving side does, and whose
// receive reports `closed` once asked to.
class StubLink final : public transport::TensorLink {
 public:
  std::mutex mutex;
  std::condition_variable cv;
  bool hold = false;
  int unreachable = 0;
  bool closed = false;
  bool refuse = false;
  std::vector<TensorMessage> sent;
  std::atomic<int> sending{0};  // sends under way

  transport::Status send(const TensorMessage& t) override {
    std::unique_lock lock(mutex);
    if (refuse) return transport::Failure{FailureKind::kClosed, "socket closed", {}};
    if (unreachable > 0) {
      --unreachable;
      return transport::Failure{FailureKind::kUnreachable, "peer has not said hello", {}};
    }
    ++sending;
    cv.notify_all();
    cv.wait(lock, [&] { return !hold; });
    --sending;
    sent.push_back(TensorMessage::from_vector(t.kind, t.step, t.micro_batch, t.shape, t.to_vector()));  // on the wire
    return transport::Done{};
  }
  transport::Result<TensorMessage> receive(transport::Millis) override {
    std::lock_guard lock(mutex);
    if (closed) return transport::Failure{FailureKind::kClosed, "closed", {}};
    return transport::Failure{FailureKind::kTimeout, "nothing", {}};
  }
  size_t wire_bytes(const TensorMessage& t) const override { return t.count * 4; }
  transport::LinkStats stats() const override { return {}; }
  std::string describe() const override { return "stub"; }
  void release() {
    {
      std::lock_guard lock(mutex);
      hold = false;
    }
    cv.notify_all();
  }
};

// try_send until queued (the stage's loop around it checks its deadline).
void send_all(LinkPump& pump, TensorMessage m) {
  while (!pump.try_send(m, 20ms)) {
  }
}

}  // namespace

TEST_CASE("a pump's send returns while the link is still sending, and a full queue pushes back without dropping") {
  auto stub_owned = std::make_unique<StubLink>();
  StubLink& stub = *stub_owned;
  stub.hold = true;
  LinkPump pump(std::move(stub_owned), "the next stage d2", LinkPump::Limits{2, 4});
  TensorMessage a = tensor(0, 0, 1), b = tensor(0, 1, 2), c = tensor(0, 2, 3);
  REQUIRE(pump.try_send(a, 1000ms));  // queued: the link's send is blocked, the caller is not
  {
    std::unique_lock lock(stub.mutex);
    REQUIRE(stub.cv.wait_for(lock, 5s, [&] { return stub.sending.load() == 1; }));
  }
  REQUIRE(pump.try_send(b, 1000ms));
  CHECK_FALSE(pump.try_send(c, 50ms));  // two tensors not yet sent: back-pressure
  CHECK(c.count == 3);                  // not taken, so not lost
  stub.release();
  REQUIRE(pump.try_send(c, 5000ms));
  REQUIRE(pump.flushed(5000ms));
  std::lock_guard lock(stub.mutex);
  REQUIRE(stub.sent.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(stub.sent[i].micro_batch == i);
    CHECK(stub.sent[i].values()[0] == static_cast<float>(i + 1));
  }
}

TEST_CASE("a pump retries sends while the serving peer has not said hello, in order") {
  auto stub_owned = std::make_unique<StubLink>();
  StubLink& stub = *stub_owned;
  stub.unreachable = 5;
  LinkPump pump(std::move(stub_owned), "the previous stage d1", LinkPump::Limits{2, 4});
  for (int i = 0; i < 6; ++i) send_all(pump, tensor(1, i, static_cast<float>(i)));
  REQUIRE(pump.flushed(5000ms));
  std::lock_guard lock(stub.mutex);
  REQUIRE(stub.sent.size() == 6);
  for (int i = 0; i < 6; ++i) CHECK(stub.sent[i].micro_batch == i);
}

TEST_CASE("a pump's link failures are thrown to the stage, naming the peer") {
  SECTION("a closed link") {
    auto stub_owned = std::make_unique<StubLink>();
    stub_owned->closed = true;
    LinkPump pump(std::move(stub_owned), "the next stage d2", {});
    std::string what;
    for (int i = 0; i < 250 && what.empty(); ++i) {
      try {
        (void)pump.try_take(TensorKind::kGradient, 0, 0, 20ms);
      } catch (const std::runtime_error& e) {
        what = e.what();
      }
    }
    CHECK(what == "the link to the next stage d2 closed");
  }
  SECTION("a send the link refuses") {
    auto stub_owned = std::make_unique<StubLink>();
    stub_owned->refuse = true;
    LinkPump pump(std::move(stub_owned), "the previous stage d1", {});
    TensorMessage m = tensor(0, 0, 1);
    REQUIRE(pump.try_send(m, 1000ms));
    std::string what;
    for (int i = 0; i < 250 && what.empty(); ++i) {
      try {
        TensorMessage again = tensor(0, 1, 1);
        (void)pump.try_send(again, 20ms);
      } catch (const std::runtime_error& e) {
        what = e.what();
      }
    }
    CHECK(what == "cannot send to the previous stage d1: socket closed");
  }
}

TEST_CASE("tensors through a pump arrive whole and in turn, and a full inbox stops reading, losing none") {
  auto [near, far] = transport::make_in_process_link_pair();
  LinkPump pump(std::move(near), "the previous stage d1", LinkPump::Limits{2, 3});
  constexpr int kCount = 40;
  std::atomic<int> refused{0};
  std::thread peer([far = far.get(), &refused] {
    for (int i = 0; i < kCount; ++i)
      if (!far->send(tensor(i / 8, i % 8, static_cast<float>(i)))) ++refused;
  });
  // Taken out of order within each step: the one asked for is handed out
  // whichever order they came in, and the inbox holds at most 3 at a time.
  for (int step = 0; step < kCount / 8; ++step)
    for (int k = 0; k < 8; ++k) {
      const int mb = k ^ 1;
      std::optional<TensorMessage> got;
      for (int tries = 0; tries < 250 && !got; ++tries) got = pump.try_take(TensorKind::kActivation, step, mb, 20ms);
      REQUIRE(got);
      CHECK(got->values()[2] == static_cast<float>(step * 8 + mb + 2));
    }
  peer.join();
  CHECK(refused == 0);
  CHECK(pump.stats().messages_received == kCount);
  CHECK_FALSE(pump.try_take(TensorKind::kActivation, 9, 0, 20ms));
}

TEST_CASE("a sent tensor's memory is freed once the link lets go of it") {
  auto [near, far] = transport::make_in_process_link_pair();
  LinkPump pump(std::move(near), "the next stage d2", {});
  auto values = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3});
  std::weak_ptr<std::vector<float>> alive = values;
  TensorMessage m = TensorMessage::borrow(TensorKind::kActivation, 0, 0, {1, 3}, values->data(), 3, values);
  values.reset();
  REQUIRE(pump.try_send(m, 1000ms));
  {
    auto r = far->receive(5000ms);  // the in-process link hands the memory itself over
    REQUIRE(r);
    CHECK_FALSE(alive.expired());
    CHECK_FALSE(pump.flushed(50ms));  // still read by the receiver: the send queue keeps counting it
  }
  CHECK(pump.flushed(5000ms));
  CHECK(alive.expired());
}
