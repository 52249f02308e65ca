// simulate.cpp: see simulate.h.
#include "core/pipeline/simulate.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace cleave {

namespace {

// When each tensor of `batches` batches reaches its stage: [batch][stage][mb], -1 until sent.
using Arrivals = std::vector<std::vector<std::vector<double>>>;

struct Run {
  Run(ScheduleKind kind, int microbatches, const std::vector<StageTimes>& times, const std::vector<LinkTimes>& links,
      int batches)
      : kind(kind), p(static_cast<int>(times.size())), batches(batches), t(times), links(links) {
    for (int s = 0; s < p; ++s) actions.push_back(make_schedule(kind, s, p, microbatches));
    const auto none = std::vector<std::vector<double>>(p, std::vector<double>(microbatches, -1.0));
    activation.assign(batches, none);
    gradient.assign(batches, none);
    clock.assign(p, 0.0);
    batch_end.assign(batches, std::vector<double>(p, 0.0));
    next.assign(p, 0);
    activation_free.assign(links.size(), 0.0);
    gradient_free.assign(links.size(), 0.0);
  }

  ScheduleKind kind;
  int p, batches;
  const std::vector<StageTimes>& t;
  const std::vector<LinkTimes>& links;
  std::vector<std::vector<Action>> actions;  // per stage, one batch
  Arrivals activation, gradient;
  std::vector<double> clock;
  std::vector<std::vector<double>> batch_end;  // [batch][stage]: its optimizer step's end
  std::vector<size_t> next;                    // per stage: batch * actions + position
  std::vector<double> activation_free, gradient_free;  // per cut: when its direction's wire is free

  // A message sent at `at` over a direction whose wire is free at `free`,
  // holding it `wire` seconds: when it arrives.
  static double cross(double at, double& free, double wire, double latency) {
    free = std::max(free, at) + wire;
    return free + latency;
  }

  // Stage s sends over `link`, paying `cpu` of it, in a direction whose wire
  // is free at `free` and takes `wire` seconds a message: when it arrives.
  double send(int s, const LinkTimes& link, double cpu, double& free, double wire) {
    clock[s] += cpu;
    return cross(clock[s], free, std::max(0.0, wire - link.cpu_before - link.cpu_after), link.latency);
  }

  // Runs stage s's next action if its input is there; false when it must wait.
  bool step(int s) {
    const size_t per_batch = actions[s].size();
    const int b = static_cast<int>(next[s] / per_batch);
    const Action& a = actions[s][next[s] % per_batch];
    const StageTimes& st = t[s];
    const auto mb = static_cast<size_t>(std::max(a.microbatch, 0));
    auto wait_for = [&](const Arrivals& from, double cpu) {
      const double at = from[b][s][mb];
      if (at < 0) return false;
      clock[s] = std::max(clock[s], at) + cpu;
      return true;
    };
    switch (a.kind) {
      case ActionKind::receive_activation:
        if (s > 0 && !wait_for(activation, links[s - 1].cpu_after)) return false;
        break;
      case ActionKind::receive_gradient:
        if (s + 1 < p && !wait_for(gradient, links[s].cpu_before)) return false;
        break;
      case ActionKind::forward: clock[s] += st.forward; break;
      case ActionKind::backward: clock[s] += st.backward_input + st.backward_weight; break;
      case ActionKind::backward_input: clock[s] += st.backward_input; break;
      case ActionKind::backward_weight: clock[s] += st.backward_weight; break;
      case ActionKind::send_activation:
        activation[b][s + 1][mb] = send(s, links[s], links[s].cpu_before, activation_free[s], links[s].activation);
        break;
      case ActionKind::send_gradient:
        gradient[b][s - 1][mb] =
            send(s, links[s - 1], links[s - 1].cpu_after, gradient_free[s - 1], links[s - 1].gradient);
        break;
      case ActionKind::optimizer_step:
        clock[s] += st.optimizer;
        batch_end[b][s] = clock[s];
        break;
    }
    ++next[s];
    return true;
  }

  void run_all() {
    const size_t total = static_cast<size_t>(batches);
    for (bool moved = true; moved;) {
      moved = false;
      for (int s = 0; s < p; ++s)
        while (next[s] < total * actions[s].size() && step(s)) moved = true;
    }
    for (int s = 0; s < p; ++s)
      if (next[s] != total * actions[s].size())
        throw std::logic_error(std::string("simulate_pipeline: the ") + schedule_name(kind) +
                               " action lists deadlock at stage " + std::to_string(s));
  }

  double end_of(int b) const { return *std::max_element(batch_end[b].begin(), batch_end[b].end()); }
};

void check(int microbatches, const std::vector<StageTimes>& stages, const std::vector<LinkTimes>& links) {
  if (stages.empty() || microbatches < 1)
    throw std::invalid_argument("simulate_pipeline: needs at least one stage and one micro-batch, got " +
                                std::to_string(stages.size()) + " and " + std::to_string(microbatches));
  for (const StageTimes& s : stages)
    if (!(s.forward >= 0 && s.backward_input >= 0 && s.backward_weight >= 0 && s.optimizer >= 0))
      throw std::invalid_argument("simulate_pipeline: a stage's times must be non-negative");
  if (links.size() + 1 != stages.size())
    throw std::invalid_argument("simulate_pipeline: " + std::to_string(stages.size()) + " stages need " +
                                std::to_string(stages.size() - 1) + " links, got " + std::to_string(links.size()));
  for (const LinkTimes& l : links)
    if (!(l.activation >= 0 && l.gradient >= 0 && l.latency >= 0 && l.cpu_before >= 0 && l.cpu_after >= 0))
      throw std::invalid_argument("simulate_pipeline: a link's times must be non-negative");
}

}  // namespace

SimulatedPipeline simulate_pipeline(ScheduleKind kind, int microbatches, const std::vector<StageTimes>& stages,
                                    double message_seconds) {
  if (!(message_seconds >= 0)) throw std::invalid_argument("simulate_pipeline: message_seconds must be non-negative");
  const size_t cuts = stages.empty() ? 0 : stages.size() - 1;
  return simulate_pipeline(kind, microbatches, stages, std::vector<LinkTimes>(cuts, LinkTimes{0, 0, message_seconds}));
}

SimulatedPipeline simulate_pipeline(ScheduleKind kind, int microbatches, const std::vector<StageTimes>& stages,
                                    const std::vector<LinkTimes>& links) {
  check(microbatches, stages, links);
  const int p = static_cast<int>(stages.size());
  // Enough batches that the later half runs in the steady state: the pipeline
  // fills within the first one or two.
  const int batches = 2 * p + 4;
  Run r(kind, microbatches, stages, links, batches);
  r.run_all();

  SimulatedPipeline out;
  const int from = batches / 2;
  out.batch_seconds = (r.end_of(batches - 1) - r.end_of(from)) / (batches - 1 - from);
  double busy = 0;
  for (const StageTimes& s : stages) {
    out.busy_seconds.push_back(microbatches * (s.forward + s.backward_input + s.backward_weight) + s.optimizer);
    busy += out.busy_seconds.back();
  }
  out.bubble = out.batch_seconds > 0 ? std::max(0.0, 1 - busy / (p * out.batch_seconds)) : 0.0;
  return out;
}

}  // namespace cleave
