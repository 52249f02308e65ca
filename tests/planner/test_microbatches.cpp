// test_microbatches.cpp: the micro-batch count as a planner output
// (--microbatches auto, plan_microbatches) and the cost model's per-micro-batch
// terms: the schedules' bubbles against a simulation of their action lists,
// a batch time that grows with M when there is no bubble to shrink, auto's
// choice against every other M, and auto within memory.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "core/pipeline/schedule.h"
#include "core/pipeline/simulate.h"
#include "core/planner/devices_file.h"
#include "core/planner/plan_report.h"
#include "core/planner/planner.h"
#include "core/planner/profile.h"
#include "planner/random_problem.h"

using namespace cleave;

namespace {

// A device with measured per-sample and per-micro-batch layer times.
DeviceProfile measured_device(const std::string& name, int layers, double per_sample, double per_microbatch,
                              int64_t memory = int64_t{1} << 30) {
  DeviceProfile d;
  d.name = name;
  d.memory_bytes = memory;
  d.layer_seconds_per_sample = std::vector<double>(layers, per_sample);
  d.layer_seconds_per_microbatch = std::vector<double>(layers, per_microbatch);
  return d;
}

}  // namespace

TEST_CASE("the cost model's bubble is what the schedules' action lists take", "[planner][microbatches]") {
  const ModelProfile model = test::uniform_model(1);
  Cluster cluster;
  cluster.devices.push_back(measured_device("a", 1, 1e-6, 0));
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1})
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 10; ++m) {
        PlanOptions o;
        o.schedule = kind;
        o.microbatches = m;
        o.batch = 64;
        const CostModel cost(model, cluster, o);
        // One batch of unit F, B and W per micro-batch, make_schedule's action lists
        // run in order (simulate_pipeline, checked against a second simulation
        // in tests/pipeline/test_pipeline.cpp).
        const double units = simulate_pipeline(kind, m, std::vector<StageTimes>(p, StageTimes{1, 1, 1, 0})).batch_seconds;
        INFO(schedule_name(kind) << ", " << p << " stages, " << m << " micro-batches: " << units << " units");
        // Each stage works 3 units per micro-batch; the rest of the batch it idles.
        CHECK(cost.bubble(p) == Approx(1 - 3.0 * m / units).margin(1e-12));
      }
}

TEST_CASE("with no bubble the predicted batch time grows with the micro-batches", "[planner][microbatches]") {
  const int n = 4;
  const ModelProfile model = test::uniform_model(n);
  Cluster cluster;
  cluster.devices.push_back(measured_device("a", n, 1e-5, 2e-4));  // one device: p = 1, bubble 0
  PlanOptions o;
  o.batch = 32;
  double previous = 0;
  for (int m = 1; m <= o.batch; ++m) {
    o.microbatches = m;
    const Plan pl = plan(model, cluster, o);
    REQUIRE(pl.stages.size() == 1);
    INFO("M = " << m);
    CHECK(pl.batch_seconds > previous);
    // B * per-sample + M * per-micro-batch, for each layer.
    CHECK(pl.stages[0].compute_seconds == Approx(n * (32 * 1e-5 + m * 2e-4)));
    previous = pl.batch_seconds;
  }
  o.microbatches_auto = true;
  const Plan chosen = plan_microbatches(model, cluster, o);
  CHECK(chosen.options.microbatches == 1);
  CHECK(chosen.options.microbatches_auto);
  // Without a per-micro-batch cost every M predicts the same; the tie goes to fewer.
  cluster.devices[0].layer_seconds_per_microbatch.reset();
  CHECK(plan_microbatches(model, cluster, o).options.microbatches == 1);
}

TEST_CASE("microbatches auto picks an M no worse than every other", "[planner][microbatches]") {
  std::mt19937_64 rng(1717);
  int checked = 0, above_one = 0, pipelined = 0;
  for (int it = 0; it < 300; ++it) {
    test::Problem pr = test::random_problem(rng, 6, 3);
    pr.options.batch = std::uniform_int_distribution<int>(1, 24)(rng);
    if (it % 3 == 0) pr.options.schedule = ScheduleKind::zb1;
    for (DeviceProfile& d : pr.cluster.devices)  // a fixed cost per micro-batch on some devices
      if (d.layer_seconds_per_sample && it % 2 == 0) {
        d.layer_seconds_per_microbatch = *d.layer_seconds_per_sample;
        for (double& t : *d.layer_seconds_per_microbatch) t *= 3;
      }
    INFO("instance " << it << ": B = " << pr.options.batch << ", " << schedule_name(pr.options.schedule));
    pr.options.microbatches_auto = true;
    std::optional<Plan> chosen;
    try {
      chosen = plan_microbatches(pr.model, pr.cluster, pr.options);
    } catch (const PlanError&) {
    }
    // Every M by itself (plan_shared_hosts is plan here: no shared machines).
    std::optional<double> best;
    int best_m = 0;
    for (int m = 1; m <= pr.options.batch; ++m) {
      PlanOptions o = pr.options;
      o.microbatches = m;
      o.microbatches_auto = false;
      try {
        const Plan pl = plan(pr.model, pr.cluster, o);
        if (!best || pl.batch_seconds < *best) {
          best = pl.batch_seconds;
          best_m = m;
        }
        if (chosen) CHECK(chosen->batch_seconds <= pl.batch_seconds);
      } catch (const PlanError&) {
      }
    }
    REQUIRE(chosen.has_value() == best.has_value());  // auto fails exactly when no M fits
    if (!chosen) continue;
    ++checked;
    CHECK(chosen->options.microbatches == best_m);  // the fastest, the fewest micro-batches among equals
    CHECK(chosen->batch_seconds == *best);
    for (const StagePlan& st : chosen->stages) CHECK(st.memory_bytes <= st.memory_available);
    above_one += chosen->options.microbatches > 1;
    pipelined += chosen->stages.size() > 1;
  }
  // The instances must exercise the choice, or this proves little.
  CHECK(checked > 30);
  CHECK(above_one > 5);
  CHECK(pipelined > 5);
}

TEST_CASE("microbatches auto splits a batch that does not fit whole", "[planner][microbatches]") {
  const int n = 3;
  ModelProfile model = test::uniform_model(n);
  for (LayerProfile& l : model.layers) l.stash_bytes = 1 << 20;  // 1 MiB per sample kept for backward
  Cluster cluster;
  // Fewer micro-batches would be faster (a fixed cost per micro-batch, one stage: no bubble),
  // but the device holds the stashes of about 10 samples only.
  cluster.devices.push_back(measured_device("small", n, 1e-5, 1e-3, int64_t{32} << 20));
  PlanOptions o;
  o.schedule = ScheduleKind::one_f_one_b;
  o.batch = 64;
  o.microbatches = 1;
  REQUIRE_THROWS_AS(plan(model, cluster, o), PlanError);  // the whole batch at once does not fit
  o.microbatches_auto = true;
  const Plan chosen = plan_microbatches(model, cluster, o);
  const int m = chosen.options.microbatches;
  CHECK(m > 1);
  CHECK(chosen.stages[0].memory_bytes <= chosen.stages[0].memory_available);
  // It is the fewest that fit: one fewer does not.
  o.microbatches_auto = false;
  o.microbatches = m - 1;
  CHECK_THROWS_AS(plan(model, cluster, o), PlanError);
  // The JSON says which count was used and that it was chosen.
  const nlohmann::json j = to_json(chosen, model);
  CHECK(j.at("microbatches") == m);
  CHECK(j.at("microbatches_auto") == true);
  CHECK(j.at("microbatch_size") == (64 + m - 1) / m);

  // When no count fits, the error says so.
  cluster.devices[0].memory_bytes = 1 << 20;
  o.microbatches_auto = true;
  try {
    (void)plan_microbatches(model, cluster, o);
    FAIL("expected a PlanError");
  } catch (const PlanError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--microbatches auto") && Catch::Contains("from 1 to 64"));
  }
}

TEST_CASE("layer times at two micro-batch sizes fit a fixed and a per-sample part", "[planner][microbatches]") {
  // Layer 0: 1 ms per call + 10 us per sample; layer 1: no fixed part;
  // layer 2: noise (slower per sample at the larger size) gives no negative fixed part;
  // layer 3: does not fit at the large size, keeps its small-size time.
  const std::vector<double> at4 = {(1e-3 + 4 * 1e-5) / 4, 2e-5, 1e-5, 3e-5};
  const std::vector<double> at64 = {(1e-3 + 64 * 1e-5) / 64, 2e-5, 2e-5, -1};
  const LayerTimeFit fit = fit_layer_times(4, at4, 64, at64);
  REQUIRE(fit.per_sample.size() == 4);
  CHECK(fit.per_microbatch[0] == Approx(1e-3));
  CHECK(fit.per_sample[0] == Approx(1e-5));
  CHECK(fit.per_microbatch[1] == Approx(0).margin(1e-15));
  CHECK(fit.per_sample[1] == Approx(2e-5));
  CHECK(fit.per_microbatch[2] == 0);
  CHECK(fit.per_sample[2] == Approx(2e-5));  // the large size's time, so that it is not underestimated
  CHECK(fit.per_microbatch[3] == 0);
  CHECK(fit.per_sample[3] == 3e-5);
  // Each fitted time reproduces the large measurement where there is one.
  for (int l = 0; l < 3; ++l) CHECK(fit.per_microbatch[l] + 64 * fit.per_sample[l] == Approx(64 * at64[l]));
  CHECK_THROWS_AS(fit_layer_times(4, at4, 4, at64), std::invalid_argument);
}

TEST_CASE("per-micro-batch layer times are checked and travel in devices files", "[planner][microbatches]") {
  const ModelProfile model = test::uniform_model(2);
  Cluster cluster;
  cluster.devices.push_back(measured_device("a", 2, 1e-5, 1e-4));
  PlanOptions o;
  cluster.devices[0].layer_seconds_per_microbatch = std::vector<double>{1e-4};
  CHECK_THROWS_WITH(plan(model, cluster, o), Catch::Contains("1 measured per-micro-batch layer times for a model of 2"));
  cluster.devices[0].layer_seconds_per_microbatch = std::vector<double>{1e-4, -1};
  CHECK_THROWS_WITH(plan(model, cluster, o), Catch::Contains("per-micro-batch time of layer 1 must be >= 0"));
  DeviceProfile flops_only;
  flops_only.name = "b";
  flops_only.memory_bytes = 1 << 30;
  flops_only.gflops = 10;
  flops_only.layer_seconds_per_microbatch = std::vector<double>{1e-4, 1e-4};
  CHECK_THROWS_WITH(plan(model, Cluster{{flops_only}, {}, {}}, o), Catch::Contains("need per-sample layer times"));

  cluster.devices[0].layer_seconds_per_microbatch = std::vector<double>{1e-4, 2e-4};
  const Cluster back = parse_cluster(cluster_to_json(cluster), "round trip");
  REQUIRE(back.devices[0].layer_seconds_per_microbatch.has_value());
  CHECK(*back.devices[0].layer_seconds_per_microbatch == std::vector<double>{1e-4, 2e-4});
  const nlohmann::json bad = nlohmann::json::parse(
      R"({"devices": [{"name": "x", "memory": "1G", "gflops": 5, "layer_microbatch_seconds": [0.1]}]})");
  CHECK_THROWS_WITH(parse_cluster(bad, "devs.json"), Catch::Contains("layer_microbatch_seconds needs layer_seconds"));
}
