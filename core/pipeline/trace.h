// trace.h: per-stage timelines written as a Chrome trace (opens in Perfetto or
// chrome://tracing): one track per stage, one slice per forward, backward (or,
// under zb1, its input half B and weight half W), send, receive, optimizer step,
// and the idle gaps between them.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cleave {

struct TraceEvent {
  std::string name;      // forward | backward | B | W | send | receive | optimizer | idle
  int stage = 0;
  int64_t step = 0;
  int microbatch = -1;
  double start_us = 0;   // microseconds since the trace's origin
  double duration_us = 0;
};

// Collects events of one stage (thread-safe). Times are relative to `origin`,
// which every stage of a run shares (the coordinator's clock for local runs;
// each daemon's own clock, re-based by the coordinator, for distributed runs).
class StageTracer {
 public:
  explicit StageTracer(int stage, std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now());
  double now_us() const;
  void add(const std::string& name, int64_t step, int microbatch, double start_us, double end_us);
  std::vector<TraceEvent> events() const;
  // Busy time per event name, in seconds.
  nlohmann::json busy_seconds() const;

 private:
  int stage_;
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
};

// Chrome trace JSON ({"traceEvents": [...]}) for the events of all stages, with
// idle slices filling the gaps on each stage's track, and track names
// "stage i (device)".
nlohmann::json chrome_trace(const std::vector<TraceEvent>& events, const std::vector<std::string>& track_names);

nlohmann::json to_json(const TraceEvent& e);
TraceEvent trace_event_from_json(const nlohmann::json& j);

}  // namespace cleave
