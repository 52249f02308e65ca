// schedule.h: pipeline schedules as data.
//
// A schedule says, for one stage of a p-stage pipeline and M micro-batches, the
// ordered actions that stage runs for one batch. GPipe runs every forward, then
// every backward; 1F1B runs min(p - s - 1, M) warm-up forwards, then alternates one
// forward with one backward, then drains the remaining backwards, so stage s
// holds at most p - s micro-batches of activations. ZB-H1 (zero bubble, Qi et
// al. 2024) splits each backward into B (the input gradient, which the previous
// stage waits for) and W (the weight gradient, which nobody waits for): it runs
// 1F1B's order with B in place of the backward and defers stage s's W's by s
// micro-batches, so that the W's fill the cool-down. With equal F, B and W
// times its bubble is (p - 1) / (3M + p - 1) against 1F1B's (p - 1) / (M + p - 1),
// with the same messages on the links. One executor (Stage::run, stage.h) runs
// any such list; a new schedule is a new generator.
#pragma once

#include <string>
#include <vector>

namespace cleave {

enum class ActionKind {
  receive_activation,  // input of micro-batch mb from the previous stage (or the data source)
  forward,
  send_activation,     // output of mb to the next stage
  receive_gradient,    // gradient of mb's output from the next stage (or the loss, on the last stage)
  backward,            // B and W together (gpipe, 1f1b)
  send_gradient,       // gradient of mb's input to the previous stage
  optimizer_step,      // once per batch, after every backward
  backward_input,      // B: mb's input gradient; its weight gradient waits for backward_weight (zb1)
  backward_weight,     // W: mb's weight gradient, any time after its backward_input (zb1)
};

struct Action {
  ActionKind kind;
  int microbatch = -1;  // -1 for optimizer_step
  bool operator==(const Action&) const = default;
};

// The pipeline schedules, for the executor, the planner, the coordinator and the
// daemons alike (the one schedule vocabulary: flags, JSON and plan files spell
// them "gpipe", "1f1b" and "zb1").
enum class ScheduleKind { gpipe, one_f_one_b, zb1 };

// Parses "gpipe" | "1f1b" | "zb1"; throws std::invalid_argument otherwise.
ScheduleKind parse_schedule(const std::string& name);
const char* schedule_name(ScheduleKind kind);  // "gpipe", "1f1b", "zb1"

// Actions of stage `stage` (0-based) of `stages` for `microbatches` micro-batches.
// The first stage's receive_activation reads from the data source, the last
// stage's receive_gradient comes from the loss; both are still listed so that
// traces and executors see one shape of list everywhere.
std::vector<Action> make_schedule(ScheduleKind kind, int stage, int stages, int microbatches);

// Most micro-batches stage `stage` keeps activations for at once under `kind`:
// M (GPipe), min(stages - stage, M) (1F1B), min(stages, M) (ZB-H1, on every
// stage: a micro-batch is held from its forward to its W, and stage s defers s
// W's on top of 1F1B's stages - s; after its B a micro-batch keeps only what W
// needs, never more than its full stash, so counting it whole is an upper
// bound). Under GPipe and 1F1B it depends on stages - stage only (the stages
// from this one to the last), which the planner's search relies on; under ZB-H1
// on stages, which the search bounds by its most stages (docs/planner.md).
// The one in-flight rule: the planner's cost model and the daemon's admission
// check both count a stage's memory with it (core/planner/memory_model.h).
int max_in_flight(ScheduleKind kind, int stage, int stages, int microbatches);

// Whether max_in_flight(kind, ...) depends on stages - stage only (GPipe, 1F1B).
bool in_flight_by_suffix(ScheduleKind kind);

// Fraction of a batch's time a stage idles under `kind` when links are free and
// every stage takes the same time per micro-batch, of which `weight_share` in
// W (ZB-H1 only: 1/3 when F, B and W take the same time, 0 when no layer
// splits its backward): (p - 1) / (M + p - 1) for GPipe and 1F1B; for ZB-H1
// idle / (M + idle) with idle = (p - 1)(1 - 2w) + max(0, p - M) w, which is
// (p - 1) / (3M + p - 1) with equal F, B, W and M >= p (the term in p - M:
// too few W's to fill the drain). The theory: the planner's batch time runs
// the plan's own stage and link times (simulate_pipeline, simulate.h), which
// for equal stages and free links is bottleneck / (1 - bubble).
double bubble_fraction(ScheduleKind kind, int stages, int microbatches, double weight_share = 1.0 / 3);

const char* action_name(ActionKind kind);

}  // namespace cleave
