// test_pipeline_checkpoint.cpp: --save, --load and --init across real cleaved
// daemons. A distributed run stopped after some steps and resumed from its
// checkpoint reproduces the uninterrupted run; a distributed checkpoint is the
// same file as a local one, so each resumes the other; --init starts every
// stage from a safetensors file; a checkpoint that does not fit is refused
// before any daemon is assigned.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>

#include "core/io/safetensors.h"
#include "core/io/state_dict.h"
#include "core/model/model_spec.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"
#include "core/train/train_checkpoint.h"
#include "integration/daemon_cluster.h"
#include "integration/test_run.h"
#include "skip.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

namespace {

// 2 epochs of 10 steps (320 samples, batch 32) of the CNN with Adam.
TrainConfig resume_config() {
  TrainConfig c = cleave::testing::test_run("models/cnn.json", 32, 5);
  c.epochs = 2;
  c.limit_train = 320;
  c.limit_test = 200;
  c.microbatches = 2;
  return c;
}

// One distributed run of `cfg` over 2 fresh daemons.
nlohmann::json run_on_daemons(const TrainConfig& cfg) {
  DaemonCluster cluster(2);
  ClusterOptions cl = cluster.options(2);
  cl.shutdown_daemons = true;
  cl.on_listening = [&](const std::string& ep) { cluster.start_all(ep); };
  return train_pipeline(cfg, cl);
}

std::vector<double> losses_of(const nlohmann::json& run) { return run["losses"].get<std::vector<double>>(); }

void require_same_losses(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]));
  }
}

std::vector<double> tail(const std::vector<double>& v, size_t from) { return {v.begin() + static_cast<long>(from), v.end()}; }

}  // namespace

TEST_CASE("a distributed run resumed from its checkpoint continues as if never stopped", "[integration][pipeline][checkpoint]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster scratch(0);  // a temp dir for the checkpoints
  const std::string ck = scratch.dir() + "/piped.ckpt", ck_end = scratch.dir() + "/piped-end.ckpt",
                    ck_local = scratch.dir() + "/local.ckpt";
  TrainConfig cfg = resume_config();
  const nlohmann::json whole = run_on_daemons(cfg);
  const std::vector<double> all = losses_of(whole);
  REQUIRE(all.size() == 20);

  TrainConfig first = cfg;
  first.max_steps = 7;  // stops inside the first epoch
  first.save_path = ck;
  const nlohmann::json part1 = run_on_daemons(first);
  CHECK(part1["steps"] == 7);
  const TrainingState saved = load_training_state(ck);
  CHECK(saved.position.epoch == 0);
  CHECK(saved.position.batch == 7);
  CHECK(saved.position.step == 7);
  CHECK(saved.optimizer_state["steps_taken"] == 7);
  CHECK(saved.optimizer_blocks.size() == 2);  // Adam's two moments, whole-model length
  CHECK(saved.optimizer_blocks[0].size() == saved.params.size());

  TrainConfig second = cfg;
  second.load_path = ck;
  second.save_path = ck_end;
  const nlohmann::json part2 = run_on_daemons(second);
  CHECK(part2["start_step"] == 7);
  CHECK(part2["steps"] == 13);
  // Same daemons' arithmetic, same batches, same optimizer state: the same run.
  require_same_losses(losses_of(part1), std::vector<double>(all.begin(), all.begin() + 7), 1e-6);
  require_same_losses(losses_of(part2), tail(all, 7), 1e-6);
  CHECK(std::abs(part2["test_accuracy"].get<double>() - whole["test_accuracy"].get<double>()) <= 1e-9);
  const TrainingState end = load_training_state(ck_end);
  CHECK(end.position.epoch == 2);
  CHECK(end.position.batch == 0);
  CHECK(end.position.step == 20);

  SECTION("a local run resumes the distributed checkpoint") {
    TrainConfig local = cfg;
    local.load_path = ck;
    require_same_losses(losses_of(train_local(local)), tail(all, 7), 1e-4);
  }
  SECTION("a distributed run resumes a local checkpoint") {
    TrainConfig local = cfg;
    local.max_steps = 12;
    local.save_path = ck_local;
    (void)train_local(local);
    TrainConfig piped = cfg;
    piped.load_path = ck_local;
    const nlohmann::json resumed = run_on_daemons(piped);
    CHECK(resumed["start_step"] == 12);
    require_same_losses(losses_of(resumed), tail(all, 12), 1e-4);
  }
}

TEST_CASE("distributed training started with --init takes every stage from a safetensors file", "[integration][pipeline][checkpoint]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster scratch(0);
  TrainConfig cfg = resume_config();
  cfg.epochs = 1;
  const ModelSpec spec = ModelSpec::load(cfg.model_path);
  std::vector<float> params;
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  for (const auto& slot : param_slots(spec)) {
    int64_t n = 1;
    for (int64_t d : slot.shape) n *= d;
    for (int64_t i = 0; i < n; ++i) params.push_back(dist(gen));
  }
  cfg.init_path = scratch.dir() + "/init.safetensors";
  write_safetensors(cfg.init_path, state_dict(spec, params));
  const std::vector<double> local = losses_of(train_local(cfg));
  const std::vector<double> piped = losses_of(run_on_daemons(cfg));
  require_same_losses(piped, local, 1e-4);
  TrainConfig seeded = cfg;
  seeded.init_path.clear();
  CHECK(std::abs(losses_of(train_local(seeded))[0] - local[0]) > 1e-3);  // the file, not the seed, decided
}

TEST_CASE("a checkpoint that does not fit is refused before any daemon is assigned", "[integration][pipeline][checkpoint]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster scratch(0);
  TrainConfig mlp = resume_config();
  mlp.model_path = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  mlp.max_steps = 1;
  mlp.save_path = scratch.dir() + "/mlp.ckpt";
  (void)train_local(mlp);
  TrainConfig cnn = resume_config();
  cnn.load_path = mlp.save_path;
  try {
    (void)run_on_daemons(cnn);
    FAIL("a checkpoint of another model was accepted");
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find(mlp.save_path) != std::string::npos);
  }
  TrainConfig both = resume_config();
  both.load_path = mlp.save_path;
  both.init_path = scratch.dir() + "/w.safetensors";
  CHECK_THROWS_WITH(run_on_daemons(both), Catch::Contains("give one of them"));
}
