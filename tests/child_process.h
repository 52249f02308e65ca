// child_process.h: what tests that run `cleave` and `cleaved` as child
// processes read back — a log or JSON file, how often a line occurs, how a
// child ended.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>

#include "apps/common/processes.h"

namespace cleave::testing {

using ::cleave::read_text;

inline size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Waits up to `seconds` for `pid` to exit: its exit status, 128 when a
// signal ended it, -1 when it still runs.
inline int wait_exit(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 10; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

}  // namespace cleave::testing
