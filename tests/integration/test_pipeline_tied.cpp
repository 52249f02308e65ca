// test_pipeline_tied.cpp: a GPT whose vocabulary projection is tied to its
// embedding ("tied_to", docs/models.md) on real cleaved daemons. Cut into two
// stages the tied weight would need its gradient exchanged between the first
// and the last stage, which is not implemented: the run is refused with a
// message that says so and what to do. On one daemon it trains like --local.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <string>

#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"
#include "integration/daemon_cluster.h"
#include "scratch_dir.h"
#include "text_corpus.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

namespace {

TrainConfig tied_config(test::TempDir& dir) {
  std::ifstream in(std::string(CLEAVE_SOURCE_DIR) + "/tests/fixtures/gpt-micro.json");
  nlohmann::json doc = nlohmann::json::parse(in);
  doc["layers"].back()["tied_to"] = 0;
  const std::string model = dir.file("gpt-tied.json");
  std::ofstream(model) << doc.dump();
  const std::string text = dir.file("corpus.txt");
  test::write_generated_text(text, 12000);
  TrainConfig cfg;
  cfg.model_path = model;
  cfg.text_path = text;
  cfg.batch = 16;
  cfg.seed = 2;
  cfg.limit_train = 96;  // 6 steps
  cfg.limit_test = 16;
  cfg.microbatches = 2;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 3e-3f;
  cfg.threads = 1;
  cfg.progress = false;
  return cfg;
}

}  // namespace

TEST_CASE("a tied GPT cut over 2 daemons is refused and says why", "[integration][pipeline][text][tying]") {
  test::TempDir dir;
  const TrainConfig cfg = tied_config(dir);
  DaemonCluster cluster(2);
  ClusterOptions cl = cluster.options(2);
  cl.planner = "balance";
  cl.shutdown_daemons = true;
  cl.on_listening = [&](const std::string& ep) { cluster.start_all(ep); };
  try {
    train_pipeline(cfg, cl);
    FAIL("the 2-stage tied model was accepted");
  } catch (const std::exception& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("shares layer 0's weight") != std::string::npos);
    CHECK(m.find("cannot be cut") != std::string::npos);
    CHECK(m.find("--local") != std::string::npos);
  }
}

TEST_CASE("a tied GPT on one daemon trains like --local", "[integration][pipeline][text][tying]") {
  test::TempDir dir;
  const TrainConfig cfg = tied_config(dir);
  const nlohmann::json local = train_local(cfg);
  DaemonCluster cluster(1);
  ClusterOptions cl = cluster.options(1);
  cl.shutdown_daemons = true;
  cl.on_listening = [&](const std::string& ep) { cluster.start_all(ep); };
  const nlohmann::json piped = train_pipeline(cfg, cl);
  REQUIRE(piped["losses"].size() == local["losses"].size());
  REQUIRE(local["losses"].size() == 6);
  for (size_t i = 0; i < local["losses"].size(); ++i) {
    const double x = local["losses"][i].get<double>(), y = piped["losses"][i].get<double>();
    INFO("step " << i << ": local " << x << ", 1 daemon " << y);
    CHECK(std::abs(x - y) <= 1e-4 * std::abs(x));
  }
  CHECK(local["parameters"] == piped["parameters"]);
}
