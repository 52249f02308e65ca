// log.h: the transport's logging hook.
//
// The transport logs refusals (ZAP denials, handshake failures, rejected
// messages), disconnects and the --insecure warning. By default lines go to
// stderr as "cleave-transport [level] message"; an application (daemon,
// coordinator, tests) can install its own sink. The sink may be called from
// the transport's background threads, so it must be thread-safe.
#pragma once

#include <functional>
#include <string_view>

namespace cleave::transport {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

using LogSink = std::function<void(LogLevel, std::string_view)>;

// Replaces the sink (an empty function restores the stderr default).
void set_log_sink(LogSink sink);
// Lines below `level` are dropped (default kInfo).
void set_log_level(LogLevel level);
void log(LogLevel level, std::string_view message);

}  // namespace cleave::transport
