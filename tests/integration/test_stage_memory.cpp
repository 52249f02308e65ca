// test_stage_memory.cpp: one memory model with real daemons — each stage's
// estimate in the run's JSON bounds what its daemon really held, the
// coordinator's and the daemon's numbers are the same, and a daemon whose
// --memory-limit is exactly its stage's estimate is never refused (one byte
// less, and it is, with the sizes).
#include <catch2/catch.hpp>

#include <string>

#include "core/model/model_spec.h"
#include "core/planner/balance.h"
#include "core/planner/memory_model.h"
#include "core/runtime/coordinator/pipeline.h"
#include "integration/daemon_cluster.h"
#include "skip.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

namespace {

TrainConfig small(const std::string& model) {
  TrainConfig c;
  c.model_path = std::string(CLEAVE_SOURCE_DIR) + "/" + model;
  c.epochs = 1;
  c.batch = 16;
  c.seed = 5;
  c.limit_train = 160;
  c.limit_test = 64;
  c.microbatches = 4;
  c.optimizer.kind = "adam";
  c.threads = 1;
  c.progress = false;
  return c;
}

// What the one memory model says each stage of a balanced split needs on a CPU daemon.
std::vector<size_t> balanced_estimates(const TrainConfig& cfg, int stages, ScheduleKind schedule) {
  const ModelSpec spec = ModelSpec::load(cfg.model_path);
  const std::vector<int> cuts = balanced_bounds(spec, cfg.batch, stages);
  OptimizerConfig ocfg = cfg.optimizer;
  if (ocfg.total_steps == 0) ocfg.total_steps = (cfg.limit_train + cfg.batch - 1) / cfg.batch;
  std::vector<size_t> out;
  for (const auto& m : pipeline_memory(spec, cuts, ocfg, cfg.batch, cfg.microbatches, schedule,
                                       std::vector<std::optional<Backend>>(stages, Backend::cpu)))
    out.push_back(m.total());
  return out;
}

nlohmann::json run(const TrainConfig& cfg, int stages, const std::string& schedule, const std::vector<size_t>& limits) {
  DaemonCluster cluster(stages);
  ClusterOptions cl = cluster.options(stages, "balance");
  cl.schedule = schedule;
  cl.shutdown_daemons = true;
  cl.on_listening = [&](const std::string& ep) {
    for (int i = 1; i <= stages; ++i) {
      std::vector<std::string> extra;
      if (!limits.empty()) extra = {"--memory-limit", std::to_string(limits[i - 1])};
      cluster.start(i, ep, extra);
    }
  };
  return train_pipeline(cfg, cl);
}

}  // namespace

TEST_CASE("each stage's memory estimate bounds what its daemon held, on both sides the same",
          "[integration][pipeline][memory]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  for (const char* schedule : {"gpipe", "1f1b"}) {
    DYNAMIC_SECTION("CNN, 3 stages, " << schedule) {
      const nlohmann::json out = run(small("models/cnn.json"), 3, schedule, {});
      REQUIRE(out["stages"].size() == 3);
      for (const auto& st : out["stages"]) {
        INFO(st.dump());
        const auto estimate = st["estimated_memory_bytes"].get<int64_t>();
        const auto peak = st["peak_memory_bytes"].get<int64_t>();
        CHECK(st["daemon_estimated_memory_bytes"].get<int64_t>() == estimate);
        CHECK(peak > 0);
        CHECK(estimate >= peak);
        CHECK(static_cast<double>(estimate) <= 1.5 * static_cast<double>(peak));
      }
    }
  }
}

TEST_CASE("a daemon whose --memory-limit is exactly its stage's estimate is not refused",
          "[integration][pipeline][memory]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const TrainConfig cfg = small("models/mlp.json");
  const std::vector<size_t> need = balanced_estimates(cfg, 2, ScheduleKind::one_f_one_b);
  const nlohmann::json out = run(cfg, 2, "1f1b", need);
  CHECK(out["steps"].get<int64_t>() == 10);
  for (size_t s = 0; s < 2; ++s) CHECK(out["stages"][s]["estimated_memory_bytes"].get<size_t>() == need[s]);

  // One byte less for the second stage, and its daemon refuses it, saying why.
  std::vector<size_t> short_by_one = need;
  short_by_one[1] -= 1;
  CHECK_THROWS_WITH(run(cfg, 2, "1f1b", short_by_one), Catch::Contains("cannot host stage 1") &&
                                                           Catch::Contains("--memory-limit"));
}
