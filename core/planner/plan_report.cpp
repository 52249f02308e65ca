// plan_report.cpp: JSON and table renderings of a Plan.
#include "core/planner/plan_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

namespace cleave {

using nlohmann::json;

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", v);
  else std::snprintf(buf, sizeof buf, std::fabs(v) < 10 ? "%.2f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string format_seconds(double s) {
  char buf[48];
  if (!std::isfinite(s)) return "inf";
  if (s == 0) return "0";
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  else if (s < 1) std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

json profile_to_json(const ModelProfile& model) {
  json layers = json::array();
  for (int i = 0; i < model.num_layers(); ++i) {
    const LayerProfile& l = model.layers[i];
    layers.push_back({{"index", i},
                      {"type", l.type},
                      {"fwd_flops", l.fwd_flops},
                      {"bwd_flops", l.bwd_flops},
                      {"weight_grad_flops", l.weight_grad_flops},
                      {"params", l.param_count},
                      {"param_bytes", l.param_bytes},
                      {"grad_bytes", l.grad_bytes},
                      {"optimizer_state_bytes", l.optimizer_state_bytes},
                      {"out_act_bytes", l.out_act_bytes},
                      {"stash_bytes", l.stash_bytes},
                      {"workspace_bytes", l.workspace_bytes}});
  }
  return layers;
}

json to_json(const Plan& plan, const ModelProfile& model) {
  json stages = json::array();
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    json j = {{"stage", s},
              {"device", st.device_name},
              {"layers", {st.begin, st.end}},
              {"params", st.params},
              {"in_flight", st.in_flight},
              {"memory_bytes", st.memory_bytes},
              {"recompute", st.recompute},
              {"weight_state_bytes", st.weight_state_bytes},
              {"memory_available", st.memory_available},
              {"compute_seconds", st.compute_seconds},
              {"transfer_seconds", st.transfer_seconds},
              {"transfer_bytes", st.transfer_bytes},
              {"link_cpu_seconds", st.link_cpu_seconds},
              {"bottleneck", st.bottleneck},
              {"bottleneck_kind", st.bottleneck ? json(st.bottleneck_kind) : json(nullptr)}};
    if (s + 1 < plan.stages.size()) j["next_device"] = plan.stages[s + 1].device_name;
    stages.push_back(std::move(j));
  }
  return {{"model", model.name},
          {"optimizer", model.optimizer},
          {"schedule", schedule_name(plan.options.schedule)},
          {"microbatches", plan.options.microbatches},
          {"microbatches_auto", plan.options.microbatches_auto},
          {"batch", plan.options.batch},
          {"microbatch_size", plan.microbatch_size},
          {"encoding", transport::encoding_name(plan.options.encoding)},
          {"recompute", recompute_name(plan.options.recompute)},
          {"num_stages", plan.stages.size()},
          {"stages", stages},
          {"unused_devices", plan.unused_devices},
          {"bottleneck_seconds", plan.bottleneck_seconds},
          {"predicted_batch_seconds", plan.batch_seconds},
          {"predicted_bubble", plan.bottleneck_seconds > 0 ? 1 - plan.bottleneck_seconds / plan.batch_seconds : 0.0},
          {"weight_share", plan.weight_share},
          {"predicted_samples_per_second", plan.samples_per_second},
          {"search_runs", plan.search_runs},
          {"shared_host_slowdown", plan.shared_host_slowdown},
          {"input_bytes_per_sample", model.input_bytes_per_sample},
          {"layers", profile_to_json(model)}};
}

std::string format_plan_table(const Plan& plan, const ModelProfile& model) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"stage", "device", "layers", "params", "memory used / available", "recompute", "compute/batch",
                  "transfer/batch", ""});
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    std::string layers = st.end - st.begin == 1 ? std::to_string(st.begin)
                                                : std::to_string(st.begin) + "-" + std::to_string(st.end - 1);
    std::string types;
    if (st.end - st.begin <= 3) {
      for (int i = st.begin; i < st.end; ++i) types += (i > st.begin ? "," : "") + model.layers[i].type;
      layers += " (" + types + ")";
    } else {
      layers += " (" + std::to_string(st.end - st.begin) + " layers)";
    }
    std::string mark = st.bottleneck ? "<- bottleneck (" + st.bottleneck_kind + ")" : "";
    rows.push_back({std::to_string(s), st.device_name, layers, std::to_string(st.params),
                    format_bytes(static_cast<double>(st.memory_bytes)) + " / " +
                        format_bytes(static_cast<double>(st.memory_available)),
                    st.recompute ? "yes" : "no", format_seconds(st.compute_seconds),
                    s + 1 < plan.stages.size() ? format_seconds(st.transfer_seconds) + " -> " + plan.stages[s + 1].device_name
                                               : "-",
                    mark});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::ostringstream out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
  const PlanOptions& o = plan.options;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.1f", plan.samples_per_second);
  out << "predicted: bottleneck " << format_seconds(plan.bottleneck_seconds) << " per batch of " << o.batch
      << "; batch time " << format_seconds(plan.batch_seconds) << " (" << schedule_name(o.schedule) << ", "
      << o.microbatches << " micro-batches of " << plan.microbatch_size
      << (o.microbatches_auto ? " (--microbatches auto)" : "") << ", " << plan.stages.size()
      << " stage" << (plan.stages.size() == 1 ? "" : "s") << "); " << buf << " samples/s\n";
  std::string link_cpu;
  for (size_t s = 0; s < plan.stages.size(); ++s)
    if (plan.stages[s].link_cpu_seconds > 0)
      link_cpu += (link_cpu.empty() ? "" : ", ") + std::string("stage ") + std::to_string(s) + " " +
                  format_seconds(plan.stages[s].link_cpu_seconds);
  if (!link_cpu.empty())
    out << "links' CPU on cores the stages compute on, per batch (in the batch time): " << link_cpu << "\n";
  if (plan.shared_host_slowdown > 1) {
    std::snprintf(buf, sizeof buf, "%.2f", plan.shared_host_slowdown);
    out << "devices sharing a machine's cores: their compute counted " << buf << "x slower for this stage count\n";
  }
  if (!plan.unused_devices.empty()) {
    out << "unused devices:";
    for (const std::string& d : plan.unused_devices) out << " " << d;
    out << "\n";
  }
  return out.str();
}

}  // namespace cleave
