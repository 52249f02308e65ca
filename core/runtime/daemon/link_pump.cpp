// link_pump.cpp: see link_pump.h.
#include "core/runtime/daemon/link_pump.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "transport/log.h"

namespace cleave {

using namespace std::chrono;
using transport::FailureKind;
using transport::TensorMessage;

LinkPump::LinkPump(std::unique_ptr<transport::TensorLink> link, std::string peer, Limits limits, std::string log_as)
    : link_(std::move(link)), peer_(std::move(peer)), limits_(limits), log_as_(std::move(log_as)) {
  if (!link_) throw std::invalid_argument("LinkPump: no link");
  if (limits_.sends < 1 || limits_.received < 1) throw std::invalid_argument("LinkPump: queue limits must be >= 1");
  stats_ = link_->stats();
  thread_ = std::thread([this] { run(); });
}

LinkPump::~LinkPump() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_->signal();
  thread_.join();
}

bool LinkPump::try_send(TensorMessage& m, milliseconds wait) {
  std::unique_lock lock(mutex_);
  throw_if_failed();
  if (!changed_.wait_for(lock, wait, [&] { return sends_.size() < limits_.sends || !failure_.empty(); })) return false;
  throw_if_failed();
  Outgoing out;
  if (m.owner) {  // a token shared with ZeroMQ's zero-copy send: it expires, and wakes the thread, once ZeroMQ lets go
    using Owner = std::shared_ptr<const void>;
    std::shared_ptr<const void> token(new Owner(std::move(m.owner)), [wake = wake_](const Owner* held) {
      delete held;
      wake->signal();
    });
    out.on_the_wire = token;
    m.owner = std::move(token);
  }
  out.message = std::move(m);
  sends_.push_back(std::move(out));
  lock.unlock();
  wake_->signal();
  return true;
}

std::optional<TensorMessage> LinkPump::try_take(transport::TensorKind kind, int64_t step, int micro_batch,
                                                milliseconds wait) {
  std::unique_lock lock(mutex_);
  std::optional<TensorMessage> got;
  changed_.wait_for(lock, wait, [&] {
    got = received_.take(kind, step, micro_batch);
    return got.has_value() || !failure_.empty();
  });
  if (got) {
    if (received_.size() + 1 == limits_.received) wake_->signal();  // it had stopped reading: room again
    return got;
  }
  throw_if_failed();
  return std::nullopt;
}

bool LinkPump::flushed(milliseconds wait) {
  std::unique_lock lock(mutex_);
  const bool empty = changed_.wait_for(lock, wait, [&] { return sends_.empty() || !failure_.empty(); });
  throw_if_failed();
  return empty;
}

transport::LinkStats LinkPump::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void LinkPump::fail(std::string why) {
  if (failure_.empty()) failure_ = std::move(why);
  changed_.notify_all();
}

void LinkPump::throw_if_failed() const {
  if (!failure_.empty()) throw std::runtime_error(failure_);
}

// The thread: release what ZeroMQ has sent, send the next queued tensor,
// read what arrived; when none of these had anything to do, sleep until the
// link's descriptor says input may be there, or wake_ does (a queued send,
// room in the inbox, ZeroMQ done with a sent tensor, stop); at the latest
// after 50 ms, or — when the link has no descriptor — after a short back-off
// (50 us doubling to 1 ms).
void LinkPump::run() {
  std::unique_lock lock(mutex_);
  auto backoff = microseconds(50);
  while (!stop_) {
    bool worked = false;
    if (failure_.empty()) {
      worked = release_sent();
      worked = send_next(lock) || worked;
      worked = receive_one(lock) || worked;
    }
    if (worked) {
      backoff = microseconds(50);
      changed_.notify_all();
      continue;
    }
    // Not reading (failed, or the inbox is full): only wake_ ends the sleep.
    const bool reading = failure_.empty() && received_.size() < limits_.received;
    const int link_fd = reading ? link_->poll_fd() : -1;
    const microseconds wait = reading && link_fd < 0 ? backoff : microseconds(50000);
    lock.unlock();
    sleep_until_woken(link_fd, wait);
    lock.lock();
    backoff = std::min(backoff * 2, microseconds(1000));
  }
}

void LinkPump::sleep_until_woken(int link_fd, microseconds wait) const {
  pollfd fds[2] = {{wake_->fd(), POLLIN, 0}, {link_fd, POLLIN, 0}};
  const timespec ts{static_cast<time_t>(wait.count() / 1000000), static_cast<long>(wait.count() % 1000000) * 1000};
  if (::ppoll(fds, link_fd >= 0 ? 2 : 1, &ts, nullptr) > 0 && (fds[0].revents & POLLIN)) wake_->clear();
}

bool LinkPump::release_sent() {
  bool released = false;
  while (!sends_.empty() && sends_.front().sent && sends_.front().on_the_wire.expired()) {
    sends_.pop_front();
    released = true;
  }
  return released;
}

// Entries leave the deque only here, on this thread, and push_back keeps
// references valid: `next` stays put while the mutex is released.
bool LinkPump::send_next(std::unique_lock<std::mutex>& lock) {
  auto it = std::find_if(sends_.begin(), sends_.end(), [](const Outgoing& o) { return !o.sent; });
  if (it == sends_.end()) return false;
  Outgoing& next = *it;
  const TensorMessage m = next.message;
  lock.unlock();
  transport::Status s = link_->send(m);
  const transport::LinkStats now = link_->stats();
  lock.lock();
  stats_ = now;
  if (s) {
    next.sent = true;
    next.message.owner.reset();  // `m` goes too: ZeroMQ holds the only references left
    return true;
  }
  // The previous stage has not said hello yet: try again shortly.
  if (!s.is(FailureKind::kUnreachable)) fail("cannot send to " + peer_ + ": " + s.failure().message);
  return false;
}

bool LinkPump::receive_one(std::unique_lock<std::mutex>& lock) {
  if (received_.size() >= limits_.received) return false;  // back-pressure: the sender's queue fills
  lock.unlock();
  auto r = link_->receive(milliseconds(0));
  const transport::LinkStats now = link_->stats();
  lock.lock();
  stats_ = now;
  if (r) {
    received_.put(std::move(r).value(), peer_);
    return true;
  }
  if (r.is(FailureKind::kClosed)) fail("the link to " + peer_ + " closed");
  if (r.is(FailureKind::kRejected))
    transport::log(transport::LogLevel::kWarning, log_as_ + "rejected input from " + peer_ + ": " + r.failure().message);
  return r.is(FailureKind::kRejected);
}

}  // namespace cleave
