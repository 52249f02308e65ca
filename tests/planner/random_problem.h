// random_problem.h: planning problems for the planner's tests (uniform and
// random ones) and an exhaustive reference planner.
//
// brute_force enumerates every stage count p, every ordered sequence of p
// distinct devices and every split of the layers into p contiguous non-empty
// ranges, and keeps the smallest bottleneck (ties: fewest stages) among the
// assignments that fit memory. It shares only CostModel with the planner.
#pragma once

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/planner/planner.h"
#include "core/planner/profile.h"

namespace cleave::test {

// n equal linear layers, each with `params` parameters, 1 MFLOP forward, 4 KiB activations.
inline ModelProfile uniform_model(int n, int64_t params = 1000) {
  ModelProfile m;
  m.name = "uniform";
  m.optimizer = "sgd";
  m.input_bytes_per_sample = 4096;
  for (int i = 0; i < n; ++i) {
    LayerProfile l;
    l.type = "linear";
    l.fwd_flops = 1'000'000;
    l.bwd_flops = 2'000'000;
    l.weight_grad_flops = 1'000'000;  // a split backward: B and W as long as F
    l.param_count = params;
    l.param_bytes = l.grad_bytes = 4 * params;
    l.out_act_bytes = 4096;
    l.stash_bytes = 4096;
    m.layers.push_back(l);
  }
  return m;
}

struct Problem {
  ModelProfile model;
  Cluster cluster;
  PlanOptions options;
};

inline Problem random_problem(std::mt19937_64& rng, int max_layers, int max_devices) {
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  Problem p;
  const int n = pick(1, max_layers), d = pick(1, max_devices);
  p.model.name = "random";
  p.model.input_bytes_per_sample = pick(1, 4000) * 4;
  for (int i = 0; i < n; ++i) {
    LayerProfile l;
    l.type = pick(0, 2) == 0 ? "relu" : "linear";
    l.fwd_flops = pick(0, 5) == 0 ? 0 : pick(1000, 2000000);
    l.param_count = l.type == "relu" ? 0 : pick(1, 200000);
    l.bwd_flops = l.param_count > 0 ? 2 * l.fwd_flops : l.fwd_flops;
    l.weight_grad_flops = l.param_count > 0 && i % 2 == 0 ? l.fwd_flops : 0;  // every other layer splits its backward
    l.param_bytes = l.grad_bytes = 4 * l.param_count;
    l.optimizer_state_bytes = pick(0, 2) * l.param_bytes;
    l.out_act_bytes = 4 * pick(1, 5000);
    l.stash_bytes = p.model.in_act_bytes(i) + 4 * pick(0, 1000);
    p.model.layers.push_back(l);
  }
  int64_t fixed = 0;
  for (const LayerProfile& l : p.model.layers) fixed += l.param_bytes + l.grad_bytes + l.optimizer_state_bytes;
  for (int k = 0; k < d; ++k) {
    DeviceProfile dev;
    dev.name = "dev" + std::to_string(k);
    // Between "holds a slice" and "holds everything", sometimes too small for anything.
    dev.memory_bytes = static_cast<int64_t>(uni(0.05, 1.6) * static_cast<double>(fixed + 40'000'000));
    dev.gflops = uni(0.5, 50);
    if (pick(0, 4) == 0) {
      std::vector<double> t(n);
      for (double& x : t) x = pick(0, 6) == 0 ? 0.0 : uni(1e-7, 1e-4);
      dev.layer_seconds_per_sample = t;
    }
    p.cluster.devices.push_back(dev);
  }
  p.cluster.default_link = {uni(5, 2000), uni(0, 3), std::nullopt};
  for (int a = 0; a < d; ++a)
    for (int b = 0; b < d; ++b)
      if (a != b && pick(0, 2) == 0) {
        LinkProfile l{uni(5, 2000), uni(0, 3), std::nullopt};
        if (pick(0, 3) == 0) l.encoding = static_cast<transport::Encoding>(pick(0, 2));
        p.cluster.set_link(a, b, l);
      }
  p.options.schedule = pick(0, 1) ? ScheduleKind::gpipe : ScheduleKind::one_f_one_b;
  p.options.microbatches = pick(1, 6);
  p.options.batch = pick(p.options.microbatches, 96);
  p.options.encoding = static_cast<transport::Encoding>(pick(0, 2));
  p.options.max_stages = pick(0, 4) == 0 ? pick(1, 3) : 0;
  return p;
}

struct BruteResult {
  bool feasible = false;
  double bottleneck = std::numeric_limits<double>::infinity();
  int stages = 0;
};

inline BruteResult brute_force(const CostModel& cost) {
  const int n = cost.num_layers(), d = cost.num_devices();
  int max_p = std::min(n, d);
  if (cost.options().max_stages > 0) max_p = std::min(max_p, cost.options().max_stages);
  BruteResult best;
  std::vector<int> seq, cuts;
  std::vector<bool> used(d, false);
  std::function<void(int)> pick_devices;
  std::function<void(int, int)> split;
  int p = 0;
  split = [&](int s, int begin) {  // stage s starts at `begin`
    if (s == p - 1) {
      cuts.push_back(n);
      double worst = 0;
      bool fits = true;
      for (int t = 0; t < p && fits; ++t) {
        fits = cost.memory_bytes(seq[t], cuts[t], cuts[t + 1], cost.in_flight(p, t)) <= cost.device_memory(seq[t]);
        worst = std::max(worst, cost.stage_seconds(seq[t], cuts[t], cuts[t + 1], cost.in_flight(p, t)));
        if (t + 1 < p) worst = std::max(worst, cost.transfer_seconds(seq[t], seq[t + 1], cuts[t + 1]));
      }
      if (fits && (worst < best.bottleneck || (worst == best.bottleneck && p < best.stages))) {
        best.feasible = true;
        best.bottleneck = worst;
        best.stages = p;
      }
      cuts.pop_back();
      return;
    }
    for (int end = begin + 1; end <= n - (p - 1 - s); ++end) {
      cuts.push_back(end);
      split(s + 1, end);
      cuts.pop_back();
    }
  };
  pick_devices = [&](int s) {
    if (s == p) {
      cuts.assign(1, 0);
      split(0, 0);
      return;
    }
    for (int k = 0; k < d; ++k) {
      if (used[k]) continue;
      used[k] = true;
      seq.push_back(k);
      pick_devices(s + 1);
      seq.pop_back();
      used[k] = false;
    }
  };
  for (p = 1; p <= max_p; ++p) pick_devices(0);
  return best;
}

}  // namespace cleave::test
