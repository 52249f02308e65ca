// exposition.h: the pieces of Prometheus's text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/) that
// registry.h renders with: what a metric or label name may be, how HELP text
// and label values are escaped, and how a sample's value is written.
//
// Kept apart from the registry so the format's rules are tested on their own
// (tests/monitor/test_exposition.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cleave::monitor {

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool valid_metric_name(std::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]*, and not starting with "__" (reserved by Prometheus).
bool valid_label_name(std::string_view name);

// A label value as it goes between the quotes: backslash, double quote and
// line feed become \\, \" and \n; everything else is copied.
std::string escape_label_value(std::string_view value);
// HELP text: backslash and line feed become \\ and \n (quotes stay as they are).
std::string escape_help(std::string_view help);

// A sample value: whole numbers (up to 2^53) without a decimal point or
// exponent, others with 17 significant digits; NaN, +Inf and -Inf as the
// format spells them.
std::string format_value(double value);

// Text from outside the program (an error message) made fit for a label value
// a dashboard shows: control characters become spaces, bytes that are not
// UTF-8 become '?', and text longer than `max_bytes` is cut at a character
// boundary and ends with "...". Escaping is still escape_label_value's job.
std::string sanitize_label_text(std::string_view text, size_t max_bytes = 256);

}  // namespace cleave::monitor
