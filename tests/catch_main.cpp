// One Catch2 main shared by every test executable. It runs the session as
// Catch2's own main would, then turns skipped test cases (CLEAVE_SKIP,
// tests/skip.h) into exit code 77 so CTest lists them as "Skipped": a case that
// did not run must not count as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "skip.h"

namespace {
int g_skipped = 0;
}  // namespace

namespace cleave::testing {

void mark_skipped(const std::string& reason) {
  ++g_skipped;
  std::cout << "SKIP: " << Catch::getResultCapture().getCurrentTestName() << ": " << reason << std::endl;
}

}  // namespace cleave::testing

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  // A failure is a failure, skipped or not; exactly 77 failed assertions must
  // not read as a skip.
  if (failed != 0) return failed == cleave::testing::kSkipExitCode ? failed + 1 : failed;
  if (g_skipped > 0) {
    std::cout << "SKIP: " << g_skipped << " test case(s) skipped: exit code " << cleave::testing::kSkipExitCode
              << std::endl;
    return cleave::testing::kSkipExitCode;
  }
  return 0;
}
