// plan_report.h: a Plan as JSON (checkable by hand) and as a printed table.
//
// to_json holds the options, the per-layer profile the plan used (FLOPs and
// bytes), every stage (device, layer range, parameters, memory needed and
// available, whether it recomputes its activations, predicted compute and
// transfer time per batch, bottleneck flag)
// and the prediction (bottleneck, batch time, samples/s). format_plan_table
// prints the same per stage, the bottleneck marked.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/planner/planner.h"
#include "core/planner/profile.h"

namespace cleave {

// "512 B", "4.0 KiB", "12.5 MiB", "4.00 GiB".
std::string format_bytes(double bytes);
// "850 us", "12.3 ms", "1.52 s".
std::string format_seconds(double seconds);

// The plan and the model profile it was computed from (keys in docs/planner.md).
nlohmann::json to_json(const Plan& plan, const ModelProfile& model);
// The per-layer profile alone: [{"index", "type", "fwd_flops", ...}, ...].
nlohmann::json profile_to_json(const ModelProfile& model);

// The table: stage, device, layers, parameters, memory used / available,
// recompute (yes / no), compute and transfer per batch, bottleneck marked;
// then the prediction.
std::string format_plan_table(const Plan& plan, const ModelProfile& model);

}  // namespace cleave
