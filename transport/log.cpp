// log.cpp: stderr default sink and a mutex-protected replaceable sink.
#include "transport/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "transport/result.h"

namespace cleave::transport {
namespace {

std::mutex g_mutex;
LogSink g_sink;
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "?";
}

}  // namespace

const char* failure_kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::kTimeout: return "timeout";
    case FailureKind::kRejected: return "rejected";
    case FailureKind::kUnreachable: return "unreachable";
    case FailureKind::kClosed: return "closed";
  }
  return "?";
}

void set_log_sink(LogSink sink) {
  std::lock_guard lock(g_mutex);
  g_sink = std::move(sink);
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

void log(LogLevel level, std::string_view message) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::lock_guard lock(g_mutex);
  if (g_sink) {
    g_sink(level, message);
    return;
  }
  std::fprintf(stderr, "cleave-transport [%s] %.*s\n", level_name(level),
               static_cast<int>(message.size()), message.data());
}

bool LogThrottle::log(LogLevel level, const std::string& message) {
  std::string line;
  {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (last_ && now - *last_ < interval_) {
      ++held_;
      return false;
    }
    line = message;
    if (held_ > 0)
      line += " (" + std::to_string(held_) + " more like it in the last " +
              std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - *last_).count()) + " s)";
    last_ = now;
    held_ = 0;
  }
  transport::log(level, line);
  return true;
}

}  // namespace cleave::transport
