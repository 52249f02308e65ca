// schedule.cpp: GPipe, 1F1B and ZB-H1 generators; see schedule.h.
#include "core/pipeline/schedule.h"

#include <algorithm>
#include <stdexcept>

namespace cleave {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b") return ScheduleKind::one_f_one_b;
  if (name == "zb1") return ScheduleKind::zb1;
  throw std::invalid_argument("unknown schedule '" + name + "': use gpipe, 1f1b or zb1");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::zb1: return "zb1";
  }
  return "?";
}

const char* action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::receive_activation: return "receive";
    case ActionKind::forward: return "forward";
    case ActionKind::send_activation: return "send";
    case ActionKind::receive_gradient: return "receive";
    case ActionKind::backward: return "backward";
    case ActionKind::send_gradient: return "send";
    case ActionKind::optimizer_step: return "optimizer";
    case ActionKind::backward_input: return "B";
    case ActionKind::backward_weight: return "W";
  }
  return "?";
}

namespace {

void add_forward(std::vector<Action>& out, int mb, bool last) {
  out.push_back({ActionKind::receive_activation, mb});
  out.push_back({ActionKind::forward, mb});
  if (!last) out.push_back({ActionKind::send_activation, mb});
}

// `kind` is backward (B and W together) or backward_input (B alone).
void add_backward(std::vector<Action>& out, int mb, bool first, ActionKind kind = ActionKind::backward) {
  out.push_back({ActionKind::receive_gradient, mb});
  out.push_back({kind, mb});
  if (!first) out.push_back({ActionKind::send_gradient, mb});
}

// 1F1B's order with B for the backward; stage s runs the W of a micro-batch
// once s later B's have run (the deferred W's fill the cool-down), and the last
// s W's after the last B.
void add_zb1(std::vector<Action>& out, int stage, int stages, int microbatches) {
  const bool first = stage == 0, last = stage == stages - 1;
  const int warmup = std::min(stages - stage - 1, microbatches);
  int next_fwd = 0, next_b = 0, next_w = 0;
  auto b_then_w = [&] {
    add_backward(out, next_b++, first, ActionKind::backward_input);
    if (next_b - next_w > stage) out.push_back({ActionKind::backward_weight, next_w++});
  };
  for (; next_fwd < warmup; ++next_fwd) add_forward(out, next_fwd, last);
  while (next_fwd < microbatches) {
    add_forward(out, next_fwd++, last);
    b_then_w();
  }
  while (next_b < microbatches) b_then_w();
  while (next_w < microbatches) out.push_back({ActionKind::backward_weight, next_w++});
}

}  // namespace

std::vector<Action> make_schedule(ScheduleKind kind, int stage, int stages, int microbatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microbatches < 1)
    throw std::invalid_argument("make_schedule: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                                " with " + std::to_string(microbatches) + " micro-batches is not a pipeline");
  const bool first = stage == 0, last = stage == stages - 1;
  std::vector<Action> out;
  if (kind == ScheduleKind::gpipe) {
    for (int mb = 0; mb < microbatches; ++mb) add_forward(out, mb, last);
    for (int mb = 0; mb < microbatches; ++mb) add_backward(out, mb, first);
  } else if (kind == ScheduleKind::zb1) {
    add_zb1(out, stage, stages, microbatches);
  } else {
    const int warmup = std::min(stages - stage - 1, microbatches);
    int next_fwd = 0, next_bwd = 0;
    for (; next_fwd < warmup; ++next_fwd) add_forward(out, next_fwd, last);
    while (next_fwd < microbatches) {
      add_forward(out, next_fwd++, last);
      add_backward(out, next_bwd++, first);
    }
    while (next_bwd < microbatches) add_backward(out, next_bwd++, first);
  }
  out.push_back({ActionKind::optimizer_step, -1});
  return out;
}

int max_in_flight(ScheduleKind kind, int stage, int stages, int microbatches) {
  if (kind == ScheduleKind::gpipe) return microbatches;
  if (kind == ScheduleKind::zb1) return std::min(stages, microbatches);
  return std::min(stages - stage, microbatches);
}

bool in_flight_by_suffix(ScheduleKind kind) { return kind != ScheduleKind::zb1; }

double bubble_fraction(ScheduleKind kind, int stages, int microbatches, double weight_share) {
  const double p = stages, m = microbatches;
  // In units of one micro-batch's F + B + W (= 1; W is w of it, F + B the
  // rest): GPipe and 1F1B idle p - 1 units. ZB-H1's drain waits only for the
  // F + B of the stages below, its W's fill the rest: (p - 1)(1 - 2w), which
  // is (p - 1) / 3 units with equal F, B and W, and p - 1 when no layer splits
  // its backward (w = 0: the schedule is 1F1B's). With M < p there are too
  // few W's to fill the drain: p - M more W's worth of idle (simulate_pipeline,
  // simulate.h, runs make_schedule to the same numbers: tests/pipeline).
  if (kind == ScheduleKind::zb1) {
    const double w = std::clamp(weight_share, 0.0, 0.5);
    const double idle = (p - 1) * (1 - 2 * w) + std::max(0.0, p - m) * w;
    return idle / (m + idle);
  }
  return (p - 1) / (m + p - 1);
}

}  // namespace cleave
