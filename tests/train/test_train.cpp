// test_train.cpp: core/train without Fashion-MNIST. microbatch_offset splits
// a batch into near-equal covering parts; evaluate() on a Linear layer with
// hand-set weights gives the accuracy and cross-entropy worked out by hand, for
// any evaluation batch; train_local on a small linearly separable CSV problem
// learns it, is reproducible from its seed, honours --max-steps and resumes
// from its checkpoint exactly; training and federated checkpoints are not
// mistaken for each other.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/data/dataset.h"
#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/train/evaluate.h"
#include "core/train/local_trainer.h"
#include "core/train/train_checkpoint.h"
#include "core/train/train_config.h"
#include "device/device.h"

#include "scratch_dir.h"

using namespace cleave;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using cleave::test::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  REQUIRE(out.good());
}

// Two features in [-1, 1]; the label is 1 when x0 > x1, else 0 (a linearly
// separable problem). Rows "label,x0,x1".
void write_separable_csv(const std::string& path, int rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::ofstream out(path);
  out << "label,x0,x1\n";
  for (int i = 0; i < rows; ++i) {
    float x0 = u(rng), x1 = u(rng);
    if (std::abs(x0 - x1) < 0.1f) x1 = -x1;  // keep a margin around the boundary (mostly)
    out << (x0 > x1 ? 1 : 0) << "," << x0 << "," << x1 << "\n";
  }
  REQUIRE(out.good());
}

const char* kTwoLayerModel = R"({"name": "sep", "input": [2], "loss": "cross_entropy",
  "layers": [{"type": "linear", "out_features": 8}, {"type": "relu"}, {"type": "linear", "out_features": 2}]})";

std::vector<double> losses_of(const nlohmann::json& j) { return j.at("losses").get<std::vector<double>>(); }

double mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

}  // namespace

TEST_CASE("microbatch_offset splits a batch into near-equal parts that cover it", "[train]") {
  for (int64_t batch : {1, 7, 64, 100}) {
    for (int m : {1, 2, 3, 4, 7}) {
      if (m > batch) continue;
      INFO("batch " << batch << ", " << m << " micro-batches");
      CHECK(microbatch_offset(batch, m, 0) == 0);
      CHECK(microbatch_offset(batch, m, m) == batch);
      for (int i = 0; i < m; ++i) {
        const int64_t size = microbatch_offset(batch, m, i + 1) - microbatch_offset(batch, m, i);
        CHECK(size >= batch / m);      // floor
        CHECK(size <= (batch + m - 1) / m);  // ceil
      }
    }
  }
  // 7 into 3: offsets 0, 2, 4, 7 (7 * i / 3 rounded down) -> parts of 2, 2, 3.
  CHECK(microbatch_offset(7, 3, 1) == 2);
  CHECK(microbatch_offset(7, 3, 2) == 4);
  CHECK_THROWS_WITH(microbatch_offset(4, 5, 0), Contains("batch of 4 samples into 5 micro-batches"));
  CHECK_THROWS_WITH(microbatch_offset(4, 0, 0), Contains("into 0 micro-batches"));
  CHECK_THROWS_WITH(microbatch_offset(4, 2, 3), Contains("outside [0, 2]"));
  CHECK_THROWS_WITH(microbatch_offset(4, 2, -1), Contains("outside [0, 2]"));
}

TEST_CASE("evaluate: accuracy and mean cross-entropy of hand-set weights, for any batch", "[train]") {
  DeviceOptions one_thread;
  one_thread.threads = 1;
  auto cpu = open_device("cpu", one_thread);
  const ModelSpec spec = ModelSpec::parse(nlohmann::json::parse(R"({"name": "id", "input": [2],
      "loss": "cross_entropy", "layers": [{"type": "linear", "out_features": 2}]})"),
                                          "test");
  Partition model(*cpu, spec, 0, 1);
  REQUIRE(model.param_count() == 6);
  // weight = identity (row-major (out, in)), bias = 0: the logits are the input.
  model.params().from_host(std::vector<float>{1, 0, 0, 1, 0, 0});
  Dataset d;
  d.name = "hand";
  d.sample_shape = {2};
  d.num_classes = 2;
  d.x = {2, 0, 0, 3, 1, 0, 0, 1};  // four samples
  d.y = {0, 1, 1, 0};              // right, right, wrong, wrong
  // Cross-entropy of logits z for class c: log(e^z0 + e^z1) - z_c.
  //   (2, 0) c=0: log(1 + e^-2);  (0, 3) c=1: log(1 + e^-3);  (1, 0) c=1 and (0, 1) c=0: log(1 + e).
  const double want_loss =
      (std::log1p(std::exp(-2.0)) + std::log1p(std::exp(-3.0)) + 2 * std::log1p(std::exp(1.0))) / 4;
  for (int64_t batch : {1, 3, 4, 100}) {
    INFO("batch " << batch);
    const EvalResult r = evaluate(model, d, batch);
    CHECK(r.samples == 4);
    CHECK(r.accuracy == 0.5);
    CHECK(r.loss == Approx(want_loss).epsilon(1e-5));
  }
  // Swapped weight rows: logits (x1, x0), predictions 1, 0, 1, 0 -> two of {0, 1, 1, 0} right,
  // all of {1, 0, 1, 0}, none of {0, 1, 0, 1}.
  model.params().from_host(std::vector<float>{0, 1, 1, 0, 0, 0});
  CHECK(evaluate(model, d, 2).accuracy == 0.5);
  d.y = {1, 0, 1, 0};
  CHECK(evaluate(model, d, 2).accuracy == 1.0);
  d.y = {0, 1, 0, 1};
  CHECK(evaluate(model, d, 3).accuracy == 0.0);
  CHECK_THROWS_WITH(evaluate(model, d, 0), Contains("batch must be positive"));
  CHECK_THROWS_WITH(evaluate(model, d, -4), Contains("batch must be positive"));
}

TEST_CASE("train_local learns a separable CSV problem, reproducibly", "[train]") {
  TempDir dir;
  write_separable_csv(dir.file("train.csv"), 256, 1);
  write_separable_csv(dir.file("test.csv"), 200, 2);
  write_text(dir.file("model.json"), kTwoLayerModel);
  TrainConfig c;
  c.model_path = dir.file("model.json");
  c.dataset = dir.file("train.csv");
  c.epochs = 6;
  c.batch = 16;
  c.seed = 3;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 0.05f;
  c.threads = 1;
  c.progress = false;
  const nlohmann::json a = train_local(c);
  const std::vector<double> la = losses_of(a);
  REQUIRE(la.size() == 6u * 16u);  // 256 / 16 steps per epoch
  CHECK(a.at("steps") == 96);
  for (double l : la) CHECK(std::isfinite(l));
  INFO("first epoch mean loss " << mean(la, 0, 16) << ", last " << mean(la, 80, 96) << ", test accuracy "
                                << a.at("test_accuracy").get<double>());
  CHECK(mean(la, 80, 96) < 0.5 * mean(la, 0, 16));
  CHECK(a.at("test_accuracy").get<double>() > 0.9);  // chance is 0.5

  // The same seed repeats every loss; another seed starts elsewhere.
  CHECK(losses_of(train_local(c)) == la);
  TrainConfig other = c;
  other.seed = 4;
  CHECK(losses_of(train_local(other)) != la);

  // --max-steps stops early with the same first losses.
  TrainConfig capped = c;
  capped.max_steps = 5;
  const std::vector<double> lc = losses_of(train_local(capped));
  REQUIRE(lc.size() == 5);
  CHECK(std::vector<double>(la.begin(), la.begin() + 5) == lc);
}

TEST_CASE("train_local resumed from its mid-epoch checkpoint repeats the uninterrupted losses", "[train][checkpoint]") {
  TempDir dir;
  write_separable_csv(dir.file("train.csv"), 100, 5);
  write_separable_csv(dir.file("test.csv"), 50, 6);
  write_text(dir.file("model.json"), kTwoLayerModel);
  TrainConfig c;
  c.model_path = dir.file("model.json");
  c.dataset = dir.file("train.csv");
  c.epochs = 3;
  c.batch = 8;  // 13 steps per epoch, the last one of 4 samples
  c.seed = 9;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 0.01f;
  c.threads = 1;
  c.progress = false;
  const std::vector<double> all = losses_of(train_local(c));
  REQUIRE(all.size() == 39);

  TrainConfig first = c;
  first.max_steps = 17;  // stops inside epoch 2
  first.save_path = dir.file("run.ck");
  REQUIRE(losses_of(train_local(first)).size() == 17);
  const TrainingState st = load_training_state(first.save_path);
  CHECK(st.position.step == 17);
  CHECK(st.position.epoch == 1);
  CHECK(st.position.batch == 4);
  CHECK(st.batch_size == 8);
  CHECK(st.seed == 9);

  TrainConfig rest = c;
  rest.load_path = first.save_path;
  const std::vector<double> tail = losses_of(train_local(rest));
  REQUIRE(tail.size() == all.size() - 17);
  for (size_t i = 0; i < tail.size(); ++i) {
    INFO("step " << 17 + i);
    CHECK(tail[i] == Approx(all[17 + i]).epsilon(1e-6));
  }

  // Another batch size, or a training checkpoint read as a federated one, is refused by name.
  TrainConfig wrong_batch = rest;
  wrong_batch.batch = 4;
  CHECK_THROWS_WITH(train_local(wrong_batch), Contains(first.save_path) && Contains("--batch 8"));
  CHECK_THROWS_WITH(load_fed_state(first.save_path), Contains(first.save_path) && Contains("not a federated one"));
  // Either kind gives its weights to `cleave export`.
  CHECK(load_checkpoint_weights(first.save_path).params == st.params);
}

TEST_CASE("federated checkpoints round-trip and are not resumed as training runs", "[train][checkpoint]") {
  TempDir dir;
  const ModelSpec spec = ModelSpec::parse(nlohmann::json::parse(kTwoLayerModel), "test");
  FedState s;
  s.model = spec.to_json();
  s.run = {{"strategy", "median"}};
  s.rounds_done = 3;
  s.seed = 11;
  s.params = std::vector<float>(8 * 2 + 8 + 2 * 8 + 2, 0.25f);
  const std::string path = dir.file("fed.ck");
  save_fed_state(path, s);
  const FedState back = load_fed_state(path);
  CHECK(back.rounds_done == 3);
  CHECK(back.seed == 11);
  CHECK(back.params == s.params);
  CHECK(back.run.at("strategy") == "median");
  CHECK(load_checkpoint_weights(path).params == s.params);
  CHECK_THROWS_WITH(load_training_state(path), Contains(path) && Contains("federated checkpoint"));
}

TEST_CASE("train_local refuses a model whose input does not match the data", "[train]") {
  TempDir dir;
  write_separable_csv(dir.file("train.csv"), 20, 7);
  write_separable_csv(dir.file("test.csv"), 20, 8);
  write_text(dir.file("model.json"), R"({"name": "wide", "input": [3], "loss": "cross_entropy",
    "layers": [{"type": "linear", "out_features": 2}]})");
  TrainConfig c;
  c.model_path = dir.file("model.json");
  c.dataset = dir.file("train.csv");
  c.threads = 1;
  c.progress = false;
  CHECK_THROWS_WITH(train_local(c), Contains(c.model_path) && Contains("does not match"));
}
