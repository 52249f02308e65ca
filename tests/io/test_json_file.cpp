// test_json_file.cpp: result JSON files are written whole, replace the old
// file atomically, and a bad path is a clear error that leaves nothing behind.
#include <catch2/catch.hpp>

#include <fstream>

#include "core/io/json_file.h"
#include "io/io_test_util.h"

using namespace cleave;

TEST_CASE("result JSON files are written atomically", "[io][json]") {
  test::ScratchDir dir("json");
  const std::string path = dir.file("out.json");
  write_json_file(path, {{"test_accuracy", 0.9}, {"losses", {1.5, 0.5}}});
  write_json_file(path, {{"test_accuracy", 0.8}});  // replaces the old file
  std::ifstream in(path);
  const nlohmann::json back = nlohmann::json::parse(in);
  CHECK(back == nlohmann::json{{"test_accuracy", 0.8}});
  CHECK(dir.entries() == std::vector<std::string>{"out.json"});  // no temporary file left
  write_json_file("", {{"ignored", true}});  // no path: nothing written
  CHECK(dir.entries().size() == 1);
  CHECK_THROWS_WITH(write_json_file(dir.file("missing/out.json"), {{"a", 1}}), Catch::Contains("missing/out.json"));
  CHECK(dir.entries().size() == 1);
}
