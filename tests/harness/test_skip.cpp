// test_skip.cpp: CLEAVE_SKIP (tests/skip.h, tests/catch_main.cpp) makes a test
// executable exit with CTest's skip code, and only when nothing failed. Each
// check runs skip_probe on some of its hidden cases and reads the exit code.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "core/data/dataset.h"
#include "skip.h"

namespace {

struct Run {
  int code = -1;
  std::string output;
};

// Runs skip_probe on the test spec `spec` (quoted), with `env` before it.
Run probe(const std::string& spec, const std::string& env = "") {
  const std::string cmd = env + " '" + std::string(CLEAVE_SKIP_PROBE) + "' " + spec + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  Run r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  REQUIRE(WIFEXITED(status));
  r.code = WEXITSTATUS(status);
  return r;
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

}  // namespace

TEST_CASE("the skip exit code is the one CTest is told about", "[harness]") {
  CHECK(cleave::testing::kSkipExitCode == CLEAVE_SKIP_RETURN_CODE);
}

TEST_CASE("a passing case exits 0", "[harness]") {
  const Run r = probe("'probe: passes'");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_FALSE(contains(r.output, "SKIP"));
}

TEST_CASE("a skipped case exits 77 and says why", "[harness]") {
  for (const char* name : {"probe: skips", "probe: skips inside a section"}) {
    const Run r = probe(std::string("'") + name + "'");
    INFO(r.output);
    CHECK(r.code == cleave::testing::kSkipExitCode);
    CHECK(contains(r.output, std::string("SKIP: ") + name + ": "));
    CHECK_FALSE(contains(r.output, "not reached"));
  }
  CHECK(contains(probe("'probe: skips'").output, "SKIP: probe: skips: the probe's reason 42"));
}

TEST_CASE("a failure is never turned into a skip", "[harness]") {
  const Run before = probe("'probe: fails, then skips'");
  INFO(before.output);
  CHECK(before.code != 0);
  CHECK(before.code != cleave::testing::kSkipExitCode);
  // A failing case next to a skipped one: the run fails.
  const Run mixed = probe("'probe: fails','probe: skips'");
  INFO(mixed.output);
  CHECK(mixed.code != 0);
  CHECK(mixed.code != cleave::testing::kSkipExitCode);
  // Catch2 exits with the number of failed assertions: 77 of them must not read as a skip.
  const Run many = probe("'probe: fails 77 times'");
  INFO(many.output);
  CHECK(many.code != 0);
  CHECK(many.code != cleave::testing::kSkipExitCode);
}

TEST_CASE("a run that skipped any case does not exit 0", "[harness]") {
  const Run r = probe("'probe: passes','probe: skips'");
  INFO(r.output);
  CHECK(r.code == cleave::testing::kSkipExitCode);
  CHECK(contains(r.output, "1 test case(s) skipped"));
}

TEST_CASE("missing Fashion-MNIST skips, with the lookup's message", "[harness]") {
  // An empty directory as $CLEAVE_DATA_DIR hides the installed dataset.
  const std::filesystem::path empty =
      std::filesystem::temp_directory_path() / ("cleave-no-data-" + std::to_string(::getpid()));
  std::filesystem::create_directories(empty);
  const Run r = probe("'probe: needs Fashion-MNIST'", "CLEAVE_DATA_DIR='" + empty.string() + "'");
  std::filesystem::remove_all(empty);
  INFO(r.output);
  CHECK(r.code == cleave::testing::kSkipExitCode);
  CHECK(contains(r.output, "Fashion-MNIST not found in " + empty.string()));
  CHECK(contains(r.output, "apt-get install dataset-fashion-mnist"));
  // With the data where the default lookup finds it, the same case runs and passes.
  if (cleave::testing::fashion_mnist_missing().empty()) CHECK(probe("'probe: needs Fashion-MNIST'").code == 0);
}
