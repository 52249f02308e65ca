// untrusted_json.cpp: see untrusted_json.h.
#include "core/io/untrusted_json.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace cleave {

using nlohmann::json;

int json_nesting_depth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > stop_above) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

json parse_untrusted_json(std::string_view text, const JsonLimits& limits, const std::string& what) {
  if (text.size() > limits.max_bytes)
    throw std::invalid_argument(what + ": " + std::to_string(text.size()) + " bytes, more than the " +
                                std::to_string(limits.max_bytes) + " allowed");
  if (json_nesting_depth(text, limits.max_depth) > limits.max_depth)
    throw std::invalid_argument(what + ": arrays or objects nested more than " + std::to_string(limits.max_depth) +
                                " deep");
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw std::invalid_argument(what + ": invalid JSON: " + e.what());
  }
}

json parse_untrusted_object(std::string_view text, const JsonLimits& limits, const std::string& what,
                            bool empty_is_object) {
  if (text.empty() && empty_is_object) return json::object();
  json doc = parse_untrusted_json(text, limits, what);
  if (!doc.is_object()) throw std::invalid_argument(what + ": must be a JSON object, got " + json_type_name(doc));
  return doc;
}

json read_untrusted_json_file(const std::string& path, const JsonLimits& limits, const std::string& kind) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error(path + ": cannot open " + kind + " (it is a directory)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open " + kind + " (" + std::strerror(errno) + ")");
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > limits.max_bytes)
    throw std::runtime_error(path + ": " + kind + " is " + std::to_string(size) + " bytes, more than the " +
                             std::to_string(limits.max_bytes) + " allowed");
  std::string text;
  text.reserve(ec ? 0 : static_cast<size_t>(size));
  // Bounded read even where file_size cannot tell (a pipe, a growing file).
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > limits.max_bytes)
      throw std::runtime_error(path + ": " + kind + " is more than the " + std::to_string(limits.max_bytes) +
                               " bytes allowed");
  }
  try {
    return parse_untrusted_json(text, limits, path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());  // already "PATH: ..."
  }
}

std::string json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::binary: return "binary data";
    case json::value_t::discarded: return "nothing";
    default: return "a number";
  }
}

std::string json_excerpt(const json& v, size_t max_chars) {
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

namespace {

std::invalid_argument wrong(const std::string& key, const std::string& expected, const std::string& got) {
  return std::invalid_argument("\"" + key + "\" must be " + expected + ", got " + got);
}

// The value at `key`, or nullptr when absent.
const json* find(const json& obj, const std::string& key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

}  // namespace

std::string json_string(const json& obj, const std::string& key, const std::string& fallback,
                        const std::string& expected) {
  const json* v = find(obj, key);
  if (!v) return fallback;
  if (!v->is_string()) throw wrong(key, expected, json_type_name(*v));
  return v->get<std::string>();
}

bool json_bool(const json& obj, const std::string& key, bool fallback, const std::string& expected) {
  const json* v = find(obj, key);
  if (!v) return fallback;
  if (!v->is_boolean()) throw wrong(key, expected, json_type_name(*v));
  return v->get<bool>();
}

int64_t json_integer(const json& obj, const std::string& key, int64_t fallback, int64_t lo, int64_t hi,
                     const std::string& expected) {
  const json* v = find(obj, key);
  if (!v) return fallback;
  const std::string want = expected + " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi)) throw wrong(key, want, std::to_string(u));
    const auto x = static_cast<int64_t>(u);
    if (x < lo) throw wrong(key, want, std::to_string(x));
    return x;
  }
  if (v->is_number_integer()) {
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) throw wrong(key, want, std::to_string(x));
    return x;
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    // Within the int64 range and integral: 3.0 is 3.
    if (std::isfinite(d) && std::floor(d) == d && d >= -9.2e18 && d <= 9.2e18) {
      const auto x = static_cast<int64_t>(d);
      if (x < lo || x > hi) throw wrong(key, want, json_excerpt(*v));
      return x;
    }
    throw wrong(key, expected, json_excerpt(*v));
  }
  throw wrong(key, expected, json_type_name(*v));
}

double json_number(const json& obj, const std::string& key, double fallback, double lo, double hi,
                   const std::string& expected) {
  const json* v = find(obj, key);
  if (!v) return fallback;
  if (!v->is_number()) throw wrong(key, expected, json_type_name(*v));
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw wrong(key, expected + " in [" + json(lo).dump() + ", " + json(hi).dump() + "]", json_excerpt(*v));
  return d;
}

json json_object(const json& obj, const std::string& key, const std::string& expected) {
  const json* v = find(obj, key);
  if (!v) return json::object();
  if (!v->is_object()) throw wrong(key, expected, json_type_name(*v));
  return *v;
}

}  // namespace cleave
