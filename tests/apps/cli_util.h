// cli_util.h: running the real `cleave` and `cleaved` binaries from a test:
// output and exit status captured, fresh temporary directories, small file
// helpers, and the two kinds of error exit the apps promise (commands.h):
// 1 for a run that failed, 2 for a bad command line.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "scratch_dir.h"

namespace cleave::cli_test {

namespace fs = std::filesystem;

inline const std::string kCleave = CLEAVE_BINARY_DIR "/apps/cleave/cleave";
inline const std::string kCleaved = CLEAVE_BINARY_DIR "/apps/cleaved/cleaved";
inline const std::string kMlp = CLEAVE_SOURCE_DIR "/models/mlp.json";
inline const std::string kCnn = CLEAVE_SOURCE_DIR "/models/cnn.json";

inline constexpr int kExitFailure = 1;  // the run failed
inline constexpr int kExitUsage = 2;    // bad command line

struct RunResult {
  int code = -1;       // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
};

// Runs the shell command `cmd` (stderr joined to stdout) and captures it all.
// OMP_WAIT_POLICY=passive is what cleave and cleaved would set for themselves
// (device/cpu/process_env.h): set here, it spares each run its re-exec,
// a third of a short run's start-up.
inline RunResult run_shell(const std::string& cmd) {
  const std::string line = "OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}; export OMP_WAIT_POLICY; " + cmd + " 2>&1";
  FILE* pipe = popen(line.c_str(), "r");
  REQUIRE(pipe != nullptr);
  RunResult r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return r;
}

// Runs `cleave ARGS` / `cleaved ARGS` (ARGS already shell-quoted where needed).
inline RunResult run_cleave(const std::string& args) { return run_shell("'" + kCleave + "' " + args); }
inline RunResult run_cleaved(const std::string& args) { return run_shell("'" + kCleaved + "' " + args); }

// Expects `r` to have exited with `code` and to say every one of `needles`.
inline void require_exit(const RunResult& r, int code, const std::vector<std::string>& needles) {
  REQUIRE(r.code == code);
  for (const auto& n : needles) {
    INFO("expected in the message: " << n);
    CHECK(r.output.find(n) != std::string::npos);
  }
}

// A run that fails (exit status 1) with a message containing every needle.
inline void require_failure(const std::string& args, const std::vector<std::string>& needles) {
  const RunResult r = run_cleave(args);
  INFO("cleave " << args << "\n" << r.output);
  require_exit(r, kExitFailure, needles);
}

// A bad command line: exit status 2, every needle in the message, and the
// pointer to the command's --help.
inline void require_usage_error(const std::string& args, const std::vector<std::string>& needles) {
  const RunResult r = run_cleave(args);
  INFO("cleave " << args << "\n" << r.output);
  require_exit(r, kExitUsage, needles);
  CHECK(r.output.find("--help") != std::string::npos);
}

inline void require_cleaved_usage_error(const std::string& args, const std::vector<std::string>& needles) {
  const RunResult r = run_cleaved(args);
  INFO("cleaved " << args << "\n" << r.output);
  require_exit(r, kExitUsage, needles);
  CHECK(r.output.find("cleaved --help") != std::string::npos);
}

// Expects every flag to be documented in a command's --help.
inline void require_help_lists(const std::string& command, const std::vector<std::string>& flags) {
  const RunResult r = command == "cleaved" ? run_cleaved("--help") : run_cleave(command + " --help");
  INFO(command << " --help\n" << r.output);
  REQUIRE(r.code == 0);
  for (const auto& flag : flags) {
    INFO(flag);
    CHECK(r.output.find(flag + " ") != std::string::npos);
  }
}

using cleave::test::TempDir;

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace cleave::cli_test
