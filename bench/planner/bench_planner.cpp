// bench_planner: how long the exact planner takes, by layers x devices.
//
// For each (layers, devices) cell it plans several random heterogeneous
// problems (compute rates 5-1000 GFLOP/s, memories from "a few layers" to
// "half the model", a random third of the directional links replaced by
// 10-1000 Mbit/s links with 0.2-5 ms latency, 1F1B and GPipe alternating) and
// reports the median and the maximum wall and thread-CPU time of plan(), and the median
// number of exact feasibility passes. The claim to check: 200 layers x 16
// devices in under 100 ms. Prints a table; --json PATH writes the cells.
//
//   bench_planner [--layers 10,50,100,200] [--devices 2,4,8,16] [--instances 7] [--seed 1] [--json out.json]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/common/bench_args.h"
#include "core/io/json_file.h"
#include "core/planner/planner.h"

using namespace cleave;

namespace {

ModelProfile random_model(std::mt19937_64& rng, int n) {
  auto log_uni = [&](double a, double b) {
    return std::exp(std::uniform_real_distribution<double>(std::log(a), std::log(b))(rng));
  };
  ModelProfile m;
  m.name = "random" + std::to_string(n);
  m.optimizer = "adam";
  m.input_bytes_per_sample = 4 * 3 * 32 * 32;
  for (int i = 0; i < n; ++i) {
    LayerProfile l;
    const bool has_params = i % 2 == 0;  // linear/conv followed by an activation
    l.type = has_params ? "linear" : "relu";
    const int64_t width = static_cast<int64_t>(log_uni(64, 4096));
    l.out_act_bytes = 4 * width;
    l.stash_bytes = m.in_act_bytes(i) + (has_params ? 0 : l.out_act_bytes);
    if (has_params) {
      l.param_count = static_cast<int64_t>(log_uni(1e4, 4e6));
      l.fwd_flops = 2 * l.param_count * static_cast<int64_t>(log_uni(1, 50));  // convs reuse weights
    } else {
      l.fwd_flops = width;
    }
    l.bwd_flops = has_params ? 2 * l.fwd_flops : l.fwd_flops;
    l.param_bytes = l.grad_bytes = 4 * l.param_count;
    l.optimizer_state_bytes = 2 * l.param_bytes;
    m.layers.push_back(l);
  }
  return m;
}

Cluster random_cluster(std::mt19937_64& rng, const ModelProfile& m, int d) {
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto log_uni = [&](double a, double b) { return std::exp(uni(std::log(a), std::log(b))); };
  int64_t fixed = 0;
  for (const LayerProfile& l : m.layers) fixed += l.param_bytes + l.grad_bytes + l.optimizer_state_bytes;
  Cluster c;
  c.default_link = {1000, 0.5, std::nullopt};
  for (int k = 0; k < d; ++k) {
    // Together the devices hold 1.5-6x the model, one device between ~1/(4d) and 1/2 of it.
    const double share = log_uni(0.25, std::max(0.5, 0.5 * d)) * 1.5 / d;
    c.devices.push_back({"dev" + std::to_string(k), static_cast<int64_t>(share * static_cast<double>(fixed)) + (64 << 20),
                         log_uni(5, 1000), std::nullopt});
  }
  for (int a = 0; a < d; ++a)
    for (int b = 0; b < d; ++b)
      if (a != b && uni(0, 1) < 1.0 / 3) c.set_link(a, b, {log_uni(10, 1000), uni(0.2, 5), std::nullopt});
  return c;
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

using cleave::bench::median;

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> layer_counts{10, 50, 100, 200}, device_counts{2, 4, 8, 16};
  int instances = 7;
  uint64_t seed = 1;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--layers" && has_value) layer_counts = parse_list(argv[++i]);
    else if (a == "--devices" && has_value) device_counts = parse_list(argv[++i]);
    else if (a == "--instances" && has_value) instances = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seed" && has_value) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--json" && has_value) json_path = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: bench_planner [--layers 10,50,100,200] [--devices 2,4,8,16] [--instances N] [--seed S] "
                   "[--json PATH]\n");
      return 2;
    }
  }
  nlohmann::json cells = nlohmann::json::array();
  std::printf("%-7s %-8s %-10s %-10s %-10s %-10s %-8s %-8s %s\n", "layers", "devices", "median ms", "max ms",
              "cpu med", "cpu max", "passes", "stages", "infeasible");
  bool claim_ok = true, claim_measured = false;
  for (int n : layer_counts)
    for (int d : device_counts) {
      std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(n) * 101 + static_cast<uint64_t>(d));
      std::vector<double> ms, cpu_ms, passes, stages;
      int infeasible = 0;
      for (int it = 0; it < instances; ++it) {
        const ModelProfile m = random_model(rng, n);
        const Cluster c = random_cluster(rng, m, d);
        PlanOptions o;
        o.schedule = it % 2 ? ScheduleKind::gpipe : ScheduleKind::one_f_one_b;
        o.microbatches = 8;
        o.batch = 64;
        timespec c0{}, c1{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          const Plan p = plan(m, c, o);
          passes.push_back(p.search_runs);
          stages.push_back(static_cast<double>(p.stages.size()));
        } catch (const PlanError&) {
          ++infeasible;
        }
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        cpu_ms.push_back((c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) * 1e-6);
      }
      const double med = median(ms), mx = *std::max_element(ms.begin(), ms.end());
      const double med_cpu = median(cpu_ms), max_cpu = *std::max_element(cpu_ms.begin(), cpu_ms.end());
      const double med_passes = passes.empty() ? 0 : median(passes);
      const double med_stages = stages.empty() ? 0 : median(stages);
      std::printf("%-7d %-8d %-10.2f %-10.2f %-10.2f %-10.2f %-8.1f %-8.1f %d/%d\n", n, d, med, mx, med_cpu, max_cpu,
                  med_passes, med_stages, infeasible, instances);
      if (n == 200 && d == 16) {
        claim_measured = true;
        claim_ok = med < 100;
      }
      cells.push_back({{"layers", n},
                       {"devices", d},
                       {"instances", instances},
                       {"median_ms", med},
                       {"max_ms", mx},
                       {"median_cpu_ms", med_cpu},
                       {"max_cpu_ms", max_cpu},
                       {"median_search_passes", med_passes},
                       {"median_stages", med_stages},
                       {"infeasible", infeasible}});
    }
  std::printf("claim: 200 layers x 16 devices median < 100 ms: %s\n",
              !claim_measured ? "not measured (add 200 to --layers and 16 to --devices)" : claim_ok ? "yes" : "NO");
  try {
    cleave::write_json_file(json_path, {{"benchmark", "planner"}, {"seed", seed}, {"cells", cells},
                                        {"claim_200x16_under_100ms", claim_measured ? nlohmann::json(claim_ok) : nlohmann::json(nullptr)}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_planner: cannot write the results: %s\n", e.what());
    return 1;
  }
  return 0;
}
