// test_pipeline_text.cpp: --text across real cleaved daemons. A small GPT
// (tests/fixtures/gpt-micro.json) split over 2 daemons trains with the same
// per-step losses as in one process (1e-4 relative), gpipe and 1f1b: its
// labels travel as (batch, positions), the last stage scores every position,
// and the validation losses after each epoch agree too.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"
#include "integration/daemon_cluster.h"
#include "scratch_dir.h"
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

TEST_CASE("a GPT on --text across 2 daemons reproduces local training (gpipe and 1f1b)", "[integration][pipeline][text]") {
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
  for (const char* schedule : {"gpipe", "1f1b"}) {
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
