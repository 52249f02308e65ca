// progress.h: a one-line progress bar for terminals (epoch, step, loss, samples/s).
//
// Writes to stderr only when it is a terminal (or when forced), redrawing at most
// ~10 times a second; on a pipe it prints one summary line per epoch instead, so
// logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace cleave {

class ProgressBar {
 public:
  // `label` prefixes the line, e.g. "epoch" or "round".
  explicit ProgressBar(bool enabled, std::string label = "epoch");
  // Starts unit `index` (1-based) of `count`, with `steps` steps in it.
  void begin(int64_t index, int64_t count, int64_t steps);
  // Reports progress inside the current unit.
  void update(int64_t step, double loss, double samples_per_sec);
  // Ends the current unit with a summary (e.g. "test acc 0.8912").
  void end(const std::string& summary);
  bool is_terminal() const { return terminal_; }

 private:
  void draw(bool force);
  bool enabled_, terminal_;
  std::string label_;
  int64_t index_ = 0, count_ = 0, steps_ = 0, step_ = 0;
  double loss_ = 0, rate_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace cleave
