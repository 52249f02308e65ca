// test_planned_pipeline.cpp: issue 5 on one machine — three real daemons, one
// with a --memory-limit that holds only a few layers, one behind a
// --bandwidth-limit. The coordinator profiles them (per-layer times, pairwise link
// probes, declared limits), plans, and trains; the plan respects both limits,
// and the JSON reports the prediction next to the measured time per batch.
#include <catch2/catch.hpp>

#include "core/data/dataset.h"
#include "core/runtime/coordinator/pipeline.h"
#include "integration/daemon_cluster.h"
#include "skip.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

TEST_CASE("the planner places stages within memory and bandwidth limits", "[integration][planner]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TrainConfig cfg;
  cfg.model_path = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  cfg.batch = 64;
  cfg.microbatches = 4;
  cfg.limit_train = 1280;
  cfg.limit_test = 200;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 1e-3f;
  cfg.progress = false;
  DaemonCluster cluster(3);
  ClusterOptions cl = cluster.options(3, "auto");
  cl.shutdown_daemons = true;
  const size_t dev1_limit = 24u << 20;  // one 1024x1024 Linear with Adam state takes 16 MiB
  cl.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep, {"--memory-limit", "24M"});
    cluster.start(2, ep);
    cluster.start(3, ep, {"--bandwidth-limit", "20mbit"});
  };
  nlohmann::json out = train_pipeline(cfg, cl);
  REQUIRE(out["planner"] == "auto");
  const auto& stages = out["planner_plan"]["stages"];
  REQUIRE(stages.size() >= 1);
  int covered = 0;
  for (const auto& st : stages) {
    CHECK(st["layers"][0].get<int>() == covered);
    covered = st["layers"][1].get<int>();
    CHECK(st["memory_bytes"].get<int64_t>() <= st["memory_available"].get<int64_t>());
    if (st["device"] == "dev1") CHECK(st["memory_bytes"].get<int64_t>() <= static_cast<int64_t>(dev1_limit));
  }
  CHECK(covered == 8);
  // Every pair of daemons measured its link, each direction through its
  // sender's throttle: what dev3 sends runs at its 20 Mbit/s limit (a token
  // bucket never lets more through; 10% for timer slack), what it receives
  // does not. The lower bounds leave room for a loaded 2-core machine, where
  // the probes run next to the other daemons' profiling: the throttled
  // direction at a fifth of its limit at least, the others clearly above it.
  const auto& links = out["cluster_profile"]["links"];
  int from_dev3 = 0, to_dev3 = 0;
  for (const auto& l : links) {
    INFO(l.dump());
    if (l["from"] == "dev3") {
      CHECK(l["mbps"].get<double>() <= 22.0);
      CHECK(l["mbps"].get<double>() >= 4.0);
      // Its wire is mostly the throttle's waiting: what the ends' CPUs take
      // is the unthrottled rate of the coordinator's own links to them.
      REQUIRE(l.contains("cpu_mbps"));
      CHECK(l["cpu_mbps"].get<double>() > 30.0);
      ++from_dev3;
    } else if (l["to"] == "dev3") {
      CHECK(l["mbps"].get<double>() > 30.0);
      CHECK_FALSE(l.contains("cpu_mbps"));  // a loopback link's CPU is its wire
      ++to_dev3;
    }
  }
  CHECK(from_dev3 == 2);
  CHECK(to_dev3 == 2);
  CHECK(out["losses"].size() == 20);
  const auto& pred = out["prediction"];
  REQUIRE(pred["batch_seconds"].get<double>() > 0);
  REQUIRE(pred["measured_batch_seconds"].get<double>() > 0);
  CHECK(out["median_step_seconds"].get<double>() == pred["measured_batch_seconds"].get<double>());
  // Each planned stage's compute sits beside what its daemon was busy computing.
  REQUIRE(pred["stages"].size() == stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto& st = pred["stages"][s];
    INFO(st.dump());
    CHECK(st["stage"] == s);
    CHECK(st["compute_seconds"].get<double>() == Approx(stages[s]["compute_seconds"].get<double>()));
    CHECK(st["link_cpu_seconds"].get<double>() == stages[s]["link_cpu_seconds"].get<double>());
    CHECK(st["measured_compute_seconds"].get<double>() > 0);
    CHECK(st["measured_over_predicted"].get<double>() ==
          Approx(st["measured_compute_seconds"].get<double>() / st["compute_seconds"].get<double>()));
  }
  WARN("planned " << stages.size() << " stage(s); predicted " << pred["batch_seconds"].get<double>()
                  << " s/batch, measured " << pred["measured_batch_seconds"].get<double>() << " s/batch (ratio "
                  << pred["measured_over_predicted"].get<double>() << ")");
}
