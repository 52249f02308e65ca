// test_backend_module_errors.cpp: a backend module's error reaches the daemon
// through libcleave.so as an error message and exit status 1. The module and
// libcleave each carry a C++ runtime (libcleave links libstdc++ statically);
// with libgcc's unwinder linked statically into libcleave too, the module's
// exception aborted the daemon (exit 134, no message) on `--backend cuda`
// without a driver. The module here throws the way the CUDA one does there.
#include <catch2/catch.hpp>

#include <string>

#include "apps/cli_util.h"
#include "skip.h"

using namespace cleave::cli_test;

TEST_CASE("cleaved reports a backend module's error and exits 1 instead of aborting", "[cli][cleaved][modules]") {
#ifndef CLEAVE_THROWING_MODULE_DIR  // tests/apps/CMakeLists.txt builds the module where OpenCL is compiled in
  CLEAVE_SKIP("the throwing module stands in for the OpenCL one, which this build does not have");
#else
  const RunResult r = run_shell("CLEAVE_BACKEND_DIR='" CLEAVE_THROWING_MODULE_DIR "' '" + kCleaved +
                                "' --coordinator tcp://127.0.0.1:9 --insecure --name dev --backend opencl "
                                "--connect-timeout 1");
  INFO(r.output);
  CHECK(r.code == kExitFailure);
  CHECK(r.output.find("cleaved: error:") != std::string::npos);
  CHECK(r.output.find("the throwing test module has no device") != std::string::npos);
#endif
}
