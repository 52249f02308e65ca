// exposition.cpp: see exposition.h.
#include "core/monitor/exposition.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

namespace cleave::monitor {
namespace {

bool name_char(char c, bool first, bool colon) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (colon && c == ':') return true;
  return alpha || (!first && c >= '0' && c <= '9');
}

bool valid_name(std::string_view name, bool colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i)
    if (!name_char(name[i], i == 0, colon)) return false;
  return true;
}

// Length of the UTF-8 sequence starting at text[i], or 0 when it is not one
// (a stray continuation byte, a truncated or overlong sequence, a surrogate).
size_t utf8_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kSmallest[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

bool valid_metric_name(std::string_view name) { return valid_name(name, true); }

bool valid_label_name(std::string_view name) { return valid_name(name, false) && name.substr(0, 2) != "__"; }

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (value == std::trunc(value) && std::fabs(value) <= 9007199254740992.0)
    std::snprintf(buf, sizeof buf, "%.0f", value);
  else
    std::snprintf(buf, sizeof buf, "%.17g", value);
  return buf;
}

std::string sanitize_label_text(std::string_view text, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const std::string piece = n == 0 ? "?" : (n == 1 && (c < 0x20 || c == 0x7F)) ? " " : std::string(text.substr(i, n));
    if (out.size() + piece.size() > max_bytes) {
      // Cut at the last whole character that leaves room for the marker.
      while (out.size() + 3 > max_bytes && !out.empty()) {
        size_t back = out.size() - 1;
        while (back > 0 && (static_cast<unsigned char>(out[back]) & 0xC0) == 0x80) --back;
        out.resize(back);
      }
      return out + "...";
    }
    out += piece;
    i += n == 0 ? 1 : n;
  }
  return out;
}

}  // namespace cleave::monitor
