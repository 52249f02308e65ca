// test_stage_state.cpp: a pipeline stage's state on the wire (core/runtime/
// stage_state.h): round trips with and without the optimizer, refusals that
// leave the stage as it was, and the cutting and re-assembly of a whole-model
// checkpoint at stage boundaries.
#include <catch2/catch.hpp>

#include <numeric>
#include <string>
#include <vector>

#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/optim/optimizer.h"
#include "core/pipeline/stage.h"
#include "core/runtime/common/stage_state.h"
#include "device/device.h"

using namespace cleave;

namespace {

ModelSpec cnn() { return ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json"); }

OptimizerConfig adam() {
  OptimizerConfig o;
  o.kind = "adam";
  return o;
}

std::vector<float> ramp(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

}  // namespace

TEST_CASE("a stage state survives the wire with and without its optimizer", "[pipeline][checkpoint]") {
  auto cpu = open_device("cpu", DeviceOptions{1, 0, 0, ""});
  const ModelSpec spec = cnn();
  Stage stage(*cpu, spec, 3, 10, 1, 2, adam());
  const int64_t n = stage.partition().param_count();
  StageState s{1, 17, ramp(static_cast<size_t>(n), 0.f), {ramp(static_cast<size_t>(n), 1.f), ramp(static_cast<size_t>(n), 2.f)}};
  const StageState back = read_stage_state(stage_state_message(s, 7), n, 2);
  CHECK(back.stage == 1);
  CHECK(back.steps_taken == 17);
  CHECK(back.params == s.params);
  CHECK(back.buffers == s.buffers);
  restore_stage_state(stage, back);
  const StageState captured = capture_stage_state(stage, true);
  CHECK(captured.params == s.params);
  CHECK(captured.buffers == s.buffers);
  CHECK(captured.steps_taken == 17);
  CHECK(stage.optimizer().steps_taken() == 17);

  // Weights only (--init): the optimizer keeps its state.
  StageState w{1, 0, ramp(static_cast<size_t>(n), 5.f), {}};
  const StageState wb = read_stage_state(stage_state_message(w, 8), n, 2);
  CHECK(wb.buffers.empty());
  restore_stage_state(stage, wb);
  CHECK(stage.partition().params().to_host() == w.params);
  CHECK(stage.optimizer().steps_taken() == 17);
  CHECK(capture_stage_state(stage, false).buffers.empty());
}

TEST_CASE("a stage state that does not fit is refused and changes nothing", "[pipeline][checkpoint]") {
  auto cpu = open_device("cpu", DeviceOptions{1, 0, 0, ""});
  const ModelSpec spec = cnn();
  Stage stage(*cpu, spec, 3, 10, 1, 2, adam());
  stage.partition().init(3);
  const std::vector<float> before = stage.partition().params().to_host();
  const int64_t n = stage.partition().param_count();
  const auto un = static_cast<size_t>(n);
  // A frame of another size.
  StageState odd{1, 1, ramp(un + 1, 0.f), {}};
  CHECK_THROWS_WITH(read_stage_state(stage_state_message(odd, 1), n, 2), Catch::Contains("takes " + std::to_string(n)));
  // Another stage's state.
  CHECK_THROWS_WITH(restore_stage_state(stage, StageState{0, 1, ramp(un, 0.f), {}}), Catch::Contains("stage 0"));
  // Optimizer buffers of the wrong length.
  CHECK_THROWS_WITH(restore_stage_state(stage, StageState{1, 1, ramp(un, 0.f), {ramp(un, 0.f), ramp(un - 1, 0.f)}}),
                    Catch::Contains("exp_avg_sq"));
  // Not a weights message.
  transport::Message m;
  m.body = transport::HeartbeatMsg{};
  CHECK_THROWS_WITH(read_stage_state(m, n, 2), Catch::Contains("weights message"));
  CHECK(stage.partition().params().to_host() == before);
  CHECK(stage.optimizer().steps_taken() == 0);
}

TEST_CASE("whole-model checkpoints cut into stages and back", "[pipeline][checkpoint]") {
  const ModelSpec spec = cnn();
  const std::vector<int> bounds = {0, 4, 10};
  const std::vector<int64_t> counts = stage_param_counts(spec, bounds);
  REQUIRE(counts.size() == 2);
  CHECK(counts[0] == 32 * 9 + 32 + 64 * 288 + 64);  // conv1, conv2
  CHECK(counts[0] + counts[1] == 421642);
  TrainConfig cfg;
  cfg.batch = 64;
  cfg.seed = 9;
  std::vector<StageState> stages;
  for (int s = 0; s < 2; ++s) {
    const auto n = static_cast<size_t>(counts[static_cast<size_t>(s)]);
    stages.push_back({s, 5, ramp(n, s * 1e6f), {ramp(n, 1.f), ramp(n, 2.f)}});
  }
  const TrainingState st = assemble_training_state(cfg, spec, adam(), TrainPosition{0, 5, 5}, stages);
  CHECK(st.params.size() == 421642);
  CHECK(st.params[static_cast<size_t>(counts[0])] == 1e6f);  // stage 1 follows stage 0
  CHECK(st.optimizer_state["steps_taken"] == 5);
  CHECK(st.optimizer_blocks.size() == 2);
  stages[1].steps_taken = 4;
  CHECK_THROWS_WITH(assemble_training_state(cfg, spec, adam(), TrainPosition{0, 5, 5}, stages),
                    Catch::Contains("took 4 optimizer steps"));
}
