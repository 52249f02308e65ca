// seconds_text.h: a timeout or wait in milliseconds as messages print it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace cleave {

// "0.5 s", "2.5 s", "120 s": tenths below ten seconds (so that a 500 ms
// --register-timeout does not read "within 0 s"), whole seconds from there.
inline std::string seconds_text(int64_t ms) {
  char out[32];
  if (ms < 10000) std::snprintf(out, sizeof out, "%.1f s", static_cast<double>(ms) / 1000.0);
  else std::snprintf(out, sizeof out, "%lld s", static_cast<long long>(ms / 1000));
  return out;
}

}  // namespace cleave
