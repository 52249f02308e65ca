// flag_checks.h: CLI11 value checks with messages a user can act on, shared by
// `cleave` and `cleaved`.
//
// CLI11 2.1's own PositiveNumber / Range say "--batch: Value 0 not in range
// 0.000000 to 179769313486231570814527423731704356798070567525...". These
// say "--batch: must be positive, got 0". A failed check is a CLI11
// ValidationError, so the command exits with status 2 and the usage hint.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

namespace cleave::flag_checks {

// Whether `text` is one whole number (as CLI11 will convert it); sets `value`.
inline bool read_number(const std::string& text, double& value) {
  try {
    size_t used = 0;
    value = std::stod(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

inline std::string number_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// > 0.
inline CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        double v = 0;
        if (!read_number(in, v)) return "expected a number, got '" + in + "'";
        return v > 0 ? std::string() : "must be positive, got " + in;
      },
      "POSITIVE", "positive");
}

// >= 0.
inline CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        double v = 0;
        if (!read_number(in, v)) return "expected a number, got '" + in + "'";
        return v >= 0 ? std::string() : "must be 0 or more, got " + in;
      },
      "NONNEGATIVE", "non-negative");
}

// In [lo, hi], or [lo, hi) when `hi_open`.
inline CLI::Validator within(double lo, double hi, bool hi_open = false) {
  std::string range = "[";
  range += number_str(lo);
  range += ", ";
  range += number_str(hi);
  range += hi_open ? ')' : ']';
  return CLI::Validator(
      [lo, hi, hi_open, range](std::string& in) -> std::string {
        double v = 0;
        if (!read_number(in, v)) return "expected a number, got '" + in + "'";
        const bool ok = v >= lo && (hi_open ? v < hi : v <= hi);
        return ok ? std::string() : "must be in " + range + ", got " + in;
      },
      "in " + range, "within");
}

// Accepted by `parse` (a function that throws std::invalid_argument, whose
// message is the error, for a bad value), e.g. parse_recompute.
template <typename Parse>
CLI::Validator parsed_by(Parse parse, const std::string& description) {
  return CLI::Validator(
      [parse](std::string& in) -> std::string {
        try {
          (void)parse(in);
          return {};
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
      },
      description, "parsed_by");
}

}  // namespace cleave::flag_checks
