// untrusted_json.h: JSON from peers and from files a user was given, read
// defensively — the one place cleave parses JSON it did not write itself.
//
// Limits come first: the text's size, then the nesting depth of its arrays
// and objects (counted by a scan outside strings before any parse, so
// 100,000 nested brackets are refused in microseconds instead of building a
// document whose printing or destruction recurses off the stack). Then the
// parse, then typed reads: every getter names the key and the type it wanted,
// `"shard" must be a string like "1/3", got a number`, and throws
// std::invalid_argument — never nlohmann's raw type_error.
//
// Callers prefix what they know ("client dev3: registration details: ",
// "model file m.json: layer 3: ") and decide what a refusal means for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cleave {

struct JsonLimits {
  size_t max_bytes;  // text longer than this is refused unparsed
  int max_depth;     // arrays/objects nested deeper than this are refused unparsed
};

// What a peer sends inside a valid message (registration details, ack
// details): small, and copied into result JSON only within these bounds.
inline constexpr JsonLimits kPeerJsonLimits{64 * 1024, 32};
// The detail of a peer's `ack` (set-up details, a stage's trace, the split
// server's record): as large as a message header may be, but shallow.
inline constexpr JsonLimits kReplyJsonLimits{size_t{64} << 20, 32};
// Model files (and a model as it travels in `assign`), devices files,
// checkpoint headers: generous in size, shallow in depth.
inline constexpr JsonLimits kFileJsonLimits{size_t{64} << 20, 64};

// The deepest nesting of arrays and objects in `text`, brackets inside
// strings not counted; stops scanning once it passes `stop_above`.
int json_nesting_depth(std::string_view text, int stop_above = std::numeric_limits<int>::max());

// Parses `text` under `limits`. Throws std::invalid_argument "WHAT: ..."
// naming the limit passed ("70000 bytes, more than the 65536 allowed",
// "arrays or objects nested more than 32 deep") or "WHAT: invalid JSON: ...".
nlohmann::json parse_untrusted_json(std::string_view text, const JsonLimits& limits, const std::string& what);
// The same, and the document must be an object ("{}" for empty text when
// `empty_is_object`).
nlohmann::json parse_untrusted_object(std::string_view text, const JsonLimits& limits, const std::string& what,
                                      bool empty_is_object = true);
// Reads and parses the file at `path` under `limits` (its size checked before
// it is read). Throws std::runtime_error "PATH: ..." ("cannot open KIND (...)",
// too large, too deep, "invalid JSON: ...").
nlohmann::json read_untrusted_json_file(const std::string& path, const JsonLimits& limits,
                                        const std::string& kind = "file");

// "a number", "a string", "an object", "an array", "a boolean", "null".
std::string json_type_name(const nlohmann::json& v);
// `v` printed, cut to `max_chars` ("..." appended): for error messages.
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 80);

// Typed reads of `key` in the object `obj`; `fallback` when the key is absent
// (or `obj` is not an object). A present value of the wrong type throws
// std::invalid_argument "\"KEY\" must be EXPECTED, got TYPE"; `expected`
// describes it ("a string like \"1/3\""; defaults say just the type).
std::string json_string(const nlohmann::json& obj, const std::string& key, const std::string& fallback,
                        const std::string& expected = "a string");
bool json_bool(const nlohmann::json& obj, const std::string& key, bool fallback,
               const std::string& expected = "true or false");
// An integer in [lo, hi] (an integral float such as 3.0 counts).
int64_t json_integer(const nlohmann::json& obj, const std::string& key, int64_t fallback, int64_t lo = 0,
                     int64_t hi = std::numeric_limits<int64_t>::max(), const std::string& expected = "an integer");
// A finite number in [lo, hi].
double json_number(const nlohmann::json& obj, const std::string& key, double fallback,
                   double lo = -std::numeric_limits<double>::max(), double hi = std::numeric_limits<double>::max(),
                   const std::string& expected = "a number");
// The object at `key`, or an empty object when absent.
nlohmann::json json_object(const nlohmann::json& obj, const std::string& key, const std::string& expected = "an object");

}  // namespace cleave
