// skip_probe.cpp: hidden test cases ([.]) for test_skip.cpp, which runs this
// executable on one case or a mix and checks its exit code and output.
#include <catch2/catch.hpp>

#include "skip.h"

TEST_CASE("probe: passes", "[.][probe]") { CHECK(1 + 1 == 2); }

TEST_CASE("probe: skips", "[.][probe]") {
  CLEAVE_SKIP("the probe's reason " << 42);
  FAIL("not reached: CLEAVE_SKIP returns from the test case");
}

TEST_CASE("probe: skips inside a section", "[.][probe]") {
  SECTION("only section") { CLEAVE_SKIP("skipped in a section"); }
  FAIL("not reached");
}

TEST_CASE("probe: fails, then skips", "[.][probe]") {
  CHECK(1 + 1 == 3);
  CLEAVE_SKIP("too late: the case already failed");
}

TEST_CASE("probe: fails", "[.][probe]") { CHECK(1 + 1 == 3); }

TEST_CASE("probe: fails 77 times", "[.][probe]") {
  for (int i = 0; i < 77; ++i) CHECK(i < 0);
}

TEST_CASE("probe: needs Fashion-MNIST", "[.][probe]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  CHECK(!cleave::find_fashion_mnist("").empty());
}
