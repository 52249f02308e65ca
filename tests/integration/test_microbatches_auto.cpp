// test_microbatches_auto.cpp: --microbatches auto (issue 17) against the real
// binaries: two cleaved daemons profiled at two micro-batch sizes train with
// the count the planner chose, and the result says which count and that it
// was chosen (`cleave plan --microbatches auto` and the flag's usage errors:
// tests/apps/test_commands.cpp).
#include <catch2/catch.hpp>

#include <cmath>

#include "apps/cli_util.h"
#include "core/runtime/coordinator/pipeline.h"
#include "integration/daemon_cluster.h"
#include "skip.h"

using namespace cleave;
using namespace cleave::cli_test;
using cleave::testing::DaemonCluster;

TEST_CASE("a pipeline trains with the micro-batch count the planner chose", "[integration][planner][microbatches]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TrainConfig cfg;
  cfg.model_path = kMlp;
  cfg.batch = 32;
  cfg.microbatches = 1;  // replaced by the planner's choice
  cfg.limit_train = 256;
  cfg.limit_test = 100;
  cfg.optimizer.kind = "sgd";
  cfg.optimizer.lr = 0.05f;
  cfg.progress = false;
  DaemonCluster cluster(2);
  ClusterOptions cl = cluster.options(2, "auto");
  cl.microbatches_auto = true;
  cl.shutdown_daemons = true;
  cl.on_listening = [&](const std::string& ep) { cluster.start_all(ep); };
  const nlohmann::json out = train_pipeline(cfg, cl);
  INFO(out.dump().substr(0, 4000));
  CHECK(out.at("microbatches_auto") == true);
  const int m = out.at("microbatches").get<int>();
  CHECK(m >= 1);
  CHECK(m <= 32);
  // The plan it trained with is the planner's, for that count.
  const nlohmann::json& plan = out.at("planner_plan");
  CHECK(plan.at("microbatches") == m);
  CHECK(plan.at("microbatches_auto") == true);
  CHECK(plan.at("microbatch_size") == (32 + m - 1) / m);
  // Each device was timed at two micro-batch sizes: a fixed time per micro-batch per layer.
  // The two one-thread daemons share this machine: where its cores hold both,
  // they were also timed side by side (host_contention).
  const auto& devices = out.at("cluster_profile").at("devices");
  REQUIRE(devices.size() == 2);
  const bool both_fit = devices[0].at("host") == devices[1].at("host") &&
                        devices[0].at("cpu_threads").get<double>() + devices[1].at("cpu_threads").get<double>() <=
                            devices[0].at("host_cores").get<double>();
  for (const auto& d : devices) {
    INFO(d.dump());
    REQUIRE(d.contains("layer_microbatch_seconds"));
    CHECK(d.at("layer_microbatch_seconds").size() == d.at("layer_seconds").size());
    CHECK(d.contains("host_contention") == both_fit);
    if (both_fit) {
      CHECK(d.at("host_contention").get<double>() > 0.5);
      CHECK(d.at("host_contention").get<double>() < 5);
    }
  }
  // It trained: every step reported a finite loss.
  const auto& losses = out.at("losses");
  CHECK(losses.size() == 8);
  for (const auto& l : losses) CHECK(std::isfinite(l.get<double>()));
  const auto& pred = out.at("prediction");
  CHECK(pred.at("batch_seconds").get<double>() > 0);
  WARN("--microbatches auto chose " << m << " on " << plan.at("num_stages") << " stage(s); predicted "
                                    << pred.at("batch_seconds") << " s/batch, measured "
                                    << pred.at("measured_batch_seconds") << " (ratio "
                                    << pred.at("measured_over_predicted") << ")");
}
