// schedule.h: pipeline schedules as data.
//
// A schedule says, for one stage of a p-stage pipeline and M micro-batches, the
// ordered actions that stage runs for one batch. GPipe runs every forward, then
// every backward; 1F1B runs min(p - s - 1, M) warm-up forwards, then alternates one
// forward with one backward, then drains the remaining backwards, so stage s
// holds at most p - s micro-batches of activations. One executor
// (Stage::run, stage.h) runs any such list; a new schedule is a new generator.
#pragma once

#include <string>
#include <vector>

namespace cleave {

enum class ActionKind {
  receive_activation,  // input of micro-batch mb from the previous stage (or the data source)
  forward,
  send_activation,     // output of mb to the next stage
  receive_gradient,    // gradient of mb's output from the next stage (or the loss, on the last stage)
  backward,
  send_gradient,       // gradient of mb's input to the previous stage
  optimizer_step,      // once per batch, after every backward
};

struct Action {
  ActionKind kind;
  int microbatch = -1;  // -1 for optimizer_step
  bool operator==(const Action&) const = default;
};

// The pipeline schedules, for the executor, the planner, the coordinator and the
// daemons alike (the one schedule vocabulary: flags, JSON and plan files spell
// them "gpipe" and "1f1b").
enum class ScheduleKind { gpipe, one_f_one_b };

// Parses "gpipe" | "1f1b"; throws std::invalid_argument otherwise.
ScheduleKind parse_schedule(const std::string& name);
const char* schedule_name(ScheduleKind kind);  // "gpipe", "1f1b"

// Actions of stage `stage` (0-based) of `stages` for `microbatches` micro-batches.
// The first stage's receive_activation reads from the data source, the last
// stage's receive_gradient comes from the loss; both are still listed so that
// traces and executors see one shape of list everywhere.
std::vector<Action> make_schedule(ScheduleKind kind, int stage, int stages, int microbatches);

// Most micro-batches stage `stage` keeps activations for at once under `kind`:
// M (GPipe), min(stages - stage, M) (1F1B). It depends on stages - stage only
// (the stages from this one to the last), which the planner's search relies on.
// The one in-flight rule: the planner's cost model and the daemon's admission
// check both count a stage's memory with it (core/planner/memory_model.h).
int max_in_flight(ScheduleKind kind, int stage, int stages, int microbatches);

const char* action_name(ActionKind kind);

}  // namespace cleave
