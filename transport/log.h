// log.h: the transport's logging hook.
//
// The transport logs refusals (ZAP denials, handshake failures, rejected
// messages), disconnects and the --insecure warning. By default lines go to
// stderr as "cleave-transport [level] message"; an application (daemon,
// coordinator, tests) can install its own sink. The sink may be called from
// the transport's background threads, so it must be thread-safe.
// LogThrottle keeps a line that a peer can trigger at will (a refused
// handshake, a retried wrong key) from flooding the log.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace cleave::transport {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

using LogSink = std::function<void(LogLevel, std::string_view)>;

// Replaces the sink (an empty function restores the stderr default).
void set_log_sink(LogSink sink);
// Lines below `level` are dropped (default kInfo).
void set_log_level(LogLevel level);
void log(LogLevel level, std::string_view message);

// One kind of log line, rate-limited: the first is logged, later ones at most
// once per `interval`, each followed by how many were held back since the
// previous one. Thread-safe.
class LogThrottle {
 public:
  explicit LogThrottle(std::chrono::milliseconds interval = std::chrono::seconds(10)) : interval_(interval) {}
  // Logs `message` now, or counts it when the interval has not passed.
  // Returns whether it was logged.
  bool log(LogLevel level, const std::string& message);

 private:
  std::mutex mutex_;
  std::chrono::milliseconds interval_;
  std::optional<std::chrono::steady_clock::time_point> last_;
  uint64_t held_ = 0;
};

}  // namespace cleave::transport
