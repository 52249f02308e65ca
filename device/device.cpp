// device.cpp: backend names, byte sizes and their parsing: what every backend
// and its callers share (compiled into cleave_device and into each backend
// module). open_device lives in backend_registry.cpp.
#include "device/device.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "device/backends.h"

namespace cleave {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::cpu: return "cpu";
    case Backend::opencl: return "opencl";
    case Backend::cuda: return "cuda";
  }
  return "unknown";
}

std::optional<Backend> backend_named(std::string_view name) {
  for (Backend b : {Backend::cpu, Backend::opencl, Backend::cuda})
    if (name == backend_name(b)) return b;
  return std::nullopt;
}

std::string ascii_lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

namespace {
[[noreturn]] void not_implemented(const Device& d, const char* op) {
  throw std::runtime_error(std::string(backend_name(d.backend())) + ": " + op +
                           " is not implemented on this backend yet (the transformer layers run on the cpu backend)");
}
}  // namespace

void Device::embedding_forward(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t) {
  not_implemented(*this, "embedding_forward");
}
void Device::embedding_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t) {
  not_implemented(*this, "embedding_backward");
}
void Device::causal_softmax_forward(const Tensor&, const Tensor&, int64_t, int64_t, float) {
  not_implemented(*this, "causal_softmax_forward");
}
void Device::causal_softmax_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, float) {
  not_implemented(*this, "causal_softmax_backward");
}

std::string mib_text(size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

size_t parse_bytes(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("cannot parse byte size '" + text + "': " + why +
                                 " (examples: 1024, 64K, 512M, 1.5G, 2GiB)");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t num_start = i;
  bool seen_digit = false, seen_dot = false;
  while (i < text.size()) {
    const char ch = text[i];
    if (std::isdigit(static_cast<unsigned char>(ch))) {
      seen_digit = true;
    } else if (ch == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
    ++i;
  }
  if (!seen_digit) throw bad("expected a non-negative number");
  const std::string number = text.substr(num_start, i - num_start);
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit = ascii_lower(text.substr(i));
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();

  double mult = 1;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else {
    const char p = unit[0];
    const std::string rest = unit.substr(1);
    if (rest != "" && rest != "b" && rest != "ib") throw bad("unknown unit '" + text.substr(i) + "'");
    switch (p) {
      case 'k': mult = 1024.0; break;
      case 'm': mult = 1024.0 * 1024; break;
      case 'g': mult = 1024.0 * 1024 * 1024; break;
      case 't': mult = 1024.0 * 1024 * 1024 * 1024; break;
      default: throw bad("unknown unit '" + text.substr(i) + "'");
    }
  }
  const double value = std::stod(number) * mult;
  if (!std::isfinite(value) || value >= static_cast<double>(std::numeric_limits<size_t>::max()))
    throw bad("value too large");
  const double rounded = std::floor(value);
  if (seen_dot && mult == 1 && rounded != value) throw bad("fractional number of bytes");
  return static_cast<size_t>(rounded);
}

}  // namespace cleave
