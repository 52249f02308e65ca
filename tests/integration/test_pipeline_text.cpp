// test_pipeline_text.cpp: --text across real cleaved daemons. A small GPT
// (tests/fixtures/gpt-micro.json) split over 2 daemons trains with the same
// per-step losses as in one process (1e-4 relative), gpipe, 1f1b and zb1: its
// labels travel as (batch, positions), the last stage scores every position,
// and the validation losses after each epoch agree too. And the point of the
// project: gpt-small, which one 64 MiB daemon refuses, trains across three.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"
#include "integration/daemon_cluster.h"
#include "core/data/dataset.h"
#include "scratch_dir.h"
#include "skip.h"
#include "text_corpus.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

namespace {

void check_close(const nlohmann::json& a, const nlohmann::json& b, const char* what) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i].get<double>(), y = b[i].get<double>();
    INFO(what << " " << i << ": local " << x << " pipeline " << y);
    CHECK(std::abs(x - y) <= 1e-4 * std::abs(x));
  }
}

}  // namespace

TEST_CASE("a GPT on --text across 2 daemons reproduces local training (gpipe, 1f1b and zb1)",
          "[integration][pipeline][text]") {
  test::TempDir dir;
  const std::string text = dir.file("corpus.txt");
  test::write_generated_text(text, 20000);
  TrainConfig cfg;
  cfg.model_path = std::string(CLEAVE_SOURCE_DIR) + "/tests/fixtures/gpt-micro.json";
  cfg.text_path = text;
  cfg.epochs = 2;
  cfg.batch = 16;
  cfg.seed = 11;
  cfg.limit_train = 160;  // 10 steps an epoch
  cfg.limit_test = 32;
  cfg.microbatches = 4;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 3e-3f;
  cfg.threads = 1;
  cfg.progress = false;
  const nlohmann::json local = train_local(cfg);
  REQUIRE(local["losses"].size() == 20);
  REQUIRE(local["val_losses"].size() == 2);
  for (const char* schedule : {"gpipe", "1f1b", "zb1"}) {
    DYNAMIC_SECTION("schedule " << schedule) {
      DaemonCluster cluster(2);
      ClusterOptions cl = cluster.options(2);
      cl.schedule = schedule;
      cl.shutdown_daemons = true;
      cl.on_listening = [&](const std::string& ep) { cluster.start_all(ep); };
      const nlohmann::json piped = train_pipeline(cfg, cl);
      CHECK(piped["mode"] == "pipeline");
      CHECK(piped["plan"].size() == 2);
      check_close(local["losses"], piped["losses"], "step");
      check_close(local["val_losses"], piped["val_losses"], "epoch");
      CHECK(std::abs(piped["val_loss"].get<double>() - local["val_loss"].get<double>()) <=
            1e-4 * local["val_loss"].get<double>());
      CHECK(piped["val_bits_per_byte"].get<double>() == Approx(piped["val_loss"].get<double>() / std::log(2.0)));
    }
  }
}

// Issue 16: "gpt-small is refused by one daemon started with --memory-limit
// 64M (the message says how much it needs) and trains across three such
// daemons, the planner placing the blocks; its validation loss falls below a
// stated value within a stated number of steps": 3.6 nats/byte (from ln 256 =
// 5.55) within 60 steps of 4 windows of 128 bytes of the fortunes.
TEST_CASE("gpt-small is refused by one 64 MiB daemon and learns across three, placed by the planner",
          "[integration][pipeline][text][slow]") {
  test::TempDir dir;
  std::string text;
  try {
    text = write_fortunes_text(kFortunesDir, dir.file("fortunes.txt"));
  } catch (const std::exception& e) {
    CLEAVE_SKIP("Debian's fortunes are not installed (" << e.what() << ")");
  }
  TrainConfig cfg;
  cfg.model_path = std::string(CLEAVE_SOURCE_DIR) + "/models/gpt-small.json";
  cfg.text_path = text;
  cfg.batch = 4;
  cfg.microbatches = 4;
  cfg.max_steps = 60;
  cfg.limit_test = 64;
  cfg.seed = 3;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 1e-3f;
  cfg.threads = 1;
  cfg.progress = false;
  const std::vector<std::string> small = {"--memory-limit", "64M"};
  {
    DaemonCluster one(1);
    ClusterOptions cl = one.options(1);
    cl.schedule = "1f1b";
    cl.on_listening = [&](const std::string& ep) { one.start(1, ep, small); };
    CHECK_THROWS_WITH(train_pipeline(cfg, cl), Catch::Contains("dev1 cannot host stage 0") &&
                                                   Catch::Contains("it needs") &&
                                                   Catch::Contains("only 64.0 MiB is available under --memory-limit"));
  }
  DaemonCluster three(3);
  ClusterOptions cl = three.options(3, "auto");
  cl.schedule = "1f1b";
  cl.on_listening = [&](const std::string& ep) {
    for (int i = 1; i <= 3; ++i) three.start(i, ep, small);
  };
  const nlohmann::json out = train_pipeline(cfg, cl);
  INFO(out["stages"].dump(1));
  CHECK(out["planner"] == "auto");
  REQUIRE(out["stages"].size() == 3);  // no two stages fit one 64 MiB device: all three are needed
  int cut = 0;
  for (const auto& s : out["stages"]) {
    CHECK(s["layers"][0].get<int>() == cut);  // contiguous blocks, every layer placed once
    cut = s["layers"][1].get<int>();
    CHECK(s["estimated_memory_bytes"].get<int64_t>() <= int64_t{64} << 20);
    CHECK(s["peak_memory_bytes"].get<int64_t>() <= int64_t{64} << 20);
  }
  CHECK(cut == 12);
  CHECK(out["losses"].size() == 60);
  CHECK(out["val_loss"].get<double>() < 3.6);
}
