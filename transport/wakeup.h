// wakeup.h: a descriptor that one thread sleeps on and any thread can make
// readable — how a helper thread that waits for input without a timeout is
// told that there is work, or that it should stop.
//
// The helper threads of an endpoint (the socket monitor, the ZAP handler) and
// a stage's link pump used to wake every 20-50 ms to look at a stop flag: an
// idle daemon woke about 70 times a second for nothing, which a phone or a
// board on battery pays for. Polling this descriptor beside the socket
// (zmq::poll takes a raw descriptor as an item) lets them sleep until an
// event or signal().
#pragma once

namespace cleave::transport {

class Wakeup {
 public:
  // Throws std::runtime_error when the kernel gives no eventfd.
  Wakeup();
  ~Wakeup();
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;

  // Readable (POLLIN) from the first signal() until clear().
  int fd() const { return fd_; }
  // Makes fd() readable; from any thread, and from a signal handler (one write()).
  void signal() const;
  // Makes fd() unreadable again; from the thread that sleeps on it.
  void clear() const;
  // Sleeps until signalled (true) or `timeout_ms` passes (false; negative: no
  // timeout). Leaves it signalled.
  bool wait(int timeout_ms) const;

 private:
  int fd_ = -1;
};

}  // namespace cleave::transport
