// python_script.h: the benchmarks' PyTorch comparisons run python scripts
// (bench/gpt/torch_gpt.py, bench/pipeline/torch_pipeline.py) that print one
// JSON object as their last line of stdout. This finds the python (--python,
// else $CLEAVE_TORCH_PYTHON, else python3), says plainly why PyTorch is not
// there when it is not, and runs a script for its JSON answer.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace cleave::bench {

// Runs a shell command; returns its exit status (-1 when it did not exit) and stdout (stderr passes through).
inline std::pair<int, std::string> run_capture(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `s` as one single-quoted shell word.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The python of --python (`given`), else $CLEAVE_TORCH_PYTHON, else python3.
inline std::string torch_python(const std::string& given) {
  if (!given.empty()) return given;
  const char* env = std::getenv("CLEAVE_TORCH_PYTHON");
  return env && *env ? env : "python3";
}

// A python with torch: its version, or why there is none (`missing`, empty when there is one).
class TorchPython {
 public:
  // `enabled` false (--no-torch) marks it missing without asking python.
  TorchPython(std::string python, bool enabled = true) : python_(std::move(python)) {
    if (!enabled) {
      missing_ = "--no-torch";
      return;
    }
    const auto [code, out] = run_capture(shell_quote(python_) + " -c 'import torch, numpy; print(torch.__version__)' 2>&1");
    if (code != 0) missing_ = "PyTorch not importable by " + python_ + " (set --python or CLEAVE_TORCH_PYTHON)";
    else version_ = out.substr(0, out.find('\n'));
  }
  bool available() const { return missing_.empty(); }
  const std::string& missing() const { return missing_; }
  const std::string& version() const { return version_; }
  const std::string& python() const { return python_; }

  // The JSON answer of `script ARGS` (`args` already shell-quoted); throws with
  // the script's output unless it exits 0 with {"ok": true, ...} as its last line.
  nlohmann::json run(const std::string& script, const std::string& args) const {
    const auto [code, out] = run_capture(shell_quote(python_) + " " + shell_quote(script) + " " + args);
    const size_t end = out.find_last_not_of("\n");  // torch may warn on lines before the answer
    const size_t begin = end == std::string::npos ? 0 : out.rfind('\n', end);
    const std::string last = end == std::string::npos ? "" : out.substr(begin == std::string::npos ? 0 : begin + 1);
    nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
    if (code != 0 || !j.is_object() || !j.value("ok", false))
      throw std::runtime_error(script + " " + args + " failed (exit " + std::to_string(code) + "): " + out);
    return j;
  }

 private:
  std::string python_, missing_, version_;
};

}  // namespace cleave::bench
