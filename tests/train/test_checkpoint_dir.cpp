// test_checkpoint_dir.cpp: the directory of periodic checkpoints that
// recovery and --resume restore from (core/train/checkpoint_dir.h).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/train/checkpoint_dir.h"
#include "scratch_dir.h"

using namespace cleave;
namespace fs = std::filesystem;

namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a checkpoint directory keeps the newest two and lists them newest first", "[train][checkpoint]") {
  test::TempDir tmp;
  CheckpointDir dir(tmp.file("run/ckpts"));  // created with its parents
  for (int64_t step : {3, 6, 9, 12, 15}) dir.save(step, [&](const std::string& p) { write(p, std::to_string(step)); });
  write(dir.dir() + "/command.json", "{}");  // other files are not checkpoints
  write(dir.dir() + "/step-000000000018.ckpt.tmp.77", "torn");
  const auto kept = dir.list();
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].first == 15);
  CHECK(kept[1].first == 12);
  CHECK(kept[0].second == dir.path_for(15));
  CHECK(fs::path(dir.path_for(15)).filename() == "step-000000000015.ckpt");
}

TEST_CASE("the newest checkpoint that loads is used, and the ones that do not are reported", "[train][checkpoint]") {
  test::TempDir tmp;
  CheckpointDir dir(tmp.file("ckpts"), 3);
  for (int64_t step : {10, 20, 30}) dir.save(step, [&](const std::string& p) { write(p, std::to_string(step)); });
  write(dir.path_for(30), "corrupt");  // the newest one no longer loads
  const std::function<int(const std::string&)> load = [](const std::string& p) {
    const std::string text = read(p);
    if (text == "corrupt") throw std::runtime_error(p + ": checksum mismatch");
    return std::stoi(text);
  };
  std::vector<std::string> skipped;
  const auto got = dir.newest(load, skipped);
  REQUIRE(got.has_value());
  CHECK(*got == 20);
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0] == dir.path_for(30) + ": checksum mismatch");  // the path once, then why
  write(dir.path_for(20), "corrupt");
  write(dir.path_for(10), "corrupt");
  skipped.clear();
  CHECK_FALSE(dir.newest(load, skipped).has_value());
  CHECK(skipped.size() == 3);
}

TEST_CASE("a new run empties a default directory and refuses another run's later checkpoints", "[train][checkpoint]") {
  test::TempDir tmp;
  CheckpointDir dir(tmp.file("ckpts"));
  dir.save(40, [&](const std::string& p) { write(p, "x"); });
  CHECK_NOTHROW(dir.refuse_foreign(40, "cleave train --resume"));  // resuming at its own step
  CHECK_THROWS_WITH(dir.refuse_foreign(0, "cleave train --resume"),
                    Catch::Contains("already holds") && Catch::Contains("(step 40) of another run") &&
                        Catch::Contains("cleave train --resume " + dir.dir()));
  dir.remove_checkpoints();
  CHECK(dir.list().empty());
  CHECK_NOTHROW(dir.refuse_foreign(0, "cleave train --resume"));
  CHECK(default_checkpoint_dir("/data/run.ckpt", "cleave-train") == "/data/run.ckpt.checkpoints");
  const std::string temp = default_checkpoint_dir("", "cleave-train");
  CHECK(fs::is_directory(temp));
  CHECK(fs::path(temp).filename().string().rfind("cleave-train-checkpoints-", 0) == 0);
  fs::remove_all(temp);
  CHECK_THROWS_WITH(CheckpointDir("/proc/no-such-dir/ckpts"), Catch::Contains("/proc/no-such-dir/ckpts"));
}
