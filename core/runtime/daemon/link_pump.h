// link_pump.h: a pipeline stage link on its own thread, so that the stage
// computes micro-batch k+1 while k is on the wire.
//
// The pump owns one TensorLink (ZeroMQ sockets are not thread-safe: only the
// pump's thread touches it) and two bounded queues:
//   - sends: at most `Limits::sends` tensors the link has not finished with
//     (queued, being encoded or throttled, or still read by ZeroMQ's zero-copy
//     send). try_send waits for room: back-pressure, never a drop. A tensor
//     leaves the queue, and its memory is freed, once ZeroMQ no longer reads it
//     (ZeroMQ letting go of it wakes the pump: no timer polls for it).
//   - received: at most `Limits::received` tensors that arrived ahead of their
//     turn. When that many wait, the pump stops reading the link and the
//     sender's queue fills instead. A link carries one kind of tensor in the
//     order its stage consumes them (activations down, gradients up, in
//     micro-batch order), so the one a stage waits for is never stuck behind
//     a full queue.
// A failure of the link (closed, a send refused for good) is kept and thrown,
// naming the peer, by every later call from the stage's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/runtime/daemon/tensor_mailbox.h"
#include "transport/link.h"
#include "transport/wakeup.h"

namespace cleave {

class LinkPump {
 public:
  struct Limits {
    size_t sends = 1;      // tensors the link has not finished sending
    size_t received = 16;  // tensors received ahead of their turn
  };

  // Starts the thread. `peer` names the other end in errors and logs
  // ("the next stage d2 (link zmq tcp://... f32)"); `log_as` starts the pump's
  // log lines ("cleaved d1: ").
  LinkPump(std::unique_ptr<transport::TensorLink> link, std::string peer, Limits limits, std::string log_as = {});
  // Stops and joins the thread; tensors not yet sent are dropped with the job.
  ~LinkPump();
  LinkPump(const LinkPump&) = delete;
  LinkPump& operator=(const LinkPump&) = delete;

  // Queues `m` when there is room within `wait`: true, and `m` is moved from.
  // False when the queue stayed full. Throws std::runtime_error once the link failed.
  bool try_send(transport::TensorMessage& m, std::chrono::milliseconds wait);
  // The tensor (kind, step, micro-batch) when it arrives within `wait`. Throws
  // std::runtime_error once the link failed (a tensor that arrived before is
  // still handed out).
  std::optional<transport::TensorMessage> try_take(transport::TensorKind kind, int64_t step, int micro_batch,
                                                   std::chrono::milliseconds wait);
  // True when every queued tensor is off the queue within `wait`.
  bool flushed(std::chrono::milliseconds wait);

  transport::LinkStats stats() const;
  const std::string& peer() const { return peer_; }

 private:
  struct Outgoing {
    transport::TensorMessage message;
    bool sent = false;
    std::weak_ptr<const void> on_the_wire;  // expires, and wakes the thread, when ZeroMQ no longer reads the memory
  };

  void run();
  void sleep_until_woken(int link_fd, std::chrono::microseconds wait) const;
  bool send_next(std::unique_lock<std::mutex>& lock);
  bool release_sent();
  bool receive_one(std::unique_lock<std::mutex>& lock);
  void fail(std::string why);  // with mutex_ held
  void throw_if_failed() const;  // with mutex_ held

  std::unique_ptr<transport::TensorLink> link_;
  const std::string peer_;
  const Limits limits_;
  const std::string log_as_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // for the stage's thread: queue room, an arrival, a failure
  std::deque<Outgoing> sends_;
  TensorMailbox received_;
  transport::LinkStats stats_;  // the link's, copied after each operation (the link is the thread's)
  std::string failure_;
  // Ends the thread's sleep: a queued send, room in the inbox, ZeroMQ letting go
  // of a sent tensor (shared: that can come after the pump is gone), or stop.
  const std::shared_ptr<const transport::Wakeup> wake_ = std::make_shared<const transport::Wakeup>();
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cleave
