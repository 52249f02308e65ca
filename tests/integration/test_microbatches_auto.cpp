// test_microbatches_auto.cpp: --microbatches auto (issue 17) against the real
// binaries: two cleaved daemons profiled at two micro-batch sizes train with
// the count the planner chose, and the result says which count and that it
// was chosen; `cleave plan --microbatches auto` writes the same keys; bad
// values and combinations are usage errors naming the flag.
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
  for (const auto& d : out.at("cluster_profile").at("devices")) {
    INFO(d.dump());
    REQUIRE(d.contains("layer_microbatch_seconds"));
    CHECK(d.at("layer_microbatch_seconds").size() == d.at("layer_seconds").size());
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

TEST_CASE("cleave plan --microbatches auto writes the count it chose", "[cli][plan][microbatches]") {
  TempDir dir;
  const std::string devices = dir.file("devices.json");
  write_text(devices, R"({"devices": [{"name": "small", "memory": "24M", "gflops": 200},
                                      {"name": "big", "memory": "4G", "gflops": 20}],
                          "default_link": {"mbps": 1000, "latency_ms": 0.5}})");
  const std::string out = dir.file("plan.json");
  const RunResult r = run_cleave("plan --model '" + kMlp + "' --devices '" + devices +
                                 "' --batch 32 --microbatches auto --json '" + out + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("(--microbatches auto)") != std::string::npos);
  const nlohmann::json plan = read_json(out);
  CHECK(plan.at("microbatches_auto") == true);
  const int m = plan.at("microbatches").get<int>();
  CHECK(m >= 1);
  CHECK(m <= 32);
  // A number stays a number, and says it was not chosen.
  REQUIRE(run_cleave("plan --model '" + kMlp + "' --devices '" + devices + "' --microbatches 3 --json '" + out + "'")
              .code == 0);
  CHECK(read_json(out).at("microbatches") == 3);
  CHECK(read_json(out).at("microbatches_auto") == false);

  for (const std::string& base : {"plan --model '" + kMlp + "' --devices '" + devices + "'",
                                  "train --model '" + kMlp + "' --devices 2"}) {
    require_usage_error(base + " --microbatches 0", {"--microbatches", "must be positive"});
    require_usage_error(base + " --microbatches foo", {"--microbatches", "'foo'", "auto"});
    require_usage_error(base + " --microbatches 2.5", {"--microbatches", "whole number"});
  }
  require_usage_error("train --local --model '" + kMlp + "' --microbatches auto", {"--microbatches auto", "--local"});
  require_usage_error("train --model '" + kMlp + "' --devices 2 --planner balance --microbatches auto",
                      {"--microbatches auto", "--planner auto"});
}
