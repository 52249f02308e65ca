// log_capture.h: collects cleave's log lines (transport/log.h) for the
// duration of a test, so a test can assert what was logged and how often.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "transport/log.h"

namespace cleave::testing {

struct LogCapture {
  std::mutex mutex;
  std::vector<std::string> lines;
  LogCapture() {
    transport::set_log_sink([this](transport::LogLevel, std::string_view s) {
      std::lock_guard lock(mutex);
      lines.emplace_back(s);
    });
  }
  ~LogCapture() { transport::set_log_sink({}); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  // Lines containing `needle`.
  size_t count(const std::string& needle) {
    std::lock_guard lock(mutex);
    size_t n = 0;
    for (const auto& l : lines) n += l.find(needle) != std::string::npos;
    return n;
  }
  bool contains(const std::string& needle) { return count(needle) > 0; }
};

}  // namespace cleave::testing
