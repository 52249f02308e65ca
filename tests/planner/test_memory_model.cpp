// test_memory_model.cpp: the one memory model (core/planner/memory_model.h)
// against what real stages allocate. Every model of models/*.json, the tiny
// fixture and a model with every layer type and the MSE loss is cut into 1, 2
// and 3 stages at every possible place; each stage is a real Stage on a CPU
// device of its own, and the pipeline trains real steps of both schedules in
// one process (tests/pipeline/in_process_pipeline.h). The device's peak bytes
// in use must lie in [estimate / 1.5, estimate] ([estimate / 2, estimate] for
// stages recomputing their activations, every other pair of pipelines), and
// the planner, the daemon's admission check and the coordinator's report must
// give the same number.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/stage.h"
#include "core/planner/memory_model.h"
#include "core/planner/planner.h"
#include "core/planner/profile.h"
#include "core/planner/memory_model.h"
#include "core/util/rng.h"
#include "pipeline/in_process_pipeline.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

constexpr double kSlack = 1.5;  // the estimate may exceed the measured peak by at most this factor
// ... and under zb1 by this one: the model counts every micro-batch held until its W whole,
// though after its B it keeps only what W needs (up to about 2.4x on these stages).
constexpr double kSlackZb1 = 2.5;
// ... and under zb1 while recomputing by this one: the model then counts the
// stage as keeping its activations (recompute_saves_memory), while the stage
// does free those of the micro-batches waiting for their B (up to about 2.7x).
constexpr double kSlackZb1Recompute = 3.0;
// Recomputing, the model counts each micro-batch in flight as keeping the largest
// input of the stage's layers (memory_model.h: so that more layers never need
// less), where the stage really keeps its own input: much less for a stage that
// opens on a narrow one (cnn's 1-channel image before 32 channels).
constexpr double kRecomputeSlack = 2.0;

// Every layer type, a pointwise convolution (the CPU's direct path), a linear
// layer without bias, and the MSE loss (targets as large as the output).
const char* kEveryLayer = R"({"name": "every-layer", "input": [2, 8, 8], "loss": "mse", "layers": [
  {"type": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1}, {"type": "layernorm"}, {"type": "gelu"},
  {"type": "avgpool2d", "kernel": 2}, {"type": "conv2d", "out_channels": 6, "kernel": 1}, {"type": "relu"},
  {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "dropout", "p": 0.5},
  {"type": "linear", "out_features": 16}, {"type": "tanh"}, {"type": "layernorm"},
  {"type": "linear", "out_features": 5, "bias": false}]})";

struct NamedModel {
  std::string name;
  ModelSpec spec;
};

std::vector<NamedModel> models_under_test() {
  std::vector<NamedModel> out;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(std::string(CLEAVE_SOURCE_DIR) + "/models"))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  files.push_back(std::string(CLEAVE_SOURCE_DIR) + "/tests/fixtures/tiny_model.json");
  for (const std::string& f : files) {
    ModelSpec spec = ModelSpec::load(f);
    // Not yet: the language models (token ids as input, (batch, context) targets)
    // need token batches here and their memory model checked (issue 16).
    if (spec.layers.front().at("type") == "embedding") continue;
    out.push_back({f, std::move(spec)});
  }
  out.push_back({"every-layer", ModelSpec::parse(nlohmann::json::parse(kEveryLayer), "every-layer")});
  return out;
}

// Every way to cut n layers into p non-empty contiguous stages: p + 1 cuts from 0 to n.
void all_cuts(int n, int p, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
  if (static_cast<int>(cur.size()) == p) {
    cur.push_back(n);
    out.push_back(cur);
    cur.pop_back();
    return;
  }
  const int stages_left = p - static_cast<int>(cur.size());
  for (int c = cur.back() + 1; c <= n - stages_left; ++c) {
    cur.push_back(c);
    all_cuts(n, p, cur, out);
    cur.pop_back();
  }
}

std::vector<std::vector<int>> all_cuts(int n, int p) {
  std::vector<std::vector<int>> out;
  std::vector<int> cur = {0};
  all_cuts(n, p, cur, out);
  return out;
}

OptimizerConfig optimizer_number(int i) {
  OptimizerConfig c;
  switch (i % 3) {
    case 0: c.kind = "adam"; break;
    case 1: c.kind = "sgd"; c.momentum = 0.9f; break;
    default: c.kind = "sgd"; break;
  }
  c.lr = 0.01f;
  return c;
}

std::string cuts_str(const std::vector<int>& cuts) {
  std::string s;
  for (int c : cuts) {
    if (!s.empty()) s += ',';
    s += std::to_string(c);
  }
  return s;
}

// Random samples and targets of one batch for `spec` (class indices for cross-entropy).
void make_batch(const ModelSpec& spec, int64_t batch, uint64_t seed, std::vector<float>& x, std::vector<float>& y,
                Shape& target) {
  Rng rng(seed);
  x.resize(static_cast<size_t>(batch * numel(spec.input)));
  for (float& v : x) v = rng.uniform(-1.f, 1.f);
  const int64_t outputs = numel(spec.shapes.back());
  if (spec.loss == LossKind::cross_entropy) {
    target = {};
    y.resize(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) y[i] = static_cast<float>((i * 7 + static_cast<int64_t>(seed)) % outputs);
  } else {
    target = spec.shapes.back();
    y.resize(static_cast<size_t>(batch * outputs));
    for (float& v : y) v = rng.uniform(-1.f, 1.f);
  }
}

}  // namespace

TEST_CASE("the memory model bounds what real stages allocate, within 1.5x (2.5x under zb1)", "[planner][memory]") {
  const int64_t batch = 12;
  const int microbatches = 4;
  const int steps = 2;
  const uint64_t seed = 5;
  const bool report = std::getenv("CLEAVE_MEMORY_REPORT") != nullptr;
  int pipelines = 0;
  for (const NamedModel& m : models_under_test()) {
    const ModelSpec& spec = m.spec;
    const int n = spec.num_layers();
    for (int p = 1; p <= std::min(3, n); ++p) {
      for (const std::vector<int>& cuts : all_cuts(n, p)) {
        for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1}) {
          // Every other pair of pipelines recomputes its activations in backward.
          const bool recompute = pipelines % 4 >= 2;
          const OptimizerConfig ocfg = optimizer_number(pipelines++);
          INFO(m.name << " cut at " << cuts_str(cuts) << ", " << schedule_name(kind) << ", " << ocfg.kind
                      << " momentum " << ocfg.momentum << ", " << 1 + pipelines % 2 << " threads per device"
                      << (recompute ? ", recomputing" : ""));
          // One device per stage, so that each peak is that stage's alone.
          std::vector<std::unique_ptr<Device>> devices;
          std::vector<std::unique_ptr<Stage>> stages;
          std::vector<Stage*> ptrs;
          // One thread, or two: with more threads the CPU's ops take more scratch (per-thread
          // columns and partial sums), which the model bounds whatever the count.
          DeviceOptions dopts;
          dopts.threads = 1 + pipelines % 2;
          for (int s = 0; s < p; ++s) {
            devices.push_back(open_device("cpu", dopts));
            devices.back()->reset_peak();
            stages.push_back(std::make_unique<Stage>(*devices.back(), spec, cuts[s], cuts[s + 1], s, p, ocfg));
            stages.back()->partition().init(seed);
            stages.back()->partition().set_recompute(recompute);
            ptrs.push_back(stages.back().get());
          }
          for (int64_t step = 0; step < steps; ++step) {
            std::vector<float> x, y;
            Shape target;
            make_batch(spec, batch, seed + static_cast<uint64_t>(step), x, y, target);
            Wires w(p);
            feed_batch(w, step, microbatches, batch, x, spec.input, y, target);
            const std::vector<StepMetrics> metrics =
                run_pipeline_step(ptrs, w, kind, microbatches, step, batch, seed);
            REQUIRE(metrics.back().samples == batch);
          }

          const std::vector<StageMemory> estimates =
              pipeline_memory(spec, cuts, ocfg, batch, microbatches, kind,
                              std::vector<std::optional<Backend>>(p, Backend::cpu), std::vector<bool>(p, recompute));
          REQUIRE(static_cast<int>(estimates.size()) == p);
          // The planner's cost model and evaluated plan for the same split.
          const ModelProfile profile = profile_model(spec, ocfg.kind, ocfg.momentum);
          Cluster cluster;
          for (int s = 0; s < p; ++s) {
            cluster.devices.push_back({"d" + std::to_string(s), int64_t{1} << 40, 10, std::nullopt});
            cluster.devices.back().backend = Backend::cpu;
          }
          PlanOptions options;
          options.schedule = kind;
          options.microbatches = microbatches;
          options.batch = batch;
          options.recompute = recompute ? Recompute::all : Recompute::none;
          const CostModel cost(profile, cluster, options);
          std::vector<int> order(p);
          for (int s = 0; s < p; ++s) order[s] = s;
          const Plan planned = evaluate_plan(cost, order, cuts);

          for (int s = 0; s < p; ++s) {
            INFO("stage " << s << " (layers " << cuts[s] << ".." << cuts[s + 1] - 1 << "): estimate "
                          << estimates[s].describe());
            const size_t measured = devices[s]->peak_bytes_in_use();
            const size_t estimate = estimates[s].total();
            INFO("measured peak " << measured << " bytes, estimate " << estimate << " bytes, ratio "
                                  << static_cast<double>(estimate) / static_cast<double>(measured));
            if (report)
              std::printf("%-14s %-12s %-5s %-9s stage %d: measured %10zu estimate %10zu ratio %.3f\n",
                          std::filesystem::path(m.name).stem().c_str(), cuts_str(cuts).c_str(), schedule_name(kind),
                          recompute ? "recompute" : "", s, measured, estimate,
                          static_cast<double>(estimate) / static_cast<double>(measured));
            // The device counted the stage's blocks and more: the training step allocated too.
            CHECK(measured > estimates[s].weight_state());
            CHECK(estimate >= measured);
            const double slack = kind == ScheduleKind::zb1 ? (recompute ? kSlackZb1Recompute : kSlackZb1)
                                 : recompute                ? kRecomputeSlack
                                                            : kSlack;
            // These stages run in one process, without a LinkPump: the tensors
            // a daemon's links may hold (tests/integration/test_stage_memory.cpp)
            // are not part of what they can be measured against.
            const size_t held = estimate - estimates[s].links;
            CHECK(held >= measured);
            CHECK(static_cast<double>(held) <= slack * static_cast<double>(measured));
            // Weights, gradients and optimizer state are exact: the stage holds them from
            // construction to the end.
            const int64_t params = stages[s]->partition().param_count();
            CHECK(estimates[s].params == static_cast<size_t>(4 * params));
            CHECK(estimates[s].grads == static_cast<size_t>(4 * params));
            CHECK(estimates[s].optimizer == static_cast<size_t>(4 * params * optimizer_state_count(ocfg)));
            // One number everywhere: the daemon's admission check, the planner's cost model
            // and its plan, the coordinator's report.
            const int in_flight = max_in_flight(kind, s, p, microbatches);
            CHECK(stage_memory(spec, cuts[s], cuts[s + 1], ocfg, batch, microbatches, in_flight, devices[s]->backend(),
                               recompute, recompute_saves_memory(kind))
                      .total() == estimate);
            CHECK(estimates[s].recompute == recompute);
            CHECK(planned.stages[s].recompute == recompute);
            CHECK(cost.memory_bytes(s, cuts[s], cuts[s + 1], cost.in_flight(p, s)) == static_cast<int64_t>(estimate));
            // Without knowing the device the model takes every backend's largest temporaries.
            CHECK(stage_memory(spec, cuts[s], cuts[s + 1], ocfg, batch, microbatches, in_flight, std::nullopt,
                               recompute, recompute_saves_memory(kind))
                      .total() >= estimate);
            // Recomputing never needs more than keeping every activation.
            CHECK(stage_memory(spec, cuts[s], cuts[s + 1], ocfg, batch, microbatches, in_flight, devices[s]->backend(),
                               false)
                      .total() >= estimate);
            CHECK(planned.stages[s].memory_bytes == static_cast<int64_t>(estimate));
            CHECK(planned.stages[s].weight_state_bytes == static_cast<int64_t>(estimates[s].weight_state()));
          }
        }
      }
    }
  }
  CHECK(pipelines > 100);
}

TEST_CASE("the memory model's parts grow with what holds them", "[planner][memory]") {
  const ModelSpec cnn = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json");
  OptimizerConfig adam;
  adam.kind = "adam";
  OptimizerConfig sgd;
  sgd.kind = "sgd";
  const int n = cnn.num_layers();
  const auto any = std::nullopt;  // no backend: per-sample bounds, linear in the micro-batch
  const StageMemory one = stage_memory(cnn, 0, 3, adam, 64, 4, 1, any);
  const StageMemory two = stage_memory(cnn, 0, 3, adam, 64, 4, 2, any);
  // Micro-batches in flight add activations only, linearly.
  CHECK(two.activations == 2 * one.activations);
  CHECK(two.workspace == one.workspace);
  CHECK(two.weight_state() == one.weight_state());
  // Bigger micro-batches scale activations and workspace, not the weights.
  const StageMemory big = stage_memory(cnn, 0, 3, adam, 128, 4, 1, any);
  CHECK(big.activations == 2 * one.activations);
  CHECK(big.workspace == 2 * one.workspace);
  CHECK(big.weight_state() == one.weight_state());
  // Optimizer state: 2 buffers for adam, none for plain sgd.
  const StageMemory plain = stage_memory(cnn, 0, n, sgd, 64, 4, 1, any);
  const StageMemory with_adam = stage_memory(cnn, 0, n, adam, 64, 4, 1, any);
  CHECK(plain.optimizer == 0);
  CHECK(with_adam.optimizer == 2 * with_adam.params);
  CHECK(with_adam.total() - plain.total() == with_adam.optimizer);
  // The last stage also keeps each micro-batch's loss gradient: per micro-batch in flight
  // it holds the layer's input, its output and the output's gradient.
  const StageMemory last1 = stage_memory(cnn, n - 1, n, sgd, 64, 4, 1, any);
  const StageMemory last2 = stage_memory(cnn, n - 1, n, sgd, 64, 4, 2, any);
  const int64_t mb = largest_microbatch(64, 4);
  const int64_t in = 4 * numel(cnn.shapes[n - 1]), out = 4 * numel(cnn.shapes[n]);
  CHECK(static_cast<int64_t>(last2.activations - last1.activations) == mb * (in + out + out));
  // describe() names every part.
  const std::string d = with_adam.describe();
  for (const char* part : {"weights", "gradients", "optimizer state", "activations", "workspace", "MiB"})
    CHECK(d.find(part) != std::string::npos);
  CHECK_THROWS_AS(stage_memory(cnn, 3, 3, sgd, 64, 4, 1, any), std::invalid_argument);
  CHECK_THROWS_AS(stage_memory(cnn, 0, n + 1, sgd, 64, 4, 1, any), std::invalid_argument);
  CHECK_THROWS_AS(pipeline_memory(cnn, {0, 4, 4, n}, sgd, 64, 4, ScheduleKind::gpipe, {}), std::invalid_argument);
  CHECK_THROWS_AS(pipeline_memory(cnn, {0, 4}, sgd, 64, 4, ScheduleKind::gpipe, {}), std::invalid_argument);
  CHECK_THROWS_AS(pipeline_memory(cnn, {0, 4, n}, sgd, 64, 4, ScheduleKind::gpipe, {Backend::cpu}),
                  std::invalid_argument);
}

TEST_CASE("recomputing, micro-batches in flight keep their inputs and one rebuilds its activations",
          "[planner][memory][recompute]") {
  const ModelSpec cnn = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json");
  OptimizerConfig adam;
  adam.kind = "adam";
  const int n = cnn.num_layers();
  const auto any = std::nullopt;
  const int64_t mb = largest_microbatch(64, 4);
  auto stage = [&](int begin, int end, int in_flight, bool recompute) {
    return stage_memory(cnn, begin, end, adam, 64, 4, in_flight, any, recompute);
  };
  // The largest input among layers [begin, end), per sample.
  auto widest_input = [&](int begin, int end) {
    int64_t w = 0;
    for (int i = begin; i < end; ++i) w = std::max(w, 4 * numel(cnn.shapes[i]));
    return w;
  };
  for (const auto& [begin, end] : std::vector<std::pair<int, int>>{{0, 3}, {2, 6}, {4, n}, {0, n}}) {
    INFO("layers [" << begin << ", " << end << ")");
    const bool last = end == n;
    const int64_t kept = widest_input(begin, end) + (last ? 4 * numel(cnn.shapes[n]) : 0);
    // One micro-batch in flight: it is the one rebuilt, the same as keeping everything.
    CHECK(stage(begin, end, 1, true).activations == stage(begin, end, 1, false).activations);
    for (int f : {2, 4}) {
      const StageMemory plain = stage(begin, end, f, false), recomputed = stage(begin, end, f, true);
      CHECK(recomputed.recompute);
      CHECK_FALSE(plain.recompute);
      // Each further micro-batch in flight adds its input (and loss gradient), not its activations.
      CHECK(static_cast<int64_t>(recomputed.activations - stage(begin, end, f - 1, true).activations) == mb * kept);
      CHECK(recomputed.activations < plain.activations);
      CHECK(recomputed.workspace == plain.workspace);
      CHECK(recomputed.weight_state() == plain.weight_state());
    }
  }
  CHECK(stage(0, 3, 2, true).describe().find("recomputed in backward") != std::string::npos);
  CHECK(stage(0, 3, 2, false).describe().find("recomputed") == std::string::npos);
  // pipeline_memory recomputes where told, per stage.
  const std::vector<StageMemory> mixed =
      pipeline_memory(cnn, {0, 4, n}, adam, 64, 4, ScheduleKind::gpipe, {}, {true, false});
  CHECK(mixed[0].total() == stage(0, 4, 4, true).total());
  CHECK(mixed[1].total() == stage(4, n, 4, false).total());
  CHECK_THROWS_AS(pipeline_memory(cnn, {0, 4, n}, adam, 64, 4, ScheduleKind::gpipe, {}, {true}), std::invalid_argument);
  CHECK(parse_recompute("none") == Recompute::none);
  CHECK(parse_recompute("all") == Recompute::all);
  CHECK(parse_recompute("auto") == Recompute::when_needed);
  for (Recompute r : {Recompute::none, Recompute::all, Recompute::when_needed}) CHECK(parse_recompute(recompute_name(r)) == r);
  CHECK_THROWS_WITH(parse_recompute("some"), Catch::Matchers::Contains("'some'") && Catch::Matchers::Contains("auto"));
}

TEST_CASE("a convolution's temporaries depend on the backend, bounded by the per-sample count", "[planner][memory]") {
  const ModelSpec cnn = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json");
  OptimizerConfig sgd;
  sgd.kind = "sgd";
  for (int64_t batch : {4, 64, 256}) {
    INFO("batch " << batch);
    for (int i = 0; i < cnn.num_layers(); ++i) {
      INFO("layer " << i);
      const StageMemory any = stage_memory(cnn, i, i + 1, sgd, batch, 4, 1, std::nullopt);
      for (Backend b : {Backend::cpu, Backend::opencl, Backend::cuda})
        CHECK(stage_memory(cnn, i, i + 1, sgd, batch, 4, 1, b).workspace <= any.workspace);
    }
  }
  // conv1 (1 -> 32 channels, 3x3 on 28x28): the GPU backends lower the whole micro-batch
  // into columns, the CPU backend one sample per thread.
  const StageMemory cpu = stage_memory(cnn, 0, 1, sgd, 64, 4, 1, Backend::cpu);
  const StageMemory gpu = stage_memory(cnn, 0, 1, sgd, 64, 4, 1, Backend::cuda);
  CHECK(gpu.workspace > cpu.workspace);
  CHECK(gpu.activations == cpu.activations);
  CHECK(gpu.weight_state() == cpu.weight_state());
  // The planner counts what the device's backend needs, and the largest of all when it
  // does not know it.
  const ModelProfile profile = profile_model(cnn, "sgd", 0);
  Cluster c;
  c.devices.push_back({"cpu", int64_t{1} << 30, 10, std::nullopt});
  c.devices.push_back({"gpu", int64_t{1} << 30, 10, std::nullopt});
  c.devices.push_back({"unknown", int64_t{1} << 30, 10, std::nullopt});
  c.devices[0].backend = Backend::cpu;
  c.devices[1].backend = Backend::cuda;
  PlanOptions o;
  o.batch = 64;
  o.microbatches = 4;
  const CostModel cost(profile, c, o);
  CHECK(cost.memory_bytes(0, 0, 1, 1) == static_cast<int64_t>(cpu.total()));
  CHECK(cost.memory_bytes(1, 0, 1, 1) == static_cast<int64_t>(gpu.total()));
  CHECK(cost.memory_bytes(2, 0, 1, 1) ==
        static_cast<int64_t>(stage_memory(cnn, 0, 1, sgd, 64, 4, 1, std::nullopt).total()));
}

TEST_CASE("pipeline_memory gives each stage its schedule's in-flight count", "[planner][memory]") {
  const ModelSpec mlp = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json");
  OptimizerConfig sgd;
  sgd.kind = "sgd";
  const std::vector<int> cuts = {0, 2, 4, 6, mlp.num_layers()};
  const std::vector<std::optional<Backend>> backends = {Backend::cpu, Backend::cuda, std::nullopt, Backend::opencl};
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1}) {
    const std::vector<StageMemory> stages = pipeline_memory(mlp, cuts, sgd, 64, 8, kind, backends);
    REQUIRE(stages.size() == 4);
    for (int s = 0; s < 4; ++s) {
      const StageMemory want =
          stage_memory(mlp, cuts[s], cuts[s + 1], sgd, 64, 8, max_in_flight(kind, s, 4, 8), backends[s]);
      CHECK(stages[s].total() == want.total());
      CHECK(stages[s].activations == want.activations);
    }
  }
}
