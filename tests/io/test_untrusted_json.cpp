// test_untrusted_json.cpp: the defensive JSON reader (core/io/untrusted_json.h):
// the depth scan ignores brackets inside strings and stops early, texts over
// the size or depth limit are refused before parsing (100,000 nested arrays:
// a clear error, no crash), parse errors and non-objects are refused with the
// caller's prefix, files are bounded before they are read, and every typed
// read names the key, what it must be and what it got.
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <string>

#include "core/io/untrusted_json.h"
#include "scratch_dir.h"

using namespace cleave;
using Catch::Contains;
using Catch::StartsWith;
using nlohmann::json;

namespace {

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) + std::string(static_cast<size_t>(depth), close);
}

std::string parse_error(const std::string& text, const JsonLimits& limits = kPeerJsonLimits) {
  try {
    (void)parse_untrusted_json(text, limits, "details");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("untrusted JSON: nesting depth counts arrays and objects outside strings", "[io][json]") {
  CHECK(json_nesting_depth("") == 0);
  CHECK(json_nesting_depth("3") == 0);
  CHECK(json_nesting_depth("[1, {\"a\": [2]}]") == 3);
  CHECK(json_nesting_depth(R"({"a": "[[[[{{{{", "b": []})") == 2);  // brackets in strings do not count
  CHECK(json_nesting_depth(R"(["\"[[[", "\\", [[]]])") == 3);       // escaped quotes and backslashes
  CHECK(json_nesting_depth(nested(100000)) == 100000);
  CHECK(json_nesting_depth(nested(100000), 64) == 65);  // stops as soon as it knows
}

TEST_CASE("untrusted JSON: size and depth limits are checked before parsing", "[io][json]") {
  const JsonLimits small{100, 4};
  CHECK(parse_untrusted_json(nested(4), small, "details") == json::parse(nested(4)));
  CHECK_THAT(parse_error(nested(5), small), StartsWith("details: ") && Contains("nested more than 4 deep"));
  CHECK_THAT(parse_error(std::string(101, ' ') + "1", small), Contains("102 bytes, more than the 100 allowed"));
  // The finding: 50,000 nested objects in details, 100,000 nested arrays in a model.
  std::string deep_details;
  for (int i = 0; i < 50000; ++i) deep_details += "{\"a\":";
  deep_details += "1" + std::string(50000, '}');
  CHECK_THAT(parse_error(deep_details, JsonLimits{size_t{1} << 20, 32}), Contains("nested more than 32 deep"));
  CHECK_THAT(parse_error(nested(100000), kFileJsonLimits), Contains("nested more than 64 deep"));
}

TEST_CASE("untrusted JSON: parse errors and non-objects are refused with the caller's prefix", "[io][json]") {
  CHECK_THAT(parse_error("{\"a\": "), StartsWith("details: invalid JSON: "));
  CHECK_THAT(parse_error("{\"a\": 1} trailing"), StartsWith("details: invalid JSON: "));
  CHECK(parse_untrusted_object("", kPeerJsonLimits, "details") == json::object());
  CHECK_THROWS_WITH(parse_untrusted_object("", kPeerJsonLimits, "details", /*empty_is_object=*/false),
                    StartsWith("details: invalid JSON"));
  CHECK_THROWS_WITH(parse_untrusted_object("[1]", kPeerJsonLimits, "details"),
                    Contains("details: must be a JSON object, got an array"));
  CHECK(parse_untrusted_object(R"({"x": [1, 2]})", kPeerJsonLimits, "details")["x"][1] == 2);
}

TEST_CASE("untrusted JSON files: bounded before reading, errors start with the path", "[io][json]") {
  cleave::test::TempDir dir;
  const std::string ok = dir.file("ok.json"), deep = dir.file("deep.json"), big = dir.file("big.json");
  std::ofstream(ok) << R"({"a": 1})";
  std::ofstream(deep) << nested(100000);
  std::ofstream(big) << "[" << std::string(2000, ' ') << "]";
  CHECK(read_untrusted_json_file(ok, kFileJsonLimits)["a"] == 1);
  CHECK_THROWS_WITH(read_untrusted_json_file(deep, kFileJsonLimits, "model file"),
                    StartsWith(deep + ": ") && Contains("nested more than 64 deep"));
  CHECK_THROWS_WITH(read_untrusted_json_file(big, JsonLimits{1000, 8}, "model file"),
                    StartsWith(big + ": model file is 2002 bytes, more than the 1000 allowed"));
  CHECK_THROWS_WITH(read_untrusted_json_file(dir.file("missing.json"), kFileJsonLimits, "model file"),
                    Contains("cannot open model file"));
  CHECK_THROWS_WITH(read_untrusted_json_file(dir.str(), kFileJsonLimits, "model file"), Contains("it is a directory"));
}

TEST_CASE("untrusted JSON: typed reads name the key, the expected type and what came", "[io][json]") {
  const json d = json::parse(R"({"shard": 7, "samples": "many", "neg": -3, "big": 18446744073709551615,
                                 "three": 3.0, "half": 2.5, "flag": 1, "name": "x", "obj": {"k": 1}, "arr": []})");
  CHECK_THROWS_WITH(json_string(d, "shard", "?", "a string like \"1/3\""),
                    "\"shard\" must be a string like \"1/3\", got a number");
  CHECK(json_string(d, "name", "?") == "x");
  CHECK(json_string(d, "absent", "?") == "?");
  CHECK(json_string(json::array(), "name", "?") == "?");  // not an object: nothing is present
  CHECK_THROWS_WITH(json_integer(d, "samples", 0), "\"samples\" must be an integer, got a string");
  CHECK_THROWS_WITH(json_integer(d, "neg", 0, 0, 10), Contains("\"neg\" must be an integer in [0, 10], got -3"));
  CHECK_THROWS_WITH(json_integer(d, "big", 0), Contains("got 18446744073709551615"));
  CHECK(json_integer(d, "three", 0) == 3);
  CHECK_THROWS_WITH(json_integer(d, "half", 0), Contains("\"half\" must be an integer, got 2.5"));
  CHECK(json_integer(d, "absent", 42) == 42);
  CHECK_THROWS_WITH(json_bool(d, "flag", false), "\"flag\" must be true or false, got a number");
  CHECK(json_number(d, "half", 0) == 2.5);
  CHECK_THROWS_WITH(json_number(d, "name", 0), "\"name\" must be a number, got a string");
  CHECK_THROWS_WITH(json_number(d, "half", 0, 0, 1), Contains("\"half\" must be a number in [0"));
  CHECK(json_object(d, "obj")["k"] == 1);
  CHECK(json_object(d, "absent").empty());
  CHECK_THROWS_WITH(json_object(d, "arr"), "\"arr\" must be an object, got an array");
}

TEST_CASE("untrusted JSON: excerpts for messages are bounded", "[io][json]") {
  CHECK(json_excerpt(json::parse("[1, 2]")) == "[1,2]");
  const std::string long_text(1000, 'x');
  CHECK(json_excerpt(json(long_text), 10) == "\"xxxxxxxxx...");
  CHECK(json_type_name(json()) == "null");
  CHECK(json_type_name(json(true)) == "a boolean");
  CHECK(json_type_name(json::object()) == "an object");
}
