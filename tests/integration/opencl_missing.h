// opencl_missing.h: whether a test that trains through the OpenCL backend can
// run here, for the tests that skip without it (tests/skip.h).
#pragma once

#include <exception>
#include <string>

#include "device/device.h"

namespace cleave::testing {

// Why no OpenCL device can be opened here — no platform, no device, no OpenCL
// backend in this build or its module not found — or "" when one can. Any
// other failure to open it (a kernel that does not compile, ...) is a broken
// backend, not an absent one: it is rethrown, so the test fails.
inline std::string opencl_missing() {
  try {
    open_device("opencl");
    return "";
  } catch (const std::exception& e) {
    const std::string why = e.what();
    for (const char* absent : {"no OpenCL platform found", "no usable OpenCL device", "not compiled", "was not found"})
      if (why.find(absent) != std::string::npos) return why;
    throw;
  }
}

}  // namespace cleave::testing
