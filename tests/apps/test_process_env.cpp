// test_process_env.cpp: `cleave` and `cleaved` restart themselves once, before
// anything else, with the environment their libraries read at load time
// (device/cpu/process_env.h): OMP_WAIT_POLICY=passive, and where OpenBLAS chose
// kernels below the CPU (a VM hiding the CPU model), the better
// OPENBLAS_CORETYPE. A preloaded library (fake_openblas_corename.c) makes
// OpenBLAS's choice look like such a VM's and records every start of the
// program with its environment.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "apps/cli_util.h"
#include "device/cpu/blas_kernels.h"
#include "skip.h"

using namespace cleave::cli_test;

namespace {

struct Start {
  std::string pid, omp, core;
};

// The starts fake_openblas_corename.c recorded in `log`, in order.
std::vector<Start> starts(const std::string& log) {
  std::vector<Start> out;
  std::istringstream in(read_bytes(log));
  for (Start s; in >> s.pid >> s.omp >> s.core;) out.push_back(s);
  return out;
}

// `program --version` with the fake kernel choice, `env` first (e.g. "-u OMP_WAIT_POLICY").
RunResult run_as_on_a_vm(const std::string& program, const std::string& env, const std::string& log) {
  return run_shell("env " + env + " LD_PRELOAD='" CLEAVE_FAKE_CORENAME_LIB "' CLEAVE_TEST_START_LOG='" + log + "' '" +
                   program + "' --version");
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("cleave and cleaved restart once with the OPENBLAS_CORETYPE of the CPU where OpenBLAS chose lesser kernels",
          "[cli][cleaved]") {
  const std::string better = cleave::blas_better_coretype("Prescott", cleave::cpu_vector_units());
  if (better.empty()) CLEAVE_SKIP("this CPU has neither AVX2 nor AVX-512 (or is not x86-64): no better kernels to choose");
  for (const std::string& program : {kCleave, kCleaved}) {
    TempDir dir;
    const std::string log = dir.file("starts");
    const RunResult r = run_as_on_a_vm(program, "-u OPENBLAS_CORETYPE -u OMP_WAIT_POLICY", log);
    INFO(program << "\n" << r.output);
    REQUIRE(r.code == 0);
    // It says what it found and what it does, once.
    CHECK(count(r.output, "restarting with OPENBLAS_CORETYPE=" + better) == 1);
    CHECK(r.output.find("OpenBLAS chose its Prescott kernels") != std::string::npos);
    // Two starts of one process (exec keeps the pid): the first as the user
    // started it, the second with both variables, set in one restart.
    const std::vector<Start> s = starts(log);
    REQUIRE(s.size() == 2);
    CHECK(s[0].pid == s[1].pid);
    CHECK(s[0].omp == "-");
    CHECK(s[0].core == "-");
    CHECK(s[1].omp == "passive");
    CHECK(s[1].core == better);
  }
}

TEST_CASE("an OPENBLAS_CORETYPE and an OMP_WAIT_POLICY the user set are kept, and nothing restarts",
          "[cli][cleaved]") {
  if (cleave::blas_better_coretype("Prescott", cleave::cpu_vector_units()).empty())
    CLEAVE_SKIP("this CPU has neither AVX2 nor AVX-512 (or is not x86-64): no better kernels to choose");
  for (const std::string& program : {kCleave, kCleaved}) {
    TempDir dir;
    const std::string log = dir.file("starts");
    const RunResult r = run_as_on_a_vm(program, "OPENBLAS_CORETYPE=Haswell OMP_WAIT_POLICY=active", log);
    INFO(program << "\n" << r.output);
    REQUIRE(r.code == 0);
    CHECK(r.output.find("restarting") == std::string::npos);
    const std::vector<Start> s = starts(log);
    REQUIRE(s.size() == 1);
    CHECK(s[0].omp == "active");
    CHECK(s[0].core == "Haswell");
  }
  // Only OMP_WAIT_POLICY unset: one restart for it, the user's core type kept, nothing said about kernels.
  TempDir dir;
  const RunResult r = run_as_on_a_vm(kCleave, "-u OMP_WAIT_POLICY OPENBLAS_CORETYPE=Haswell", dir.file("starts"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("restarting") == std::string::npos);
  const std::vector<Start> s = starts(dir.file("starts"));
  REQUIRE(s.size() == 2);
  CHECK(s[1].omp == "passive");
  CHECK(s[1].core == "Haswell");
}
