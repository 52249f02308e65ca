// seconds.h: time in seconds, for measurements and for the messages that
// name a timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cleave {

// Seconds since `t0` on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "0.5 s", "2.5 s", "120 s": tenths below ten seconds (so that a 500 ms
// --register-timeout does not read "within 0 s"), whole seconds from there.
inline std::string seconds_text(int64_t ms) {
  char out[32];
  if (ms < 10000) std::snprintf(out, sizeof out, "%.1f s", static_cast<double>(ms) / 1000.0);
  else std::snprintf(out, sizeof out, "%lld s", static_cast<long long>(ms / 1000));
  return out;
}

}  // namespace cleave
