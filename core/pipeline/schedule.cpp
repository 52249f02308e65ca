// schedule.cpp: GPipe and 1F1B generators; see schedule.h.
#include "core/pipeline/schedule.h"

#include <algorithm>
#include <stdexcept>

namespace cleave {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b") return ScheduleKind::one_f_one_b;
  throw std::invalid_argument("unknown schedule '" + name + "': use gpipe or 1f1b");
}

const char* schedule_name(ScheduleKind kind) { return kind == ScheduleKind::gpipe ? "gpipe" : "1f1b"; }

const char* action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::receive_activation: return "receive";
    case ActionKind::forward: return "forward";
    case ActionKind::send_activation: return "send";
    case ActionKind::receive_gradient: return "receive";
    case ActionKind::backward: return "backward";
    case ActionKind::send_gradient: return "send";
    case ActionKind::optimizer_step: return "optimizer";
  }
  return "?";
}

namespace {

void add_forward(std::vector<Action>& out, int mb, bool last) {
  out.push_back({ActionKind::receive_activation, mb});
  out.push_back({ActionKind::forward, mb});
  if (!last) out.push_back({ActionKind::send_activation, mb});
}

void add_backward(std::vector<Action>& out, int mb, bool first) {
  out.push_back({ActionKind::receive_gradient, mb});
  out.push_back({ActionKind::backward, mb});
  if (!first) out.push_back({ActionKind::send_gradient, mb});
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
  return std::min(stages - stage, microbatches);
}

}  // namespace cleave
