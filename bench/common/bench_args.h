// bench_args.h: what the hand-parsed benchmarks (bench_train_step,
// bench_backends) share: list splitting, checked numbers for flags, the
// `--models mlp,cnn:64` syntax, medians, the load average and the core count. Bad flag values
// throw std::invalid_argument with the message the benchmark prints before
// its usage text.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <cstdlib>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/util/stats.h"

namespace cleave::bench {

// `s` cut at every `sep`, empty items kept ("a,,b" -> a, "", b).
inline std::vector<std::string> split_text(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  return out;
}

// The integer `v` given to `flag`; throws unless it is one and >= lo.
inline int64_t parse_int_arg(const std::string& flag, const std::string& v, int64_t lo) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || x < lo)
    throw std::invalid_argument(flag + " expects an integer >= " + std::to_string(lo) + ", got '" + v + "'");
  return x;
}

// The positive, finite number `v` given to `flag`; throws otherwise.
inline double parse_positive_arg(const std::string& flag, const std::string& v) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || !(x > 0) || !std::isfinite(x))
    throw std::invalid_argument(flag + " expects a positive number, got '" + v + "'");
  return x;
}

// One model of `--models`: models/NAME.json trained with batches of `batch`.
struct ModelRun {
  std::string name;  // mlp | cnn
  int64_t batch = 0;
};

// `--models mlp,cnn:32`: mlp or cnn, each optionally with :BATCH (default 128
// for mlp, 64 for cnn). Throws for an unknown entry, a bad batch or an empty list.
inline std::vector<ModelRun> parse_model_runs(const std::string& text) {
  std::vector<ModelRun> out;
  for (const std::string& m : split_text(text, ',')) {
    const auto parts = split_text(m, ':');
    if (parts.empty() || parts.size() > 2 || (parts[0] != "mlp" && parts[0] != "cnn"))
      throw std::invalid_argument("--models: unknown entry '" + m + "' (expected mlp, cnn, mlp:BATCH or cnn:BATCH)");
    const int64_t batch = parts.size() == 2 ? parse_int_arg("--models batch", parts[1], 1) : (parts[0] == "mlp" ? 128 : 64);
    out.push_back({parts[0], batch});
  }
  if (out.empty()) throw std::invalid_argument("--models is empty");
  return out;
}

using cleave::median;  // core/util/stats.h

// The machine's load averages over the last 1, 5 and 15 minutes
// (getloadavg(3), i.e. /proc/loadavg), or none when they cannot be read.
inline std::vector<double> load_averages() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return {};
  return {l[0], l[1], l[2]};
}

// The last minute's load average, or -1 when it cannot be read: every table
// says under what load it was measured.
inline double load_average() {
  const std::vector<double> l = load_averages();
  return l.empty() ? -1 : l[0];
}

// Cores this process may run on (its CPU affinity), at least 1.
inline int online_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

}  // namespace cleave::bench
