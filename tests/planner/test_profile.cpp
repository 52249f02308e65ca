// test_profile.cpp: per-layer profiles computed from the demo model files.
#include <catch2/catch.hpp>

#include "core/model/model_spec.h"
#include "core/planner/planner.h"
#include "core/planner/profile.h"

using namespace cleave;

TEST_CASE("profile of the MLP demo model", "[planner][profile]") {
  const ModelSpec spec = ModelSpec::load(CLEAVE_SOURCE_DIR "/models/mlp.json");
  const ModelProfile adam = profile_model(spec, "adam", 0);
  REQUIRE(adam.num_layers() == 8);
  CHECK(adam.input_bytes_per_sample == 4 * 784);
  const LayerProfile& fc1 = adam.layers[1];
  CHECK(fc1.type == "linear");
  CHECK(fc1.param_count == 784 * 1024 + 1024);
  CHECK(fc1.param_bytes == 4 * fc1.param_count);
  CHECK(fc1.grad_bytes == fc1.param_bytes);
  CHECK(fc1.optimizer_state_bytes == 2 * fc1.param_bytes);
  CHECK(fc1.fwd_flops > 2 * 784 * 1024 - 1);
  CHECK(fc1.bwd_flops == 2 * fc1.fwd_flops);
  CHECK(fc1.out_act_bytes == 4 * 1024);
  CHECK(fc1.stash_bytes >= 4 * 784);
  CHECK(fc1.weight_grad_flops == fc1.fwd_flops);  // linear splits its backward: dW in W
  const LayerProfile& relu = adam.layers[2];
  CHECK(relu.weight_grad_flops == 0);
  CHECK(relu.param_count == 0);
  CHECK(relu.bwd_flops == relu.fwd_flops);
  CHECK(relu.optimizer_state_bytes == 0);

  CHECK(profile_model(spec, "sgd", 0).layers[1].optimizer_state_bytes == 0);
  CHECK(profile_model(spec, "sgd", 0.9).layers[1].optimizer_state_bytes == fc1.param_bytes);
  CHECK(profile_model(spec, "adamw", 0).layers[1].optimizer_state_bytes == 2 * fc1.param_bytes);
  CHECK_THROWS_WITH(profile_model(spec, "lion", 0), Catch::Contains("unknown optimizer 'lion'"));
}

TEST_CASE("profile of the CNN demo model plans onto two devices", "[planner][profile]") {
  const ModelSpec spec = ModelSpec::load(CLEAVE_SOURCE_DIR "/models/cnn.json");
  const ModelProfile prof = profile_model(spec, "adam", 0);
  REQUIRE(prof.num_layers() == spec.num_layers());
  int64_t params = 0;
  for (const LayerProfile& l : prof.layers) {
    CHECK(l.out_act_bytes > 0);
    params += l.param_count;
  }
  CHECK(params == (32 * 9 + 32) + (64 * 32 * 9 + 64) + (3136 * 128 + 128) + (128 * 10 + 10));
  CHECK(prof.layers[0].out_act_bytes == 4 * 32 * 28 * 28);
  Cluster c;
  c.devices.push_back({"a", int64_t{1} << 30, 50, std::nullopt});
  c.devices.push_back({"b", int64_t{1} << 30, 50, std::nullopt});
  const Plan p = plan(prof, c, PlanOptions{});
  int covered = 0;
  for (const StagePlan& st : p.stages) covered += st.end - st.begin;
  CHECK(covered == prof.num_layers());
  CHECK(p.bottleneck_seconds > 0);
}

TEST_CASE("the CNN's convolutions keep their whole backward in B, so its ZB-H1 theory is near 1F1B's",
          "[planner][profile][zb1]") {
  const ModelSpec spec = ModelSpec::load(CLEAVE_SOURCE_DIR "/models/cnn.json");
  const ModelProfile prof = profile_model(spec, "adam", 0);
  int64_t conv_flops = 0, total = 0, deferred = 0;
  for (const LayerProfile& l : prof.layers) {
    if (l.type == "conv2d") {
      CHECK(l.weight_grad_flops == 0);
      conv_flops += l.fwd_flops + l.bwd_flops;
    }
    total += l.fwd_flops + l.bwd_flops;
    deferred += l.weight_grad_flops;
  }
  REQUIRE(conv_flops > total / 2);  // the convolutions are most of the work
  Cluster c;
  c.devices.push_back({"a", int64_t{1} << 30, 50, std::nullopt});
  c.devices.push_back({"b", int64_t{1} << 30, 50, std::nullopt});
  c.default_link = {1e12, 0, std::nullopt};  // the schedule's own bubble, not the links'
  PlanOptions o;
  o.microbatches = 8;
  o.schedule = ScheduleKind::zb1;
  const Plan z = plan(prof, c, o);
  REQUIRE(z.stages.size() == 2);
  // Only the linear layers' dW can fill the bubble: a share well under 1/3.
  CHECK(z.weight_share > 0);
  CHECK(z.weight_share < static_cast<double>(deferred) / static_cast<double>(total) + 1e-9);
  CHECK(z.weight_share < 0.2);
  // The theory for equal stages with that share: more bubble than equal F, B
  // and W would leave, less than 1F1B's.
  const double bubble = bubble_fraction(ScheduleKind::zb1, 2, 8, z.weight_share);
  CHECK(bubble > bubble_fraction(ScheduleKind::zb1, 2, 8));
  CHECK(bubble < bubble_fraction(ScheduleKind::one_f_one_b, 2, 8));
  // The plan's own cut is not equal: its prediction runs the stages' times,
  // never faster than the bottleneck nor slower than the equal-stage theory.
  CHECK(z.batch_seconds >= z.bottleneck_seconds);
  CHECK(z.batch_seconds <= z.bottleneck_seconds / (1 - bubble) * (1 + 1e-9));
}
