// link_pump.cpp: see link_pump.h.
#include "core/runtime/daemon/link_pump.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "transport/log.h"

namespace cleave {

using namespace std::chrono;
using transport::FailureKind;
using transport::TensorMessage;

LinkPump::LinkPump(std::unique_ptr<transport::TensorLink> link, std::string peer, Limits limits)
    : link_(std::move(link)), peer_(std::move(peer)), limits_(limits) {
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
  changed_.notify_all();
  thread_.join();
}

bool LinkPump::try_send(TensorMessage& m, milliseconds wait) {
  std::unique_lock lock(mutex_);
  throw_if_failed();
  if (!changed_.wait_for(lock, wait, [&] { return sends_.size() < limits_.sends || !failure_.empty(); })) return false;
  throw_if_failed();
  Outgoing out;
  if (m.owner) {  // a token shared with ZeroMQ's zero-copy send: it expires once ZeroMQ lets go of the memory
    auto token = std::make_shared<const std::shared_ptr<const void>>(std::move(m.owner));
    out.on_the_wire = token;
    m.owner = std::move(token);
  }
  out.message = std::move(m);
  sends_.push_back(std::move(out));
  ++queued_;
  changed_.notify_all();
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
    changed_.notify_all();  // room to read on
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
// read one arrival; when none of these had anything to do, wait a little
// (50 us, doubling to 1 ms while idle; a queued send wakes it at once).
void LinkPump::run() {
  std::unique_lock lock(mutex_);
  auto idle = microseconds(50);
  uint64_t seen = queued_;
  while (!stop_) {
    bool worked = false;
    if (failure_.empty()) {
      worked = release_sent();
      worked = send_next(lock) || worked;
      worked = receive_one(lock) || worked;
    }
    if (worked) {
      idle = microseconds(50);
      changed_.notify_all();
      continue;
    }
    changed_.wait_for(lock, idle, [&] { return stop_ || queued_ != seen; });
    seen = queued_;
    idle = std::min(idle * 2, microseconds(1000));
  }
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
    transport::log(transport::LogLevel::kWarning, "rejected input from " + peer_ + ": " + r.failure().message);
  return r.is(FailureKind::kRejected);
}

}  // namespace cleave
