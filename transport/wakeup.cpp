// wakeup.cpp: see wakeup.h.
#include "transport/wakeup.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace cleave::transport {

Wakeup::Wakeup() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw std::runtime_error(std::string("cannot create an eventfd: ") + std::strerror(errno));
}

Wakeup::~Wakeup() { ::close(fd_); }

void Wakeup::signal() const {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof one);  // fails only when the counter is full: readable anyway
}

void Wakeup::clear() const {
  uint64_t count = 0;
  [[maybe_unused]] const ssize_t n = ::read(fd_, &count, sizeof count);  // EAGAIN when already clear
}

bool Wakeup::wait(int timeout_ms) const {
  pollfd p{fd_, POLLIN, 0};
  int n = 0;
  while ((n = ::poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {  // a signal handler ran: wait on
  }
  return n > 0;
}

}  // namespace cleave::transport
