// test_train_step.cpp: the one-process training step (core/train/train_step.h).
//
// Micro-batches only cut a batch up: M of them give the gradient and the update
// of one micro-batch holding the whole batch. A few steps on a convex problem
// lower the loss. The step's halves compose to the step, the micro-batch's dx
// lets a front partition finish the backward pass, and the local trainer is
// exactly a loop of train_step over the seeded loader.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/fixtures.h"
#include "core/train/local_trainer.h"
#include "core/train/train_checkpoint.h"
#include "core/train/train_step.h"
#include "core/util/rng.h"

using namespace cleave;
using cleave::test::TempDir;
using cleave::test::write_text;

namespace {

std::unique_ptr<Device> cpu() {
  DeviceOptions o;
  o.threads = 1;
  return open_device("cpu", o);
}

ModelSpec parse_model(const std::string& text) { return ModelSpec::parse(nlohmann::json::parse(text), "test model"); }

// An MLP on 6 features; no dropout, so micro-batching changes nothing but the cut.
std::string mlp_text(const std::string& loss, int outputs) {
  return R"({"name": "mlp", "input": [6], "loss": ")" + loss + R"(", "layers": [
    {"type": "linear", "out_features": 10}, {"type": "tanh"},
    {"type": "linear", "out_features": 7}, {"type": "relu"},
    {"type": "linear", "out_features": )" + std::to_string(outputs) + "}]}";
}

// n samples of `features` values in [-1, 1); labels (x0 + x1 > 0) + (x2 > 0.3)
// for classification, or 2 x0 - x1 + 0.5 for regression.
Batch make_batch(int64_t n, int64_t features, bool classify, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.size = n;
  b.x_shape = {n, features};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t f = 0; f < features; ++f) b.x.push_back(rng.uniform(-1.0f, 1.0f));
    const float* x = b.x.data() + i * features;
    b.y.push_back(classify ? static_cast<float>((x[0] + x[1] > 0) + (x[2] > 0.3f)) : 2 * x[0] - x[1] + 0.5f);
  }
  return b;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| relative to max |b|.
double block_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
  return d / std::max(1e-30, static_cast<double>(max_abs(b)));
}

}  // namespace

TEST_CASE("a step of M micro-batches equals a step of one micro-batch of the whole batch", "[train]") {
  auto dev = cpu();
  for (const auto& [loss, outputs] : {std::pair<std::string, int>{"cross_entropy", 3}, {"mse", 1}}) {
    for (int m : {2, 5, 13}) {
      DYNAMIC_SECTION(loss << " with " << m << " micro-batches") {
        const ModelSpec spec = parse_model(mlp_text(loss, outputs));
        OptimizerConfig ocfg;
        ocfg.kind = "sgd";
        ocfg.lr = 0.1f;
        ocfg.momentum = 0.9f;
        const Batch batch = make_batch(13, 6, loss == "cross_entropy", 3);
        Partition whole(*dev, spec, 0, spec.num_layers()), cut(*dev, spec, 0, spec.num_layers());
        whole.init(11);
        cut.init(11);
        whole.zero_grad();
        cut.zero_grad();
        Optimizer whole_opt(*dev, ocfg, whole.param_count()), cut_opt(*dev, ocfg, cut.param_count());
        for (uint64_t step = 0; step < 3; ++step) {
          const DropoutKey key{5, step};
          const StepResult a = accumulate_gradients(whole, batch, 1, key);
          const StepResult b = accumulate_gradients(cut, batch, m, key);
          CHECK(whole.in_flight() == 0);
          CHECK(cut.in_flight() == 0);
          CHECK(a.samples == 13);
          CHECK(b.samples == 13);
          CHECK(b.correct == a.correct);
          CHECK(std::abs(b.loss_sum - a.loss_sum) <= 1e-6 * std::abs(a.loss_sum));
          CHECK(block_rel_diff(cut.grads().to_host(), whole.grads().to_host()) <= 1e-6);
          apply_gradients(whole, whole_opt);
          apply_gradients(cut, cut_opt);
          CHECK(max_abs(whole.grads().to_host()) == 0.0f);
          CHECK(block_rel_diff(cut.params().to_host(), whole.params().to_host()) <= 1e-6);
        }
      }
    }
  }
}

TEST_CASE("a few steps on a fixed convex problem lower the loss every step", "[train]") {
  auto dev = cpu();
  // Softmax regression: convex, so full-batch gradient descent with a small
  // step size decreases the loss monotonically.
  const ModelSpec spec = parse_model(R"({"name": "softmax", "input": [6], "loss": "cross_entropy",
    "layers": [{"type": "linear", "out_features": 3}]})");
  OptimizerConfig ocfg;
  ocfg.kind = "sgd";
  ocfg.lr = 0.2f;
  Partition model(*dev, spec, 0, spec.num_layers());
  model.init(2);
  model.zero_grad();
  Optimizer opt(*dev, ocfg, model.param_count());
  const Batch batch = make_batch(24, 6, /*classify=*/true, 9);
  std::vector<double> losses;
  for (uint64_t step = 0; step < 12; ++step) {
    const StepResult r = train_step(model, opt, batch, 3, DropoutKey{1, step});
    REQUIRE(r.samples == 24);
    losses.push_back(r.loss_sum / static_cast<double>(r.samples));
  }
  for (size_t i = 1; i < losses.size(); ++i) {
    INFO("step " << i << ": " << losses[i - 1] << " -> " << losses[i]);
    CHECK(losses[i] < losses[i - 1]);
  }
  CHECK(losses.back() < 0.8 * losses.front());
}

TEST_CASE("train_step is accumulate_gradients then apply_gradients", "[train]") {
  auto dev = cpu();
  const ModelSpec spec = parse_model(R"({"name": "drop", "input": [6], "loss": "cross_entropy", "layers": [
    {"type": "linear", "out_features": 12}, {"type": "dropout", "p": 0.5}, {"type": "linear", "out_features": 3}]})");
  OptimizerConfig ocfg;
  ocfg.kind = "adam";
  ocfg.lr = 0.01f;
  Partition a(*dev, spec, 0, spec.num_layers()), b(*dev, spec, 0, spec.num_layers());
  a.init(4);
  b.init(4);
  a.zero_grad();
  b.zero_grad();
  Optimizer oa(*dev, ocfg, a.param_count()), ob(*dev, ocfg, b.param_count());
  const Batch batch = make_batch(10, 6, true, 1);
  for (uint64_t step = 0; step < 3; ++step) {
    const DropoutKey key = DropoutKey::in_round(8, 2, step);
    const StepResult ra = train_step(a, oa, batch, 2, key);
    const StepResult rb = accumulate_gradients(b, batch, 2, key);
    apply_gradients(b, ob);
    CHECK(ra.loss_sum == rb.loss_sum);
    CHECK(a.params().to_host() == b.params().to_host());
  }
  // The dropout key reaches the masks: another step number, another loss.
  Partition c(*dev, spec, 0, spec.num_layers());
  c.init(4);
  c.zero_grad();
  const double l0 = accumulate_gradients(c, batch, 1, DropoutKey{8, 0}).loss_sum;
  c.zero_grad();
  CHECK(accumulate_gradients(c, batch, 1, DropoutKey{8, 0}).loss_sum == l0);
  c.zero_grad();
  CHECK(accumulate_gradients(c, batch, 1, DropoutKey{8, 1}).loss_sum != l0);
}

TEST_CASE("DropoutKey names (seed, [round,] step, micro-batch)", "[train]") {
  const DropoutKey plain{7, 3};
  CHECK(plain.microbatch_seed(2) == derive_seed(7, 3, 2));
  const DropoutKey in_round = DropoutKey::in_round(7, 4, 3);
  CHECK(in_round.microbatch_seed(2) == derive_seed(7, 4, 3, 2));
  CHECK(in_round.microbatch_seed(0) == derive_seed(7, 4, 3));  // one micro-batch: (seed, round, local step)
  CHECK(in_round.microbatch_seed(0) != plain.microbatch_seed(0));
  CHECK(plain.microbatch_seed(0) != plain.microbatch_seed(1));
  CHECK(plain.microbatch_seed(0) != DropoutKey{7, 4}.microbatch_seed(0));
}

TEST_CASE("train_microbatch's dx finishes the backward pass through a front partition", "[train]") {
  auto dev = cpu();
  const ModelSpec spec = parse_model(mlp_text("cross_entropy", 3));
  const Batch batch = make_batch(8, 6, true, 5);
  Partition whole(*dev, spec, 0, spec.num_layers());
  Partition front(*dev, spec, 0, 2), tail(*dev, spec, 2, spec.num_layers());
  for (Partition* p : {&whole, &front, &tail}) {
    p->init(6);
    p->zero_grad();
  }
  const double want = accumulate_gradients(whole, batch, 1, DropoutKey{1, 0}).loss_sum;
  Tensor x(*dev, {8, 6});
  x.from_host(batch.x.data());
  Tensor t(*dev, {8});
  t.from_host(batch.y.data());
  const uint64_t seed = DropoutKey{1, 0}.microbatch_seed(0);
  Tensor h = front.forward(x, 0, /*training=*/true, seed);
  MicrobatchResult r = train_microbatch(tail, h, t, 0, seed, 1.0f / 8, /*need_dx=*/true);
  REQUIRE(r.dx.defined());
  CHECK(r.dx.shape() == h.shape());
  front.backward(r.dx, 0, /*need_dx=*/false);
  CHECK(r.loss.loss_sum == Approx(want).epsilon(1e-6));
  std::vector<float> joined = front.grads().to_host(), back = tail.grads().to_host();
  joined.insert(joined.end(), back.begin(), back.end());
  CHECK(block_rel_diff(joined, whole.grads().to_host()) <= 1e-6);
  CHECK(tail.in_flight() == 0);
  // Without need_dx there is none.
  Tensor h2 = front.forward(x, 1, /*training=*/true, seed);
  CHECK_FALSE(train_microbatch(tail, h2, t, 1, seed, 1.0f / 8, /*need_dx=*/false).dx.defined());
}

TEST_CASE("the step refuses what it cannot train", "[train]") {
  auto dev = cpu();
  const ModelSpec spec = parse_model(mlp_text("cross_entropy", 3));
  Partition model(*dev, spec, 0, spec.num_layers());
  model.init(1);
  model.zero_grad();
  Batch empty;
  empty.x_shape = {0, 6};
  CHECK_THROWS_AS(accumulate_gradients(model, empty, 1, {}), std::invalid_argument);
  const Batch batch = make_batch(4, 6, true, 1);
  CHECK_THROWS_AS(accumulate_gradients(model, batch, 0, {}), std::invalid_argument);
  Batch short_x = batch;
  short_x.x.pop_back();
  CHECK_THROWS_WITH(accumulate_gradients(model, short_x, 1, {}), Catch::Contains("holds"));
  Batch wide = make_batch(4, 7, true, 1);
  CHECK_THROWS_AS(accumulate_gradients(model, wide, 1, {}), std::invalid_argument);
  Partition front(*dev, spec, 0, 2);
  front.init(1);
  CHECK_THROWS_WITH(accumulate_gradients(front, batch, 1, {}), Catch::Contains("do not end the model"));
  // More micro-batches than samples: one sample each.
  CHECK(accumulate_gradients(model, batch, 9, {}).samples == 4);
  CHECK(model.in_flight() == 0);
}

TEST_CASE("the local trainer is train_step over the seeded loader", "[train]") {
  TempDir dir;
  // 23 rows: label, 6 features; the last batch of 5 is short.
  std::string rows;
  const Batch data = make_batch(23, 6, true, 17);
  for (int64_t i = 0; i < data.size; ++i) {
    rows += std::to_string(static_cast<int>(data.y[i]));
    for (int f = 0; f < 6; ++f) {
      rows += ',';
      rows += std::to_string(data.x[i * 6 + f]);
    }
    rows += '\n';
  }
  write_text(dir.file("toy-train.csv"), rows);
  write_text(dir.file("toy-test.csv"), rows);
  const std::string model_text = R"({"name": "toy", "input": [6], "loss": "cross_entropy", "layers": [
    {"type": "linear", "out_features": 10}, {"type": "relu"}, {"type": "dropout", "p": 0.3},
    {"type": "linear", "out_features": 3}]})";
  write_text(dir.file("toy.json"), model_text);

  TrainConfig cfg;
  cfg.model_path = dir.file("toy.json");
  cfg.dataset = dir.file("toy-train.csv");
  cfg.epochs = 2;
  cfg.batch = 6;
  cfg.seed = 21;
  cfg.microbatches = 2;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 0.01f;
  cfg.optimizer.schedule = "cosine";
  cfg.threads = 1;
  cfg.progress = false;
  cfg.save_path = dir.file("toy.ckpt");
  const nlohmann::json run = train_local(cfg);
  const std::vector<double> losses = run["losses"].get<std::vector<double>>();
  const std::vector<float> trained = load_training_state(cfg.save_path).params;

  auto dev = cpu();
  const ModelSpec spec = ModelSpec::load(cfg.model_path);
  const Dataset train = load_dataset(cfg.dataset, "", /*train=*/true);
  Partition model(*dev, spec, 0, spec.num_layers());
  model.init(cfg.seed);
  model.zero_grad();
  BatchLoader loader(train, cfg.batch, /*shuffle=*/true, cfg.seed);
  OptimizerConfig ocfg = cfg.optimizer;
  ocfg.total_steps = loader.batches_per_epoch() * cfg.epochs;
  Optimizer opt(*dev, ocfg, model.param_count());
  std::vector<double> mine;
  uint64_t step = 0;
  for (int e = 0; e < cfg.epochs; ++e) {
    loader.start_epoch(e);
    for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
      const StepResult r = train_step(model, opt, loader.get(b), cfg.microbatches, DropoutKey{cfg.seed, step++});
      mine.push_back(r.loss_sum / static_cast<double>(r.samples));
    }
  }
  REQUIRE(losses.size() == 8);
  CHECK(mine == losses);
  CHECK(model.params().to_host() == trained);
}
