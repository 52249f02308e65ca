// progress.cpp: terminal progress bar; see progress.h.
#include "core/train/progress.h"

#include <unistd.h>

#include <cstdio>

namespace cleave {

ProgressBar::ProgressBar(bool enabled, std::string label)
    : enabled_(enabled), terminal_(isatty(STDERR_FILENO) != 0), label_(std::move(label)) {}

void ProgressBar::begin(int64_t index, int64_t count, int64_t steps) {
  index_ = index;
  count_ = count;
  steps_ = steps;
  step_ = 0;
  loss_ = rate_ = 0;
  last_draw_ = {};
}

void ProgressBar::update(int64_t step, double loss, double samples_per_sec) {
  step_ = step;
  loss_ = loss;
  rate_ = samples_per_sec;
  draw(false);
}

void ProgressBar::draw(bool force) {
  if (!enabled_ || !terminal_) return;
  auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const int width = 30;
  int filled = steps_ > 0 ? static_cast<int>(width * step_ / steps_) : 0;
  char bar[width + 1];
  for (int i = 0; i < width; ++i) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
  bar[width] = 0;
  std::fprintf(stderr, "\r%s %lld/%lld [%s] step %lld/%lld  loss %.4f  %.0f samples/s ", label_.c_str(),
               static_cast<long long>(index_), static_cast<long long>(count_), bar,
               static_cast<long long>(step_), static_cast<long long>(steps_), loss_, rate_);
  std::fflush(stderr);
}

void ProgressBar::end(const std::string& summary) {
  if (!enabled_) return;
  if (terminal_) {
    draw(true);
    std::fprintf(stderr, " %s\n", summary.c_str());
  } else {
    std::fprintf(stderr, "%s %lld/%lld: %lld steps, loss %.4f, %.0f samples/s, %s\n", label_.c_str(),
                 static_cast<long long>(index_), static_cast<long long>(count_),
                 static_cast<long long>(step_), loss_, rate_, summary.c_str());
  }
  std::fflush(stderr);
}

}  // namespace cleave
