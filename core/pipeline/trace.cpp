// trace.cpp: see trace.h.
#include "core/pipeline/trace.h"

#include <algorithm>
#include <map>

namespace cleave {

StageTracer::StageTracer(int stage, std::chrono::steady_clock::time_point origin) : stage_(stage), origin_(origin) {}

double StageTracer::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

void StageTracer::add(const std::string& name, int64_t step, int microbatch, double start_us, double end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, stage_, step, microbatch, start_us, end_us - start_us});
}

std::vector<TraceEvent> StageTracer::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

nlohmann::json StageTracer::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, double> sums;
  for (const auto& e : events_) sums[e.name] += e.duration_us * 1e-6;
  nlohmann::json j = nlohmann::json::object();
  for (auto& [k, v] : sums) j[k] = v;
  return j;
}

nlohmann::json to_json(const TraceEvent& e) {
  return {{"name", e.name}, {"stage", e.stage}, {"step", e.step}, {"mb", e.microbatch},
          {"ts", e.start_us}, {"dur", e.duration_us}};
}

TraceEvent trace_event_from_json(const nlohmann::json& j) {
  TraceEvent e;
  e.name = j.at("name").get<std::string>();
  e.stage = j.at("stage").get<int>();
  e.step = j.at("step").get<int64_t>();
  e.microbatch = j.at("mb").get<int>();
  e.start_us = j.at("ts").get<double>();
  e.duration_us = j.at("dur").get<double>();
  return e;
}

nlohmann::json chrome_trace(const std::vector<TraceEvent>& events, const std::vector<std::string>& track_names) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < track_names.size(); ++i)
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", i},
                   {"args", {{"name", track_names[i]}}}});
  std::map<int, std::vector<TraceEvent>> by_stage;
  for (const auto& e : events) by_stage[e.stage].push_back(e);
  for (auto& [stage, evs] : by_stage) {
    std::sort(evs.begin(), evs.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
    double cursor = evs.empty() ? 0 : evs.front().start_us;
    for (const auto& e : evs) {
      if (e.start_us > cursor + 1.0)
        out.push_back({{"name", "idle"}, {"cat", "idle"}, {"ph", "X"}, {"pid", 1}, {"tid", stage},
                       {"ts", cursor}, {"dur", e.start_us - cursor}});
      nlohmann::json args = {{"step", e.step}};
      if (e.microbatch >= 0) args["microbatch"] = e.microbatch;
      out.push_back({{"name", e.name}, {"cat", e.name}, {"ph", "X"}, {"pid", 1}, {"tid", stage},
                     {"ts", e.start_us}, {"dur", e.duration_us}, {"args", args}});
      cursor = std::max(cursor, e.start_us + e.duration_us);
    }
  }
  return {{"traceEvents", out}, {"displayTimeUnit", "ms"}};
}

}  // namespace cleave
