// test_pipeline.cpp: schedules as data, and the stage executor running every
// stage of a pipeline in one process (in_process_pipeline.h) against one-process
// training of the same model: the same losses and the same weights.
#include <array>
#include <set>

#include <catch2/catch.hpp>

#include "core/model/model_spec.h"
#include "core/nn/loss.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/simulate.h"
#include "core/pipeline/stage.h"
#include "core/pipeline/trace.h"
#include "core/planner/balance.h"
#include "core/train/train_config.h"
#include "core/util/rng.h"
#include "pipeline/in_process_pipeline.h"

using namespace cleave;
using namespace cleave::testing;

TEST_CASE("gpipe: all forwards then all backwards, one optimizer step", "[pipeline]") {
  auto a = make_schedule(ScheduleKind::gpipe, 1, 3, 2);
  std::vector<Action> want = {
      {ActionKind::receive_activation, 0}, {ActionKind::forward, 0}, {ActionKind::send_activation, 0},
      {ActionKind::receive_activation, 1}, {ActionKind::forward, 1}, {ActionKind::send_activation, 1},
      {ActionKind::receive_gradient, 0},   {ActionKind::backward, 0}, {ActionKind::send_gradient, 0},
      {ActionKind::receive_gradient, 1},   {ActionKind::backward, 1}, {ActionKind::send_gradient, 1},
      {ActionKind::optimizer_step, -1}};
  CHECK(a == want);
}

TEST_CASE("1f1b: warm-up forwards, alternation, drain and bounded in-flight", "[pipeline]") {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 5, 8})
      for (int s = 0; s < p; ++s) {
        auto acts = make_schedule(ScheduleKind::one_f_one_b, s, p, m);
        int fwd = 0, bwd = 0, in_flight = 0, peak = 0, opt = 0;
        int next_f = 0, next_b = 0;
        for (const auto& a : acts) {
          if (a.kind == ActionKind::forward) {
            CHECK(a.microbatch == next_f++);
            ++fwd;
            peak = std::max(peak, ++in_flight);
          } else if (a.kind == ActionKind::backward) {
            CHECK(a.microbatch == next_b++);
            ++bwd;
            --in_flight;
            CHECK(in_flight >= 0);
          } else if (a.kind == ActionKind::optimizer_step) {
            ++opt;
          }
        }
        CHECK(fwd == m);
        CHECK(bwd == m);
        CHECK(opt == 1);
        CHECK(acts.back().kind == ActionKind::optimizer_step);
        CHECK(peak <= max_in_flight(ScheduleKind::one_f_one_b, s, p, m));
        CHECK(peak == std::min(p - s, m));
      }
  CHECK_THROWS_AS(make_schedule(ScheduleKind::gpipe, 3, 3, 1), std::invalid_argument);
  CHECK(parse_schedule("1f1b") == ScheduleKind::one_f_one_b);
  CHECK_THROWS_WITH(parse_schedule("zero-bubble"), Catch::Contains("gpipe, 1f1b or zb1"));
}

TEST_CASE("one schedule vocabulary: names round-trip, max_in_flight is each schedule's peak", "[pipeline]") {
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1}) {
    CHECK(parse_schedule(schedule_name(kind)) == kind);
    for (int p : {1, 2, 3, 5})
      for (int m : {1, 2, 4, 7})
        for (int s = 0; s < p; ++s) {
          // A micro-batch is held from its forward until its backward, or its W under zb1.
          int in_flight = 0, peak = 0;
          for (const Action& a : make_schedule(kind, s, p, m)) {
            if (a.kind == ActionKind::forward) peak = std::max(peak, ++in_flight);
            if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) --in_flight;
          }
          INFO(schedule_name(kind) << " stage " << s << " of " << p << ", " << m << " micro-batches");
          CHECK(max_in_flight(kind, s, p, m) == peak);
          // Under gpipe and 1f1b it depends on the stages from this one to the last only (the
          // planner relies on it where in_flight_by_suffix says so).
          if (in_flight_by_suffix(kind)) CHECK(max_in_flight(kind, s, p, m) == max_in_flight(kind, 0, p - s, m));
        }
  }
  CHECK(std::string(schedule_name(ScheduleKind::gpipe)) == "gpipe");
  CHECK(std::string(schedule_name(ScheduleKind::one_f_one_b)) == "1f1b");
  CHECK(std::string(schedule_name(ScheduleKind::zb1)) == "zb1");
  CHECK_FALSE(in_flight_by_suffix(ScheduleKind::zb1));
}

namespace {

// Runs the schedules of every stage of a p-stage pipeline with each forward,
// backward input half and weight half taking one unit of time (a whole
// backward two) and free links, each action as soon as its inputs are there:
// a forward after the previous stage's forward of that micro-batch, a backward
// (or B) after this stage's forward and the next stage's backward (or B), a W
// after this stage's B. Returns the makespan; fails the test on a deadlock.
int simulate_unit_times(ScheduleKind kind, int p, int m) {
  std::vector<std::vector<Action>> acts;
  for (int s = 0; s < p; ++s) acts.push_back(make_schedule(kind, s, p, m));
  // done[s][mb]: end times of F, B (or the whole backward) and W; -1 until run.
  std::vector<std::vector<std::array<int, 3>>> done(p, std::vector<std::array<int, 3>>(m, {-1, -1, -1}));
  std::vector<size_t> next(p, 0);
  std::vector<int> clock(p, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s)
      for (; next[s] < acts[s].size(); ++next[s]) {
        const Action& a = acts[s][next[s]];
        int ready = clock[s], cost = 1, slot = -1;
        auto after = [&](int t) {
          if (t < 0) return false;
          ready = std::max(ready, t);
          return true;
        };
        if (a.kind == ActionKind::forward) {
          slot = 0;
          if (s > 0 && !after(done[s - 1][a.microbatch][0])) break;
        } else if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_input) {
          slot = 1;
          cost = a.kind == ActionKind::backward ? 2 : 1;
          if (!after(done[s][a.microbatch][0])) break;
          if (s + 1 < p && !after(done[s + 1][a.microbatch][1])) break;
        } else if (a.kind == ActionKind::backward_weight) {
          slot = 2;
          if (!after(done[s][a.microbatch][1])) break;
        }
        if (slot < 0) continue;  // transfers and the optimizer step take no time here
        clock[s] = ready + cost;
        done[s][a.microbatch][static_cast<size_t>(slot)] = clock[s];
        moved = true;
      }
  }
  for (int s = 0; s < p; ++s) {
    INFO(schedule_name(kind) << ": stage " << s << " of " << p << " deadlocked at action " << next[s]);
    REQUIRE(next[s] == acts[s].size());
  }
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace

TEST_CASE("zb1: every micro-batch gets F, B and W once, in dependency order, within 1F1B's warm-up", "[pipeline]") {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 5, 8})
      for (int s = 0; s < p; ++s) {
        INFO("stage " << s << " of " << p << ", " << m << " micro-batches");
        const std::vector<Action> acts = make_schedule(ScheduleKind::zb1, s, p, m);
        std::vector<int> f(m, 0), b(m, 0), w(m, 0), recv_g(m, 0), send_g(m, 0);
        int next_f = 0, next_b = 0, next_w = 0, leading_forwards = 0;
        bool only_forwards = true;
        for (const Action& a : acts) {
          const int mb = a.microbatch;
          switch (a.kind) {
            case ActionKind::forward:
              CHECK(mb == next_f++);
              ++f[mb];
              if (only_forwards) ++leading_forwards;
              break;
            case ActionKind::receive_gradient: ++recv_g[mb]; break;
            case ActionKind::backward_input:
              only_forwards = false;
              CHECK(mb == next_b++);
              CHECK(f[mb] == 1);       // its forward ran
              CHECK(recv_g[mb] == 1);  // and its output gradient came
              ++b[mb];
              break;
            case ActionKind::send_gradient:
              CHECK(b[mb] == 1);  // what is sent is B's dx
              ++send_g[mb];
              break;
            case ActionKind::backward_weight:
              CHECK(mb == next_w++);
              CHECK(b[mb] == 1);  // W after its B
              ++w[mb];
              break;
            case ActionKind::backward: FAIL("zb1 runs B and W, never the whole backward"); break;
            default: break;
          }
        }
        for (int mb = 0; mb < m; ++mb) {
          CHECK(f[mb] == 1);
          CHECK(b[mb] == 1);
          CHECK(w[mb] == 1);
          CHECK(send_g[mb] == (s > 0 ? 1 : 0));
        }
        CHECK(acts.back().kind == ActionKind::optimizer_step);
        // The same warm-up as 1F1B: p - s - 1 forwards, then one more before the first B.
        CHECK(leading_forwards == std::min(p - s, m));
      }
}

TEST_CASE("zb1's bubble with unit F, B and W is (p - 1) / (3M + p - 1), a third of 1F1B's", "[pipeline]") {
  for (int p : {2, 3, 4})
    for (int m : {p, p + 1, 2 * p, 8}) {
      INFO(p << " stages, " << m << " micro-batches");
      // Busy time per stage is 3M units; the rest of the makespan is the bubble.
      const int zb = simulate_unit_times(ScheduleKind::zb1, p, m);
      const int ofob = simulate_unit_times(ScheduleKind::one_f_one_b, p, m);
      CHECK(static_cast<double>(zb - 3 * m) / zb == Approx(static_cast<double>(p - 1) / (3 * m + p - 1)));
      CHECK(static_cast<double>(ofob - 3 * m) / ofob == Approx(static_cast<double>(p - 1) / (m + p - 1)));
      CHECK(static_cast<double>(zb - 3 * m) / zb == Approx(bubble_fraction(ScheduleKind::zb1, p, m)));
      CHECK(static_cast<double>(ofob - 3 * m) / ofob == Approx(bubble_fraction(ScheduleKind::one_f_one_b, p, m)));
    }
  CHECK(bubble_fraction(ScheduleKind::zb1, 1, 4) == 0);
}

TEST_CASE("simulate_pipeline runs the schedules as the unit-time simulation does, at bubble_fraction with equal stages",
          "[pipeline][simulate]") {
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1})
    for (int p = 1; p <= 5; ++p)
      for (int m = 1; m <= 10; ++m) {
        INFO(schedule_name(kind) << ", " << p << " stages, " << m << " micro-batches");
        const SimulatedPipeline sim = simulate_pipeline(kind, m, std::vector<StageTimes>(p, StageTimes{1, 1, 1, 0}));
        // Batches run back to back, but each starts only after the one before
        // drained, so one batch takes what the one-batch simulation's makespan says.
        CHECK(sim.batch_seconds == Approx(simulate_unit_times(kind, p, m)));
        CHECK(sim.bubble == Approx(bubble_fraction(kind, p, m)).margin(1e-12));
        REQUIRE(sim.busy_seconds.size() == static_cast<size_t>(p));
        for (double b : sim.busy_seconds) CHECK(b == Approx(3.0 * m));
      }
}

TEST_CASE("simulate_pipeline: an uneven cut, the optimizer step and the links", "[pipeline][simulate]") {
  // The last stage twice as slow: under zb1 its W's after the last B cover the
  // first stage's B, W and next first forward, so it never waits and the batch
  // takes its busy time; the first stage idles the other half.
  const std::vector<StageTimes> uneven{{1, 1, 1, 0}, {2, 2, 2, 0}};
  SimulatedPipeline zb = simulate_pipeline(ScheduleKind::zb1, 4, uneven);
  CHECK(zb.batch_seconds == Approx(24));
  CHECK(zb.bubble == Approx(0.25));
  // Not so under 1F1B: the fused backward leaves the last stage nothing to do
  // while the first finishes, and the next batch waits for that.
  const SimulatedPipeline ofob = simulate_pipeline(ScheduleKind::one_f_one_b, 4, uneven);
  CHECK(ofob.batch_seconds > zb.batch_seconds);
  // The bubble never beats the equal-stage theory when stages differ.
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1})
    CHECK(simulate_pipeline(kind, 8, uneven).bubble > bubble_fraction(kind, 2, 8));
  // GPipe on two equal stages with messages of d seconds: one wait of d for the
  // first activation and one for the last gradient, per batch: 3(M + 1) + 2d.
  const std::vector<StageTimes> equal{{1, 1, 1, 0}, {1, 1, 1, 0}};
  CHECK(simulate_pipeline(ScheduleKind::gpipe, 8, equal, 0.25).batch_seconds == Approx(27.5));
  // Slower links or an optimizer step never shorten a batch.
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1}) {
    const double free = simulate_pipeline(kind, 8, equal).batch_seconds;
    CHECK(simulate_pipeline(kind, 8, equal, 0.5).batch_seconds > free);
    const std::vector<StageTimes> with_step{{1, 1, 1, 2}, {1, 1, 1, 2}};
    const SimulatedPipeline stepped = simulate_pipeline(kind, 8, with_step);
    CHECK(stepped.batch_seconds >= free + 2);
    CHECK(stepped.busy_seconds[0] == Approx(26));
  }
  // One stage: no bubble, the batch is its work.
  zb = simulate_pipeline(ScheduleKind::zb1, 3, {{1, 2, 3, 4}});
  CHECK(zb.batch_seconds == Approx(22));
  CHECK(zb.bubble == Approx(0).margin(1e-12));
}

TEST_CASE("simulate_pipeline: a link carries one message at a time in each direction", "[pipeline][simulate]") {
  const std::vector<StageTimes> equal{{1, 1, 0, 0}, {1, 1, 0, 0}};
  // GPipe, 4 micro-batches, activations holding the wire 2 units (longer than a
  // forward): they leave stage 0 at 1, 2, 3, 4 but arrive at 3, 5, 7, 9. Stage
  // 1's forwards end at 10, its backwards at 11-14, stage 0's at 12-15.
  CHECK(simulate_pipeline(ScheduleKind::gpipe, 4, equal, {LinkTimes{2, 0, 0}}).batch_seconds == Approx(15));
  // The same 2 units as latency only (both ways): they arrive at 3, 4, 5, 6,
  // stage 1's backwards end at 8-11, the gradients arrive at 10-13: 14.
  CHECK(simulate_pipeline(ScheduleKind::gpipe, 4, equal, {LinkTimes{0, 0, 2}}).batch_seconds == Approx(14));
  // Gradients queue too: leaving stage 1 at 11-14, they reach stage 0 at 13, 15, 17, 19.
  CHECK(simulate_pipeline(ScheduleKind::gpipe, 4, equal, {LinkTimes{2, 2, 0}}).batch_seconds == Approx(20));
  // Latency only is what the scalar form gives, for every schedule.
  const std::vector<StageTimes> three{{1, 1, 1, 0}, {2, 1, 1, 1}, {1, 2, 1, 0}};
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1}) {
    const std::vector<LinkTimes> latency(2, LinkTimes{0, 0, 0.3});
    CHECK(simulate_pipeline(kind, 6, three, latency).batch_seconds ==
          Approx(simulate_pipeline(kind, 6, three, 0.3).batch_seconds));
    // A wire slower than every stage's work per micro-batch sets the pace.
    const double slow = simulate_pipeline(kind, 6, three, {LinkTimes{5, 0, 0}, LinkTimes{0, 0, 0}}).batch_seconds;
    CHECK(slow >= 6 * 5);
    CHECK(slow > simulate_pipeline(kind, 6, three).batch_seconds);
  }
}

TEST_CASE("simulate_pipeline: a link's CPU costs a stage what it pays while it computes", "[pipeline][simulate]") {
  const std::vector<StageTimes> equal{{1, 1, 0, 0}, {1, 1, 0, 0}};
  const LinkTimes wire{0.5, 0.5, 0.1};
  LinkTimes cpu = wire;
  cpu.cpu_before = cpu.cpu_after = 0.25;  // the whole wire time is the two ends' CPU
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1}) {
    // One micro-batch: every message is waited for, and still arrives wire +
    // latency after its send, so nothing changes.
    CHECK(simulate_pipeline(kind, 1, equal, {cpu}).batch_seconds ==
          Approx(simulate_pipeline(kind, 1, equal, {wire}).batch_seconds));
    // Four: a stage pays for each send, and for each receive that arrives while
    // it computes; never more than both stages' CPU together.
    const double free = simulate_pipeline(kind, 4, equal, {wire}).batch_seconds;
    const double paid = simulate_pipeline(kind, 4, equal, {cpu}).batch_seconds;
    CHECK(paid > free);
    CHECK(paid <= free + 2 * (2 * 4 * 0.25) + 1e-12);
  }
  // GPipe's first stage sends its four activations while it computes: it pays
  // each send before its next forward, and the batch ends at least those four
  // parts later.
  CHECK(simulate_pipeline(ScheduleKind::gpipe, 4, equal, {cpu}).batch_seconds >=
        simulate_pipeline(ScheduleKind::gpipe, 4, equal, {wire}).batch_seconds + 4 * 0.25);
  // The sender's part alone: stage 0 pays it after each forward, before its
  // activation leaves, and its backwards start that much later.
  LinkTimes sender = wire;
  sender.cpu_before = 0.25;
  CHECK(simulate_pipeline(ScheduleKind::gpipe, 4, equal, {sender}).batch_seconds >
        simulate_pipeline(ScheduleKind::gpipe, 4, equal, {wire}).batch_seconds);
}

TEST_CASE("simulate_pipeline refuses what is not a pipeline", "[pipeline][simulate]") {
  CHECK_THROWS_WITH(simulate_pipeline(ScheduleKind::zb1, 4, {}), Catch::Contains("at least one stage"));
  CHECK_THROWS_WITH(simulate_pipeline(ScheduleKind::zb1, 0, {{1, 1, 1, 0}}), Catch::Contains("one micro-batch"));
  CHECK_THROWS_WITH(simulate_pipeline(ScheduleKind::gpipe, 2, {{1, -1, 1, 0}}), Catch::Contains("non-negative"));
  CHECK_THROWS_WITH(simulate_pipeline(ScheduleKind::gpipe, 2, {{1, 1, 1, 0}}, -1), Catch::Contains("non-negative"));
  const std::vector<StageTimes> two{{1, 1, 1, 0}, {1, 1, 1, 0}};
  CHECK_THROWS_WITH(simulate_pipeline(ScheduleKind::gpipe, 2, two, std::vector<LinkTimes>{}),
                    Catch::Contains("2 stages need 1 links, got 0"));
  CHECK_THROWS_WITH(simulate_pipeline(ScheduleKind::gpipe, 2, two, {LinkTimes{1, -1, 0}}),
                    Catch::Contains("a link's times must be non-negative"));
  CHECK_THROWS_WITH(simulate_pipeline(ScheduleKind::gpipe, 2, two, {LinkTimes{1, 1, 0, -0.5, 0}}),
                    Catch::Contains("a link's times must be non-negative"));
}

TEST_CASE("balance_ranges minimises the largest stage", "[pipeline]") {
  auto b = balance_ranges({1, 1, 1, 1, 8, 1, 1}, 3);
  REQUIRE(b.size() == 4);
  CHECK(b.front() == 0);
  CHECK(b.back() == 7);
  double worst = 0;
  std::vector<double> c = {1, 1, 1, 1, 8, 1, 1};
  for (int s = 0; s < 3; ++s) {
    double sum = 0;
    for (int i = b[s]; i < b[s + 1]; ++i) sum += c[i];
    worst = std::max(worst, sum);
    CHECK(b[s + 1] > b[s]);
  }
  CHECK(worst == 8);
  CHECK_THROWS_WITH(balance_ranges({1, 2}, 3), Catch::Contains("at most 2 devices"));
}

namespace {

std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(-scale, scale);
  return v;
}

const char* kTinyDropout = R"({"name": "tiny", "input": [1, 8, 8], "loss": "cross_entropy", "layers": [
    {"type": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1}, {"type": "relu"},
    {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "linear", "out_features": 16},
    {"type": "dropout", "p": 0.25}, {"type": "tanh"}, {"type": "linear", "out_features": 5}]})";

// What a few training steps of a pipeline left: its loss per step and the whole model's weights.
struct Trained {
  std::vector<double> losses;
  std::vector<float> params;
  size_t trace_events = 0;
  std::set<std::string> trace_names;
};

// Trains `steps` seeded batches of 10 tiny samples through the stages [bounds[s],
// bounds[s + 1]), each on its own thread, under `kind` with m micro-batches,
// every stage recomputing its activations or not.
Trained train_in_process(Device& dev, const ModelSpec& spec, const std::vector<int>& bounds, ScheduleKind kind, int m,
                         bool recompute) {
  OptimizerConfig ocfg;
  ocfg.kind = "adam";
  ocfg.lr = 0.01f;
  const int64_t batch = 10, steps = 3;
  const uint64_t seed = 7;
  const int p = static_cast<int>(bounds.size()) - 1;
  std::vector<std::unique_ptr<Stage>> stages;
  std::vector<Stage*> ptrs;
  for (int s = 0; s < p; ++s) {
    stages.push_back(std::make_unique<Stage>(dev, spec, bounds[s], bounds[s + 1], s, p, ocfg));
    stages.back()->partition().init(seed);
    stages.back()->partition().set_recompute(recompute);
    ptrs.push_back(stages.back().get());
  }
  Trained out;
  StageTracer tracer(0);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<float> y(batch);
    for (int64_t i = 0; i < batch; ++i) y[i] = static_cast<float>((i * 7 + step) % 5);
    Wires w(p);
    feed_batch(w, step, m, batch, random_vector(batch * 64, 100 + step), {1, 8, 8}, y);
    const std::vector<StepMetrics> metrics = run_pipeline_step(ptrs, w, kind, m, step, batch, seed, &tracer, p - 1);
    CHECK(metrics[p - 1].samples == batch);
    out.losses.push_back(metrics[p - 1].loss_sum / batch);
  }
  for (auto& s : stages) {
    const auto part = s->partition().params().to_host();
    out.params.insert(out.params.end(), part.begin(), part.end());
  }
  out.trace_events = tracer.events().size();
  for (const TraceEvent& e : tracer.events()) out.trace_names.insert(e.name);
  return out;
}

// Losses within `rel` of each other, relatively, and weights within `margin`.
void check_same_training(const Trained& got, const Trained& want, double rel, double margin) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t step = 0; step < want.losses.size(); ++step) {
    INFO("step " << step);
    CHECK(got.losses[step] == Approx(want.losses[step]).epsilon(rel));
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) REQUIRE(got.params[i] == Approx(want.params[i]).margin(margin));
}

}  // namespace

TEST_CASE("pipelined stages reproduce one-process training step for step", "[pipeline]") {
  ModelSpec spec = ModelSpec::parse(nlohmann::json::parse(kTinyDropout), "tiny");
  DeviceOptions dopts;
  dopts.threads = 1;
  auto dev = open_device("cpu", dopts);
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1}) {
    for (int m : {1, 3}) {
      DYNAMIC_SECTION(schedule_name(kind) << " with " << m << " micro-batches") {
        // Reference: one partition, same micro-batches (zb1 is checked against gpipe,
        // so that a wrong B / W split cannot agree with itself); then three stages
        // on three threads.
        const ScheduleKind ref_kind = kind == ScheduleKind::zb1 ? ScheduleKind::gpipe : kind;
        const Trained ref = train_in_process(*dev, spec, {0, spec.num_layers()}, ref_kind, m, false);
        const Trained piped = train_in_process(*dev, spec, {0, 3, 6, spec.num_layers()}, kind, m, false);
        check_same_training(piped, ref, 1e-5, 1e-5);
        CHECK(piped.trace_events > 0);
        // zb1's trace shows B and W as their own slices, never a whole backward.
        const bool zb = kind == ScheduleKind::zb1;
        CHECK(piped.trace_names.count("B") == (zb ? 1u : 0u));
        CHECK(piped.trace_names.count("W") == (zb ? 1u : 0u));
        CHECK(piped.trace_names.count("backward") == (zb ? 0u : 1u));
      }
    }
  }
}

TEST_CASE("stages recomputing their activations train as the ones that keep them", "[pipeline][recompute]") {
  ModelSpec spec = ModelSpec::parse(nlohmann::json::parse(kTinyDropout), "tiny");  // dropout: the masks must repeat
  DeviceOptions dopts;
  dopts.threads = 1;
  auto dev = open_device("cpu", dopts);
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb1}) {
    DYNAMIC_SECTION(schedule_name(kind)) {
      const std::vector<int> bounds = {0, 3, 6, spec.num_layers()};
      const ScheduleKind ref_kind = kind == ScheduleKind::zb1 ? ScheduleKind::gpipe : kind;
      const Trained local = train_in_process(*dev, spec, {0, spec.num_layers()}, ref_kind, 3, false);
      const Trained kept = train_in_process(*dev, spec, bounds, kind, 3, false);
      const Trained recomputed = train_in_process(*dev, spec, bounds, kind, 3, true);
      check_same_training(recomputed, kept, 1e-6, 1e-6);
      check_same_training(recomputed, local, 1e-4, 1e-5);
      // One process recomputing is the same training too.
      check_same_training(train_in_process(*dev, spec, {0, spec.num_layers()}, ref_kind, 3, true), local, 1e-6, 1e-6);
    }
  }
}

TEST_CASE("chrome trace has one named track per stage and idle gaps", "[pipeline]") {
  std::vector<TraceEvent> ev = {{"forward", 0, 0, 0, 0, 10}, {"backward", 0, 0, 0, 50, 10}, {"forward", 1, 0, 0, 12, 5}};
  auto j = chrome_trace(ev, {"stage 0 (a)", "stage 1 (b)"});
  int idle = 0, meta = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") ++meta;
    if (e["name"] == "idle") ++idle;
  }
  CHECK(meta == 2);
  CHECK(idle == 1);
}
