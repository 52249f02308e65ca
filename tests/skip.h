// skip.h: a test case that cannot run here reports SKIPPED, never PASSED.
//
// Catch2 v2 has no SKIP. CLEAVE_SKIP(reason) records the skip (printing
// "SKIP: <test case>: <reason>" at once) and returns from the test case; the
// shared main (tests/catch_main.cpp) then ends the executable with exit code
// kSkipExitCode (77) instead of 0. tests/CMakeLists.txt gives every discovered
// CTest test SKIP_RETURN_CODE 77, and CTest runs one test case per process, so
// CTest lists exactly that case as "Skipped". A failed assertion before the skip
// still fails the case (the failure exit code wins over 77). Run by hand, an
// executable that skipped any of its cases exits 77 and says how many.
//
// CLEAVE_SKIP returns from the enclosing function: call it in the TEST_CASE
// body itself (also inside a SECTION), not in a helper or a lambda.
#pragma once

#include <sstream>
#include <string>

#include "core/data/dataset.h"

namespace cleave::testing {

// The exit code CTest reads as "skipped" (the Automake convention).
inline constexpr int kSkipExitCode = 77;

// Records that the running test case was skipped and prints why (defined in
// tests/catch_main.cpp).
void mark_skipped(const std::string& reason);

// Why Fashion-MNIST is not where load_dataset("fashion-mnist", "") looks
// ($CLEAVE_DATA_DIR, else /usr/share/datasets/fashion-mnist), or "" when it is
// there. The reason carries find_fashion_mnist's message with the apt-get hint.
inline std::string fashion_mnist_missing() {
  try {
    find_fashion_mnist("");
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace cleave::testing

// Skips the running test case: `reason` may be streamed (CLEAVE_SKIP("no GPU: " << why)).
#define CLEAVE_SKIP(reason)                                     \
  do {                                                          \
    std::ostringstream cleave_skip_reason_;                     \
    cleave_skip_reason_ << reason;                              \
    ::cleave::testing::mark_skipped(cleave_skip_reason_.str()); \
    return;                                                     \
  } while (false)

// Skips the running test case when Fashion-MNIST is not installed.
#define CLEAVE_SKIP_UNLESS_FASHION_MNIST()                                                     \
  do {                                                                                         \
    const std::string cleave_fashion_missing_ = ::cleave::testing::fashion_mnist_missing();    \
    if (!cleave_fashion_missing_.empty()) CLEAVE_SKIP(cleave_fashion_missing_);                  \
  } while (false)
