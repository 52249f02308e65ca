// test_planner.cpp: the planner against brute force, memory limits, what gets
// less work, infeasible problems and the report.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "core/planner/plan_report.h"
#include "core/planner/planner.h"
#include "core/planner/profile.h"
#include "core/model/model_spec.h"
#include "planner/random_problem.h"

using namespace cleave;

namespace {

// Checks the plan is well formed and fits memory; returns its bottleneck.
void check_plan_consistent(const Plan& plan, const CostModel& cost) {
  REQUIRE_FALSE(plan.stages.empty());
  std::vector<int> devices, cuts{0};
  for (const StagePlan& st : plan.stages) {
    devices.push_back(st.device);
    cuts.push_back(st.end);
    CHECK(st.memory_bytes <= st.memory_available);
    CHECK(st.memory_available == cost.device_memory(st.device));
  }
  REQUIRE(cuts.back() == cost.num_layers());
  const Plan again = evaluate_plan(cost, devices, cuts);  // throws if malformed
  CHECK(again.bottleneck_seconds == plan.bottleneck_seconds);
  CHECK(again.batch_seconds == plan.batch_seconds);
  // No batch is faster than its slowest stage or link; the prediction runs the
  // schedule with the plan's own times (the tests below check what it adds).
  CHECK(plan.batch_seconds >= plan.bottleneck_seconds);
  CHECK(plan.batch_seconds == Approx(std::max(plan.bottleneck_seconds, cost.pipeline_seconds(devices, cuts))));
  double w = 0, compute = 0;
  for (const StagePlan& st : plan.stages) {
    w += cost.weight_seconds(st.device, st.begin, st.end);
    compute += st.compute_seconds;
    const StageTimes t = cost.stage_times(st.device, st.begin, st.end, st.in_flight);
    CHECK(plan.options.microbatches * (t.forward + t.backward_input + t.backward_weight) + t.optimizer ==
          Approx(st.compute_seconds));
  }
  CHECK(plan.weight_share == Approx(compute > 0 ? w / compute : 0.0));
  CHECK(plan.weight_share >= 0);
  CHECK(plan.weight_share <= 0.5);
  bool marked = false;
  for (const StagePlan& st : plan.stages) marked |= st.bottleneck;
  CHECK(marked);
  CHECK(static_cast<int>(plan.stages.size() + plan.unused_devices.size()) == cost.num_devices());
}

// Returns how many of the feasible plans had a stage recompute its activations.
int check_against_brute_force(int instances, int max_layers, int max_devices, uint64_t seed, bool check_coverage,
                              bool equal_speeds = false, Recompute recompute = Recompute::none) {
  std::mt19937_64 rng(seed), context_rng(seed + 1);
  int feasible = 0, infeasible = 0, multi_stage = 0, left_unused = 0, recomputing = 0;
  for (int it = 0; it < instances; ++it) {
    test::Problem pr = test::random_problem(rng, max_layers, max_devices);
    pr.options.recompute = recompute;
    if (recompute != Recompute::none)  // contexts large enough that recomputing them decides what fits
      for (LayerProfile& l : pr.model.layers) l.stash_bytes += 4 * std::uniform_int_distribution<int64_t>(0, 100000)(context_rng);
    if (equal_speeds)  // every other device a copy of device 0 (links still differ): many ties
      for (size_t k = 1; k < pr.cluster.devices.size(); k += 2) {
        DeviceProfile& dev = pr.cluster.devices[k];
        dev.memory_bytes = pr.cluster.devices[0].memory_bytes;
        dev.gflops = pr.cluster.devices[0].gflops;
        dev.layer_seconds_per_sample = pr.cluster.devices[0].layer_seconds_per_sample;
      }
    const CostModel cost(pr.model, pr.cluster, pr.options);
    const test::BruteResult ref = test::brute_force(cost);
    INFO("instance " << it << ": " << pr.model.num_layers() << " layers x " << pr.cluster.num_devices()
                     << " devices, " << schedule_name(pr.options.schedule) << ", M=" << pr.options.microbatches
                     << ", B=" << pr.options.batch << ", max_stages=" << pr.options.max_stages
                     << ", recompute " << recompute_name(recompute));
    if (!ref.feasible) {
      CHECK_THROWS_AS(plan(pr.model, pr.cluster, pr.options), PlanError);
      ++infeasible;
      continue;
    }
    const Plan got = plan(pr.model, pr.cluster, pr.options);
    check_plan_consistent(got, cost);
    CHECK(got.bottleneck_seconds == ref.bottleneck);
    CHECK(static_cast<int>(got.stages.size()) == ref.stages);
    ++feasible;
    multi_stage += got.stages.size() > 1;
    left_unused += !got.unused_devices.empty() && got.stages.size() > 1;
    recomputing += std::any_of(got.stages.begin(), got.stages.end(), [](const StagePlan& st) { return st.recompute; });
    for (const StagePlan& st : got.stages) {
      // auto recomputes exactly the stages that do not fit otherwise.
      const bool plain_fits = static_cast<int64_t>(cost.stage_memory(st.device, st.begin, st.end, st.in_flight, false)
                                                       .total()) <= st.memory_available;
      if (recompute == Recompute::when_needed) CHECK(st.recompute == !plain_fits);
      if (recompute != Recompute::when_needed) CHECK(st.recompute == (recompute == Recompute::all));
    }
  }
  // The generator must exercise every branch, or this test proves little.
  if (!check_coverage) return recomputing;
  CHECK(feasible > instances / 4);
  CHECK(infeasible > 0);
  CHECK(multi_stage > instances / 10);
  CHECK(left_unused > 0);
  return recomputing;
}

Cluster equal_devices(int d, int64_t memory = int64_t{1} << 30) {
  Cluster c;
  for (int k = 0; k < d; ++k) {
    std::string name = "d";  // appended: `"d" + std::to_string(k)` trips GCC 12's false -Wrestrict (bug 105329)
    name += std::to_string(k);
    c.devices.push_back({name, memory, 10, std::nullopt});
  }
  c.default_link = {1000, 0.1, std::nullopt};
  return c;
}

// The same devices with links that cost (next to) nothing: the schedules' theory.
Cluster free_links(Cluster c) {
  c.default_link = {1e12, 0, std::nullopt};
  return c;
}

int layers_on(const Plan& p, const std::string& device) {
  for (const StagePlan& st : p.stages)
    if (st.device_name == device) return st.end - st.begin;
  return 0;
}

}  // namespace

TEST_CASE("planner equals brute force on random instances up to 8 layers x 4 devices", "[planner]") {
  check_against_brute_force(600, 8, 4, 20240601, true);
}

TEST_CASE("planner equals brute force on random instances up to 10 layers x 5 devices", "[planner]") {
  check_against_brute_force(60, 10, 5, 777, false);
}

TEST_CASE("planner equals brute force with several words of layers (up to 140 layers)", "[planner]") {
  // More than 64 layers: the search's bitsets span several words.
  check_against_brute_force(40, 140, 3, 4242, false);
  check_against_brute_force(25, 70, 4, 99, false);
}

TEST_CASE("planner equals brute force recomputing activations (--recompute auto and all)", "[planner][recompute]") {
  // auto: only the stages that would not fit otherwise recompute, and pay their forward again.
  CHECK(check_against_brute_force(400, 8, 4, 20240601, true, false, Recompute::when_needed) > 20);
  CHECK(check_against_brute_force(40, 70, 4, 99, false, false, Recompute::when_needed) > 0);
  check_against_brute_force(200, 8, 4, 5150, false, true, Recompute::when_needed);
  CHECK(check_against_brute_force(200, 8, 4, 8080, true, false, Recompute::all) > 50);
}

TEST_CASE("planner equals brute force when devices are copies of each other", "[planner]") {
  check_against_brute_force(300, 8, 4, 31337, false, true);
  check_against_brute_force(40, 10, 5, 2718, false, true);
}

TEST_CASE("equal devices share equal layers evenly", "[planner]") {
  const ModelProfile m = test::uniform_model(12);
  const Plan p = plan(m, equal_devices(3), PlanOptions{});
  REQUIRE(p.stages.size() == 3);
  for (const StagePlan& st : p.stages) CHECK(st.end - st.begin == 4);
}

TEST_CASE("a device behind a slow link gets less work", "[planner]") {
  const ModelProfile m = test::uniform_model(12);
  Cluster c = equal_devices(3);
  // Every link touching d2 is 100x slower than the default.
  for (int k = 0; k < 2; ++k) {
    c.set_link(2, k, {10, 5, std::nullopt});
    c.set_link(k, 2, {10, 5, std::nullopt});
  }
  const Plan p = plan(m, c, PlanOptions{});
  CHECK(layers_on(p, "d2") < 4);
  CHECK(layers_on(p, "d0") + layers_on(p, "d1") + layers_on(p, "d2") == 12);
}

TEST_CASE("a device with little memory gets less work", "[planner]") {
  const ModelProfile m = test::uniform_model(12, 100000);  // 400 KB of weights per layer, 800 KB with grads
  Cluster c = equal_devices(3);
  const CostModel probe(m, c, PlanOptions{});
  // d1 holds at most two layers with their activations (as the middle stage: 2 in flight).
  c.devices[1].memory_bytes = probe.memory_bytes(1, 0, 2, 4);
  const Plan p = plan(m, c, PlanOptions{});
  CHECK(layers_on(p, "d1") <= 2);
  CHECK(layers_on(p, "d1") < 4);
  for (const StagePlan& st : p.stages) CHECK(st.memory_bytes <= st.memory_available);
}

TEST_CASE("with --recompute auto only the stage that would not fit otherwise recomputes, paying its forward",
          "[planner][recompute]") {
  ModelProfile m = test::uniform_model(8);
  for (LayerProfile& l : m.layers) l.stash_bytes = 4096 + (1 << 16);  // 64 KiB of context per sample and layer
  Cluster c = equal_devices(2);
  PlanOptions o;
  o.schedule = ScheduleKind::gpipe;  // every stage keeps all 4 micro-batches
  const CostModel probe(m, c, o);
  // d1 holds half the model only recomputing; d0 holds half keeping everything.
  const int64_t kept = probe.memory_bytes(1, 4, 8, 4);
  o.recompute = Recompute::all;
  const int64_t recomputed = CostModel(m, c, o).memory_bytes(1, 4, 8, 4);
  REQUIRE(recomputed < kept / 2);
  c.devices[1].memory_bytes = (recomputed + kept) / 2;
  o.max_stages = 2;

  o.recompute = Recompute::none;
  for (const StagePlan& st : plan(m, c, o).stages) CHECK_FALSE(st.recompute);  // d0 holds most of it
  c.devices[0].memory_bytes = probe.memory_bytes(0, 0, 4, 4);  // now d0 cannot hold more than half either
  CHECK_THROWS_WITH(plan(m, c, o), Catch::Matchers::Contains("--recompute auto"));

  o.recompute = Recompute::when_needed;
  const Plan chosen = plan(m, c, o);
  REQUIRE(chosen.stages.size() == 2);
  for (const StagePlan& st : chosen.stages) {
    INFO("stage on " << st.device_name);
    CHECK(st.memory_bytes <= st.memory_available);
    CHECK(st.recompute == (st.device_name == "d1"));
    CHECK(st.memory.recompute == st.recompute);
    const CostModel cost(m, c, o);
    const double plain_seconds = cost.compute_seconds(st.device, st.begin, st.end);
    // The recomputed forward: 1 of the 3 MFLOP of forward + backward per sample and layer.
    CHECK(st.compute_seconds == Approx(st.recompute ? plain_seconds * 4 / 3 : plain_seconds));
  }
  const nlohmann::json j = to_json(chosen, m);
  CHECK(j["recompute"] == "auto");
  CHECK(j["stages"][0]["recompute"].is_boolean());
  const std::string table = format_plan_table(chosen, m);
  INFO(table);
  CHECK(table.find("recompute") != std::string::npos);
  CHECK(table.find("yes") != std::string::npos);
}

TEST_CASE("a layer's workspace counts toward its stage's memory", "[planner]") {
  ModelProfile m = test::uniform_model(4, 1000);
  const CostModel before(m, equal_devices(2), PlanOptions{});
  m.layers[2].workspace_bytes = 1 << 20;  // e.g. a convolution's columns, per sample
  const CostModel after(m, equal_devices(2), PlanOptions{});
  const int64_t mb = (PlanOptions{}.batch + PlanOptions{}.microbatches - 1) / PlanOptions{}.microbatches;
  CHECK(after.memory_bytes(0, 2, 4, 1) - before.memory_bytes(0, 2, 4, 1) >= (int64_t{1} << 20) * mb - 2 * 4096 * mb);
  CHECK(after.memory_bytes(0, 0, 2, 1) == before.memory_bytes(0, 0, 2, 1));  // stages without the layer are unchanged
  // A device that fits layers [2, 4) without the workspace no longer takes layer 2.
  Cluster c = equal_devices(2);
  c.devices[1].memory_bytes = before.memory_bytes(1, 2, 4, 1);
  c.devices[0].gflops = 1;  // slow: the planner would rather give d1 half the model
  const Plan p = plan(m, c, PlanOptions{});
  for (const StagePlan& st : p.stages) {
    CHECK(st.memory_bytes <= st.memory_available);
    if (st.device_name == "d1") CHECK((st.end <= 2 || st.begin > 2));
  }
  const ModelProfile cnn = profile_model(ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json"), "sgd", 0);
  // conv2, per sample: at least the portable lowering's columns + output copy, and at
  // least what any backend takes for a micro-batch of any size.
  CHECK(cnn.layers[3].workspace_bytes >= 4 * (32 * 9 + 64) * 14 * 14);
  for (int64_t samples : {1, 2, 16, 64, 1000})
    for (Backend b : {Backend::cpu, Backend::opencl, Backend::cuda})
      CHECK(cnn.layers[3].workspace_for(samples, b) <= samples * cnn.layers[3].workspace_bytes);
  CHECK(cnn.layers[1].workspace_bytes == 0);  // relu
}

TEST_CASE("a slow device is left unused when it would be the bottleneck", "[planner]") {
  const ModelProfile m = test::uniform_model(4);
  Cluster c = equal_devices(3);
  c.devices[2].gflops = 0.01;  // one layer on it takes longer than the whole model elsewhere
  const Plan p = plan(m, c, PlanOptions{});
  REQUIRE(p.unused_devices.size() == 1);
  CHECK(p.unused_devices[0] == "d2");
}

TEST_CASE("GPipe keeps M micro-batches in flight, 1F1B at most p - stage", "[planner]") {
  const ModelProfile m = test::uniform_model(8);
  PlanOptions o;
  o.microbatches = 8;
  o.batch = 64;
  o.schedule = ScheduleKind::gpipe;
  const Plan g = plan(m, equal_devices(4), o);
  for (const StagePlan& st : g.stages) CHECK(st.in_flight == 8);
  o.schedule = ScheduleKind::one_f_one_b;
  const Plan f = plan(m, equal_devices(4), o);
  REQUIRE(f.stages.size() == 4);
  for (size_t s = 0; s < f.stages.size(); ++s) CHECK(f.stages[s].in_flight == static_cast<int>(4 - s));
}

TEST_CASE("the predicted batch runs the plan's own stages and links: an uneven 1F1B cut", "[planner][zb1]") {
  // Two layers, the second 4x the first, on two equal measured devices: the
  // cut can only go between them, stage 1 the heavier.
  ModelProfile m = test::uniform_model(2);
  Cluster c = equal_devices(2);
  for (DeviceProfile& d : c.devices) {
    d.layer_seconds_per_sample = std::vector<double>{1e-4, 4e-4};
    d.update_seconds_per_param = 1e-7;  // 1000 parameters a layer: 0.1 ms a step
  }
  c.default_link = {1000, 0.1, std::nullopt};
  PlanOptions o;
  o.schedule = ScheduleKind::one_f_one_b;
  o.microbatches = 8;
  o.batch = 64;
  const Plan pl = plan(m, c, o);
  REQUIRE(pl.stages.size() == 2);
  REQUIRE(pl.stages[1].end - pl.stages[1].begin == 1);
  // Per micro-batch of 8 samples: stage 0 forward 0.8 / 3 ms, backward 1.6 / 3 ms
  // (the layers' FLOP shares), stage 1 four times that; a message holds the link
  // 0.1 ms + 8 x 4096 bytes at 125 MB/s.
  const double f0 = 8e-4 / 3, b0 = 16e-4 / 3, f1 = 4 * f0, b1 = 4 * b0, u = 1e-4;
  const double msg = 1e-4 + 8 * 4096 / 125e6;
  // Stage 1 is busy from its first forward to its last backward, then waits
  // for the gradient to reach stage 0, stage 0's last backward and step, and
  // the next batch's first forward to reach it.
  const double expected = 8 * (f1 + b1) + std::max(u, msg + b0 + u + f0 + msg);
  CHECK(pl.batch_seconds == Approx(expected).epsilon(1e-9));
  // The equal-stage formula would charge the heavier stage's fill: (M + 1) / M.
  CHECK(pl.bottleneck_seconds == Approx(8 * (f1 + b1) + u));
  CHECK(pl.batch_seconds < 9.0 / 8 * pl.bottleneck_seconds);
  // A link far slower than both stages sets the pace: its transfer per batch,
  // both directions (the planner counts a cut as one resource).
  c.default_link = {10, 0.1, std::nullopt};
  const CostModel slow_cost(m, c, o);
  const Plan slow = evaluate_plan(slow_cost, {0, 1}, {0, 1, 2});
  CHECK(slow.stages[0].bottleneck_kind == "transfer");
  CHECK(slow.bottleneck_seconds == Approx(16 * (1e-4 + 8 * 4096 / 1.25e6)));
  CHECK(slow.batch_seconds == Approx(slow.bottleneck_seconds));
  CHECK(plan(m, c, o).stages.size() == 1);  // which is why the planner keeps one device
}

TEST_CASE("ZB-H1 keeps min(p, M) in flight on every stage and predicts a third of 1F1B's bubble", "[planner][zb1]") {
  const ModelProfile m = test::uniform_model(8);
  PlanOptions o;
  o.microbatches = 8;
  o.batch = 64;
  o.schedule = ScheduleKind::one_f_one_b;
  const Plan f = plan(m, free_links(equal_devices(4)), o);
  o.schedule = ScheduleKind::zb1;
  const Plan z = plan(m, free_links(equal_devices(4)), o);
  REQUIRE(z.stages.size() == 4);
  REQUIRE(f.stages.size() == 4);
  for (const StagePlan& st : z.stages) CHECK(st.in_flight == 4);
  // The same stages, the same bottleneck, less bubble: a shorter predicted batch.
  CHECK(z.bottleneck_seconds == f.bottleneck_seconds);
  const double bubble_z = 1 - z.bottleneck_seconds / z.batch_seconds;
  const double bubble_f = 1 - f.bottleneck_seconds / f.batch_seconds;
  CHECK(bubble_z == Approx(3.0 / (3 * 8 + 3)));
  CHECK(bubble_f == Approx(3.0 / (8 + 3)));
  CHECK(z.batch_seconds < f.batch_seconds);
  CHECK(z.samples_per_second > f.samples_per_second);
  // Without a layer that splits its backward there is nothing to defer: 1F1B's bubble.
  ModelProfile whole = m;
  for (LayerProfile& l : whole.layers) l.weight_grad_flops = 0;
  const Plan unsplit = plan(whole, free_links(equal_devices(4)), o);
  CHECK(unsplit.weight_share == 0);
  CHECK(unsplit.batch_seconds == Approx(f.batch_seconds));
  // Links that take time lengthen the fill and drain: more than the theory.
  const Plan linked = plan(m, equal_devices(4), o);
  REQUIRE(linked.stages.size() == 4);
  CHECK(1 - linked.bottleneck_seconds / linked.batch_seconds > bubble_z + 0.01);
  // It holds more than 1F1B on the later stages, and the memory says so.
  CHECK(z.stages[3].memory.activations > f.stages[3].memory.activations);
  CHECK(z.stages[0].memory.activations == f.stages[0].memory.activations);
}

TEST_CASE("ZB-H1 plans fit memory and cost no less than the best assignment", "[planner][zb1]") {
  // The search counts ZB-H1's min(most stages, M) on every stage (it cannot know p
  // while it builds a pipeline from its end), an upper bound: its plans fit, and
  // where nothing fits it says so.
  std::mt19937_64 rng(77);
  int feasible = 0;
  for (int it = 0; it < 150; ++it) {
    test::Problem pr = test::random_problem(rng, 7, 4);
    pr.options.schedule = ScheduleKind::zb1;
    const CostModel cost(pr.model, pr.cluster, pr.options);
    const test::BruteResult ref = test::brute_force(cost);
    INFO("instance " << it << ": " << pr.model.num_layers() << " layers x " << pr.cluster.num_devices()
                     << " devices, M=" << pr.options.microbatches << ", max_stages=" << pr.options.max_stages);
    if (!ref.feasible) {
      CHECK_THROWS_AS(plan(pr.model, pr.cluster, pr.options), PlanError);
      continue;
    }
    try {
      const Plan got = plan(pr.model, pr.cluster, pr.options);
      check_plan_consistent(got, cost);
      CHECK(got.bottleneck_seconds >= ref.bottleneck);
      ++feasible;
    } catch (const PlanError&) {
      // Refused by the upper bound although an assignment fits: allowed, not the rule.
    }
  }
  CHECK(feasible > 50);
}

TEST_CASE("a layer that fits nowhere is named with the memory it needs", "[planner]") {
  ModelProfile m = test::uniform_model(5);
  m.layers[3].param_count = 1'000'000;
  m.layers[3].param_bytes = m.layers[3].grad_bytes = 4'000'000;
  m.layers[3].optimizer_state_bytes = 8'000'000;
  Cluster c = equal_devices(2, 8 << 20);
  c.devices[1].name = "big";
  c.devices[1].memory_bytes = 10 << 20;
  try {
    plan(m, c, PlanOptions{});
    FAIL("expected PlanError");
  } catch (const PlanError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("layer 3 (linear)") != std::string::npos);
    CHECK(msg.find("fits on no device") != std::string::npos);
    CHECK(msg.find("15.3 MiB of weights + gradients + optimizer state") != std::string::npos);
    CHECK(msg.find("'big', has 10.0 MiB") != std::string::npos);
    CHECK(msg.find("--batch") != std::string::npos);
  }
}

TEST_CASE("a model too large for all devices together says so", "[planner]") {
  const ModelProfile m = test::uniform_model(8, 100000);  // 800 KB per layer with grads
  const Cluster c = equal_devices(3, 2'000'000);    // each fits one layer, not eight
  try {
    plan(m, c, PlanOptions{});
    FAIL("expected PlanError");
  } catch (const PlanError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("all 3 devices together") != std::string::npos);
  }
}

TEST_CASE("invalid planning inputs are rejected with a message", "[planner]") {
  const ModelProfile m = test::uniform_model(3);
  PlanOptions o;
  o.microbatches = 0;
  CHECK_THROWS_WITH(plan(m, equal_devices(2), o), Catch::Contains("--microbatches"));
  o.microbatches = 8;
  o.batch = 4;
  CHECK_THROWS_WITH(plan(m, equal_devices(2), o), Catch::Contains("--batch"));
  Cluster c = equal_devices(2);
  c.devices[0].layer_seconds_per_sample = std::vector<double>{1e-3, 1e-3};
  CHECK_THROWS_WITH(plan(m, c, PlanOptions{}), Catch::Contains("2 measured layer times for a model of 3 layers"));
  c = equal_devices(2);
  c.devices[1].gflops = 0;
  CHECK_THROWS_WITH(plan(m, c, PlanOptions{}), Catch::Contains("gflops"));
  CHECK_THROWS_AS(plan(ModelProfile{}, equal_devices(2), PlanOptions{}), PlanError);
  CHECK_THROWS_AS(plan(m, Cluster{}, PlanOptions{}), PlanError);
  CHECK_THROWS_AS(plan(m, equal_devices(kMaxPlannerDevices + 1), PlanOptions{}), PlanError);
}

TEST_CASE("max_stages limits the pipeline depth", "[planner]") {
  PlanOptions o;
  o.max_stages = 2;
  const Plan p = plan(test::uniform_model(12), equal_devices(4), o);
  CHECK(p.stages.size() == 2);
  CHECK(p.unused_devices.size() == 2);
}

TEST_CASE("plan JSON holds the per-layer profile and per-stage details", "[planner]") {
  const ModelProfile m = test::uniform_model(6);
  const Plan p = plan(m, equal_devices(2), PlanOptions{});
  const nlohmann::json j = to_json(p, m);
  for (const char* key : {"schedule", "microbatches", "batch", "microbatch_size", "encoding", "num_stages", "stages",
                          "unused_devices", "bottleneck_seconds", "predicted_batch_seconds",
                          "predicted_samples_per_second", "layers", "input_bytes_per_sample"})
    CHECK(j.contains(key));
  REQUIRE(j["layers"].size() == 6);
  for (const char* key : {"index", "type", "fwd_flops", "bwd_flops", "params", "param_bytes", "grad_bytes",
                          "optimizer_state_bytes", "out_act_bytes", "stash_bytes"})
    CHECK(j["layers"][0].contains(key));
  REQUIRE(j["stages"].size() == p.stages.size());
  for (const char* key : {"stage", "device", "layers", "params", "in_flight", "memory_bytes", "memory_available",
                          "compute_seconds", "transfer_seconds", "bottleneck"})
    CHECK(j["stages"][0].contains(key));
  CHECK(j["stages"][0]["layers"] == nlohmann::json::array({0, 3}));

  const std::string table = format_plan_table(p, m);
  INFO(table);
  CHECK(table.find("stage") != std::string::npos);
  CHECK(table.find("memory used / available") != std::string::npos);
  CHECK(table.find("<- bottleneck") != std::string::npos);
  CHECK(table.find("samples/s") != std::string::npos);
}

TEST_CASE("format helpers", "[planner]") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(4 * 1024 * 1024) == "4.00 MiB");
  CHECK(format_bytes(12.5 * 1024 * 1024) == "12.5 MiB");
  CHECK(format_seconds(0.0123) == "12.3 ms");
  CHECK(format_seconds(850e-6) == "850 us");
}

TEST_CASE("a stage's compute includes one optimizer step over its parameters", "[planner]") {
  const ModelProfile m = test::uniform_model(4, 1000);
  Cluster c = equal_devices(2);
  PlanOptions o;
  const CostModel plain(m, c, o);
  c.devices[1].update_seconds_per_param = 1e-6;
  const CostModel with_update(m, c, o);
  CHECK(with_update.compute_seconds(0, 0, 4) == plain.compute_seconds(0, 0, 4));
  const double params = static_cast<double>(m.layers[1].param_count + m.layers[2].param_count);
  CHECK(with_update.compute_seconds(1, 1, 3) == Approx(plain.compute_seconds(1, 1, 3) + params * 1e-6));
  c.devices[1].update_seconds_per_param = -1;
  CHECK_THROWS_WITH(CostModel(m, c, o), Catch::Contains("update_seconds_per_param"));
}

TEST_CASE("devices sharing a machine's cores are planned with their contention", "[planner]") {
  const ModelProfile m = test::uniform_model(12);
  Cluster c = equal_devices(3);
  // Without host information three equal devices take four layers each.
  REQUIRE(plan_shared_hosts(m, c, PlanOptions{}).stages.size() == 3);
  // Three one-thread devices on a two-core machine: three stages would each run
  // 1.5x slower, no faster than two stages at full speed, so two stages win (ties
  // go to fewer stages) and the prediction is not slowed down.
  for (auto& d : c.devices) {
    d.host = "box";
    d.host_cores = 2;
    d.cpu_threads = 1;
  }
  const Plan two = plan_shared_hosts(m, c, PlanOptions{});
  CHECK(two.stages.size() == 2);
  CHECK(two.shared_host_slowdown == 1.0);
  CHECK(two.bottleneck_seconds == Approx(plan(m, equal_devices(2), PlanOptions{}).bottleneck_seconds));
  // With four cores nobody waits for a core: as without host information.
  for (auto& d : c.devices) d.host_cores = 4;
  CHECK(plan_shared_hosts(m, c, PlanOptions{}).stages.size() == 3);
  // Two-thread devices on four cores: a third stage is counted 1.5x slower and loses.
  for (auto& d : c.devices) d.cpu_threads = 2;
  const Plan contended = plan_shared_hosts(m, c, PlanOptions{});
  CHECK(contended.stages.size() == 2);
  // Forced to three stages, the prediction carries the slowdown.
  PlanOptions three;
  three.max_stages = 3;
  for (auto& d : c.devices) d.cpu_threads = 3;  // 3 x 3 threads on 4 cores
  const Plan slow = plan_shared_hosts(m, c, three);
  CHECK(slow.shared_host_slowdown >= 1.5);
  CHECK(to_json(slow, m)["shared_host_slowdown"].get<double>() == slow.shared_host_slowdown);
  // Devices on different machines do not slow each other down.
  c.devices[1].host = "other";
  c.devices[2].host = "third";
  CHECK(plan_shared_hosts(m, c, PlanOptions{}).stages.size() == 3);
}

TEST_CASE("links between devices of a machine whose cores the stages take cost the stages their CPU", "[planner]") {
  const ModelProfile m = test::uniform_model(12);
  Cluster c = equal_devices(2);
  c.default_link = {100, 0, std::nullopt};  // a slow loopback: the wire is CPU
  for (auto& d : c.devices) {
    d.host = "box";
    d.host_cores = 2;
    d.cpu_threads = 1;
  }
  PlanOptions o;
  o.microbatches = 8;
  const Plan taken = plan_shared_hosts(m, c, o);
  REQUIRE(taken.stages.size() == 2);
  const int cut = taken.stages[0].end;
  // Each end pays at most half of a message's wire time per message, one
  // sent and one received per micro-batch; scaled by how busy the other end is.
  const CostModel cost(m, c, o);
  const LinkTimes link = cost.link_times(taken.stages[0].device, taken.stages[1].device, cut);
  CHECK(link.cpu_before == Approx(link.activation / 2));
  CHECK(link.cpu_after == Approx(link.gradient / 2));
  double paid = 0;
  for (const StagePlan& st : taken.stages) {
    CHECK(st.link_cpu_seconds > 0);
    CHECK(st.link_cpu_seconds <= 2 * o.microbatches * link.cpu_before + 1e-15);
    paid += st.link_cpu_seconds;
  }
  CHECK(to_json(taken, m)["stages"][1]["link_cpu_seconds"].get<double>() == taken.stages[1].link_cpu_seconds);
  // An uneven cut: stage 1 idles most of the batch, and its idle core runs the
  // link threads that stage 0's messages need, so stage 0 pays less than it.
  const Plan uneven = evaluate_plan(cost, {0, 1}, {0, 10, 12});
  CHECK(uneven.stages[0].link_cpu_seconds > 0);
  CHECK(uneven.stages[0].link_cpu_seconds < 0.5 * uneven.stages[1].link_cpu_seconds);
  // A throttled link (--bandwidth-limit) waits more than it computes: its ends
  // pay its bytes at the CPU rate, not at the wire's.
  Cluster throttled = c;
  throttled.default_link.cpu_mbps = 4 * throttled.default_link.mbps;
  const LinkTimes slow_wire = CostModel(m, throttled, o).link_times(0, 1, cut);
  CHECK(slow_wire.activation == Approx(link.activation));
  CHECK(slow_wire.cpu_before == Approx(link.cpu_before / 4));
  // Two more cores: the link threads have their own, the same cut costs nothing more.
  for (auto& d : c.devices) d.host_cores = 4;
  const Plan spare = plan_shared_hosts(m, c, o);
  REQUIRE(spare.stages.size() == 2);
  CHECK(spare.stages[0].end == cut);
  for (const StagePlan& st : spare.stages) CHECK(st.link_cpu_seconds == 0);
  CHECK(CostModel(m, c, o).link_times(0, 1, cut).cpu_before == 0);
  CHECK(taken.batch_seconds > spare.batch_seconds);
  CHECK(taken.batch_seconds <= spare.batch_seconds + paid + 1e-12);
  // A GPU device's work leaves the cores free; devices of different machines
  // pay their links' CPU on cores the planner knows nothing of.
  for (auto& d : c.devices) d.host_cores = 2;
  c.devices[1].cpu_threads = 0;
  CHECK(CostModel(m, c, o).link_times(0, 1, cut).cpu_before == 0);
  c.devices[1].cpu_threads = 1;
  c.devices[1].host = "other";
  CHECK(CostModel(m, c, o).link_times(0, 1, cut).cpu_before == 0);
}

TEST_CASE("devices that fit their machine's cores still slow each other down by their measured contention",
          "[planner]") {
  const ModelProfile m = test::uniform_model(12);
  Cluster c = equal_devices(2);
  for (auto& d : c.devices) {
    d.host = "box";
    d.host_cores = 2;
    d.cpu_threads = 1;
  }
  c = free_links(c);  // contention slows the compute, not the links
  PlanOptions o;
  o.microbatches = 8;
  const Plan free_cores = plan_shared_hosts(m, c, o);
  REQUIRE(free_cores.stages.size() == 2);
  CHECK(free_cores.shared_host_slowdown == 1.0);
  // Measured 1.25x slower side by side: two stages still win, predicted that much slower.
  for (auto& d : c.devices) d.host_contention = 1.25;
  const Plan contended = plan_shared_hosts(m, c, o);
  REQUIRE(contended.stages.size() == 2);
  CHECK(contended.shared_host_slowdown == Approx(1.25));
  CHECK(contended.batch_seconds == Approx(1.25 * free_cores.batch_seconds));
  // Noise below 1 counts as none.
  for (auto& d : c.devices) d.host_contention = 0.97;
  CHECK(plan_shared_hosts(m, c, o).shared_host_slowdown == 1.0);
  // 2.5x: one device alone is faster than two that slow each other down so much.
  for (auto& d : c.devices) d.host_contention = 2.5;
  const Plan alone = plan_shared_hosts(m, c, o);
  CHECK(alone.stages.size() == 1);
  CHECK(alone.shared_host_slowdown == 1.0);
  // Contention between devices of different machines means nothing.
  c.devices[1].host = "other";
  CHECK(plan_shared_hosts(m, c, o).stages.size() == 2);
  CHECK(plan_shared_hosts(m, c, o).shared_host_slowdown == 1.0);
}
