// test_partition.cpp: parameter blocks and layouts, initialisation, whole-model
// vs split equivalence, micro-batch interleaving, and misuse errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/model/partition.h"
#include "core/nn/loss.h"
#include "nn/nn_test_util.h"

using namespace cleave;
using namespace cleave::test;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

// Every layer type in one small model: (2, 6, 6) -> (4).
ModelSpec mixed_model(double dropout_p) {
  const json doc = {
      {"name", "mixed"},
      {"input", {2, 6, 6}},
      {"loss", "cross_entropy"},
      {"layers",
       {{{"type", "conv2d"}, {"out_channels", 3}, {"kernel", 3}, {"padding", 1}},
        {{"type", "layernorm"}},
        {{"type", "gelu"}},
        {{"type", "maxpool2d"}, {"kernel", 2}},
        {{"type", "avgpool2d"}, {"kernel", 3}, {"stride", 1}, {"padding", 1}},
        {{"type", "tanh"}},
        {{"type", "dropout"}, {"p", dropout_p}},
        {{"type", "flatten"}},
        {{"type", "linear"}, {"out_features", 8}},
        {{"type", "relu"}},
        {{"type", "linear"}, {"out_features", 4}}}}};
  return ModelSpec::parse(doc, "mixed");
}

std::vector<float> labels_for(int64_t batch, int64_t classes) {
  std::vector<float> l(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) l[static_cast<size_t>(i)] = static_cast<float>((i * 7 + 3) % classes);
  return l;
}

// Cross-entropy gradient of the mean over `total` samples for output rows with labels.
Tensor loss_grad(const Tensor& out, const std::vector<float>& labels, int64_t total) {
  Tensor d(cpu(), out.shape());
  compute_loss(cpu(), LossKind::cross_entropy, out, upload(cpu(), {out.dim(0)}, labels), d,
               1.0f / static_cast<float>(total));
  return d;
}

void require_close(const std::vector<float>& a, const std::vector<float>& b, double tol = 1e-5) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i << ": " << a[i] << " vs " << b[i]);
    REQUIRE(std::fabs(a[i] - b[i]) <= tol * (1 + std::fabs(b[i])));
  }
}

// Host copy of a block; empty for a partition without parameters.
std::vector<float> host(const Tensor& t) { return t.defined() ? t.to_host() : std::vector<float>{}; }

std::vector<float> concat(const std::vector<std::vector<float>>& parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

TEST_CASE("partition: shipped models' parameter counts and PyTorch layouts", "[model][partition]") {
  const ModelSpec cnn = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json");
  Partition p(cpu(), cnn, 0, cnn.num_layers());
  CHECK(p.param_count() == 320 + 18496 + (3136 * 128 + 128) + 1290);
  CHECK(p.param_offset(0) == 0);
  CHECK(p.param_offset(3) == 320);
  CHECK(p.param_offset(7) == 320 + 18496);
  const auto info = p.layer(3).param_info();
  REQUIRE(info.size() == 2);
  CHECK(info[0].name == "weight");
  CHECK(info[0].shape == Shape{64, 32, 3, 3});
  CHECK(info[1].name == "bias");
  CHECK(info[1].offset == 64 * 32 * 9);
  CHECK(p.layer(7).param_info()[0].shape == Shape{128, 3136});
  CHECK(p.input_shape() == Shape{1, 28, 28});
  CHECK(p.output_shape() == Shape{10});

  const ModelSpec mlp = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json");
  Partition m(cpu(), mlp, 0, mlp.num_layers());
  CHECK(m.param_count() == 785 * 1024 + 2 * 1025 * 1024 + 1025 * 10);

  // A partition of parameter-free layers has no blocks.
  Partition free(cpu(), cnn, 1, 3);
  CHECK(free.param_count() == 0);
  CHECK(!free.params().defined());
  free.init(1);
  free.zero_grad();
}

// backward(need_dx = false), as the first stage runs it, starts at the first
// layer with parameters and skips that layer's input gradient; the layer
// profile times the model's first layers the same way.
TEST_CASE("partition: the first layer a backward without input gradient runs", "[model][partition]") {
  const ModelSpec mlp = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json");  // flatten, linear, ...
  CHECK(Partition(cpu(), mlp, 0, mlp.num_layers()).first_trained_layer() == 1);
  CHECK(Partition(cpu(), mlp, 2, mlp.num_layers()).first_trained_layer() == 3);  // relu, linear, ...
  CHECK(Partition(cpu(), mlp, 1, 2).first_trained_layer() == 1);
  CHECK(Partition(cpu(), mlp, 0, 1).first_trained_layer() == 1);  // none: end()
  const ModelSpec gpt = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/gpt-tiny.json");
  CHECK(Partition(cpu(), gpt, 0, gpt.num_layers()).first_trained_layer() == 0);  // the embedding
  CHECK(Partition(cpu(), gpt, 1, 3).first_trained_layer() == 1);                 // position embedding: a table

  // Without need_dx the layers before it run no backward: the leading flatten
  // gets no input gradient, and the first linear's weight gradient is the same.
  Partition whole(cpu(), mlp, 0, mlp.num_layers());
  whole.init(3);
  Rng rng(9);
  Tensor x(cpu(), {2, 1, 28, 28}), dy(cpu(), {2, 10});
  std::vector<float> hx(static_cast<size_t>(x.numel())), hy(20);
  for (auto& v : hx) v = rng.uniform(-1.f, 1.f);
  for (auto& v : hy) v = rng.uniform(-1.f, 1.f);
  x.from_host(hx);
  dy.from_host(hy);
  whole.forward(x, 0, true);
  const Tensor dx = whole.backward(dy, 0, /*need_dx=*/true);
  const std::vector<float> with_dx = whole.grads().to_host();
  whole.zero_grad();
  whole.forward(x, 0, true);
  CHECK(!whole.backward(dy, 0, /*need_dx=*/false).defined());
  CHECK(whole.grads().to_host() == with_dx);
  CHECK(dx.shape() == x.shape());
}

TEST_CASE("partition: init is per layer, so any split starts from the same weights", "[model][partition]") {
  const ModelSpec spec = mixed_model(0.2);
  Partition whole(cpu(), spec, 0, 11);
  whole.init(1234);
  Partition a(cpu(), spec, 0, 3), b(cpu(), spec, 3, 9), c(cpu(), spec, 9, 11);
  for (Partition* p : {&a, &b, &c}) p->init(1234);
  CHECK(whole.params().to_host() == concat({host(a.params()), host(b.params()), host(c.params())}));
  Partition other(cpu(), spec, 0, 11);
  other.init(1235);
  CHECK(other.params().to_host() != whole.params().to_host());
  // layernorm (global layer 1) starts at weight 1, bias 0
  const auto ln = whole.params().to_host();
  const int64_t off = whole.param_offset(1);
  for (int64_t i = 0; i < 6; ++i) {
    CHECK(ln[off + i] == 1.0f);
    CHECK(ln[off + 6 + i] == 0.0f);
  }
}

TEST_CASE("partition: a split model computes the same outputs and gradients as the whole", "[model][partition]") {
  const ModelSpec spec = mixed_model(0.2);
  const int64_t batch = 5;
  Rng rng(5);
  Tensor x = upload(cpu(), batched(batch, spec.input), random_normal(rng, batch * numel(spec.input)));
  const auto labels = labels_for(batch, 4);
  const uint64_t seed = derive_seed(99, 3, 0);

  Partition whole(cpu(), spec, 0, 11);
  whole.init(42);
  whole.zero_grad();
  const Tensor out = whole.forward(x, 0, true, seed);
  CHECK(whole.in_flight() == 1);
  const Tensor dx_whole = whole.backward(loss_grad(out, labels, batch), 0, true);
  CHECK(whole.in_flight() == 0);

  std::vector<std::unique_ptr<Partition>> parts;
  for (auto [b, e] : {std::pair{0, 2}, {2, 7}, {7, 11}}) {
    parts.push_back(std::make_unique<Partition>(cpu(), spec, b, e));
    parts.back()->init(42);
    parts.back()->zero_grad();
  }
  Tensor h = x;
  for (auto& p : parts) h = p->forward(h, 0, true, seed);
  require_close(h.to_host(), out.to_host());
  Tensor g = loss_grad(h, labels, batch);
  for (size_t i = parts.size(); i-- > 0;) g = parts[i]->backward(g, 0, true);
  require_close(g.to_host(), dx_whole.to_host());
  const auto split_grads =
      concat({host(parts[0]->grads()), host(parts[1]->grads()), host(parts[2]->grads())});
  require_close(split_grads, whole.grads().to_host());
  // the gradient is not trivially zero
  double norm = 0;
  for (float v : split_grads) norm += double(v) * v;
  CHECK(norm > 1e-6);
}

TEST_CASE("partition: interleaved micro-batches give the whole-batch gradient", "[model][partition]") {
  const ModelSpec spec = mixed_model(0.0);  // dropout off: masks depend on the micro-batch split
  const int64_t batch = 6, half = 3, per = numel(spec.input);
  Rng rng(6);
  Tensor x = upload(cpu(), batched(batch, spec.input), random_normal(rng, batch * per));
  const auto labels = labels_for(batch, 4);

  Partition whole(cpu(), spec, 0, 11);
  whole.init(7);
  whole.zero_grad();
  const Tensor out = whole.forward(x, 0, true);
  whole.backward(loss_grad(out, labels, batch), 0, false);
  const auto want = whole.grads().to_host();

  // Two stages, 1F1B-like order: F0 F1 (both stages), B1 then B0.
  Partition s1(cpu(), spec, 0, 5), s2(cpu(), spec, 5, 11);
  s1.init(7);
  s2.init(7);
  s1.zero_grad();
  s2.zero_grad();
  const Tensor x0 = Tensor::view(x, 0, batched(half, spec.input));
  const Tensor x1 = Tensor::view(x, half * per, batched(half, spec.input));
  const std::vector<float> l0(labels.begin(), labels.begin() + half), l1(labels.begin() + half, labels.end());
  const Tensor o0 = s2.forward(s1.forward(x0, 0, true), 0, true);
  const Tensor o1 = s2.forward(s1.forward(x1, 1, true), 1, true);
  CHECK(s1.in_flight() == 2);
  CHECK(s2.in_flight() == 2);
  CHECK(s1.stash_bytes() > 0);
  s1.backward(s2.backward(loss_grad(o1, l1, batch), 1, true), 1, false);
  CHECK(s1.in_flight() == 1);
  const Tensor none = s1.backward(s2.backward(loss_grad(o0, l0, batch), 0, true), 0, false);
  CHECK(!none.defined());
  CHECK(s1.in_flight() == 0);
  CHECK(s2.in_flight() == 0);
  CHECK(s1.stash_bytes() == 0);
  require_close(concat({host(s1.grads()), host(s2.grads())}), want);
  // outputs per micro-batch equal the whole-batch rows
  require_close(concat({o0.to_host(), o1.to_host()}), out.to_host());
}

TEST_CASE("partition: dropout follows the seed and evaluation keeps nothing", "[model][partition]") {
  const ModelSpec spec = mixed_model(0.5);
  Partition p(cpu(), spec, 0, 11);
  p.init(3);
  Rng rng(8);
  Tensor x = upload(cpu(), batched(4, spec.input), random_normal(rng, 4 * numel(spec.input)));
  const auto a = p.forward(x, 0, true, 11).to_host();
  const auto b = p.forward(x, 1, true, 11).to_host();
  const auto c = p.forward(x, 2, true, 12).to_host();
  CHECK(a == b);
  CHECK(a != c);
  const auto e1 = p.forward(x, 0, false, 11).to_host();
  const auto e2 = p.forward(x, 0, false, 12).to_host();
  CHECK(e1 == e2);
  CHECK(e1 != a);
  CHECK(p.in_flight() == 3);  // evaluation forwards added nothing
}

TEST_CASE("partition: recomputing keeps only the inputs and back-propagates the same gradients",
          "[model][partition][recompute]") {
  const ModelSpec spec = mixed_model(0.5);  // dropout on: the recomputed masks must be the forward's
  const int64_t batch = 3;
  const Shape in = spec.shapes[2];  // layers [2, 11): from the GELU's input, so that dx crosses several layers
  Rng rng(9);
  const Tensor x0 = upload(cpu(), batched(batch, in), random_normal(rng, batch * numel(in)));
  const Tensor x1 = upload(cpu(), batched(batch, in), random_normal(rng, batch * numel(in)));
  const auto labels = labels_for(batch, 4);
  struct Run {
    std::vector<float> out0, out1, dx0, dx1, grads;
    size_t stash_bytes = 0;
  };
  auto run = [&](bool recompute) {
    Partition p(cpu(), spec, 2, 11);
    p.init(4);
    p.zero_grad();
    p.set_recompute(recompute);
    CHECK(p.recompute() == recompute);
    Run r;
    const Tensor o0 = p.forward(x0, 0, true, 21);
    const Tensor o1 = p.forward(x1, 1, true, 22);
    r.out0 = o0.to_host();
    r.out1 = o1.to_host();
    r.stash_bytes = p.stash_bytes();
    CHECK_THROWS_WITH(p.set_recompute(!recompute), Contains("between batches") && Contains("2 micro-batches"));
    r.dx1 = p.backward(loss_grad(o1, labels, 2 * batch), 1, true).to_host();  // the later one first, as 1F1B may
    r.dx0 = p.backward(loss_grad(o0, labels, 2 * batch), 0, true).to_host();
    CHECK(p.in_flight() == 0);
    CHECK(p.stash_bytes() == 0);
    r.grads = p.grads().to_host();
    return r;
  };
  const Run kept = run(false), recomputed = run(true);
  require_close(recomputed.out0, kept.out0, 1e-6);
  require_close(recomputed.out1, kept.out1, 1e-6);
  require_close(recomputed.dx0, kept.dx0, 1e-6);
  require_close(recomputed.dx1, kept.dx1, 1e-6);
  require_close(recomputed.grads, kept.grads, 1e-6);
  // Two micro-batches in flight hold their inputs alone: 2 x batch x input floats.
  CHECK(recomputed.stash_bytes == static_cast<size_t>(2 * batch * numel(in)) * sizeof(float));
  CHECK(kept.stash_bytes > 3 * recomputed.stash_bytes);  // every layer's activations and contexts
}

TEST_CASE("partition: misuse is refused with clear errors", "[model][partition][errors]") {
  const ModelSpec spec = mixed_model(0.0);
  CHECK_THROWS_AS(Partition(cpu(), spec, 3, 3), std::invalid_argument);
  CHECK_THROWS_AS(Partition(cpu(), spec, -1, 2), std::invalid_argument);
  CHECK_THROWS_WITH(Partition(cpu(), spec, 0, 12), Contains("[0, 12)") && Contains("11 layers"));
  Partition p(cpu(), spec, 0, 4);
  p.init(1);
  Tensor dy(cpu(), batched(2, p.output_shape()));
  CHECK_THROWS_WITH(p.backward(dy, 0, false), Contains("micro-batch 0") && Contains("without a pending"));
  Tensor x(cpu(), batched(2, spec.input));
  cpu().fill(x, 0.5f);
  p.forward(x, 0, true);
  CHECK_THROWS_WITH(p.forward(x, 0, true), Contains("already has a pending forward"));
  Tensor wrong_dy(cpu(), batched(3, p.output_shape()));
  CHECK_THROWS_WITH(p.backward(wrong_dy, 0, false), Contains("batch 3"));
  Tensor wrong_x(cpu(), {2, 2, 6, 5});
  CHECK_THROWS_AS(p.forward(wrong_x, 1, true), std::invalid_argument);
  CHECK_THROWS_AS(p.layer(7), std::out_of_range);
}

namespace {

// A small GPT, its projection tied to its embedding or not: tokens (5) -> logits (5, 11).
ModelSpec small_gpt(bool tied) {
  json projection = {{"type", "linear"}, {"out_features", 11}};
  if (tied) projection["tied_to"] = 0;
  const json doc = {{"name", "gpt"},
                    {"input", {5}},
                    {"loss", "cross_entropy"},
                    {"layers",
                     {{{"type", "embedding"}, {"num_embeddings", 11}, {"embedding_dim", 8}},
                      {{"type", "position_embedding"}},
                      {{"type", "transformer_block"}, {"heads", 2}},
                      {{"type", "layernorm"}},
                      projection}}};
  return ModelSpec::parse(doc, "gpt");
}

}  // namespace

TEST_CASE("partition: backward_input then backward_weight (zb1) equals backward bit for bit", "[model][partition][zb1]") {
  const int64_t batch = 3;
  Rng rng(12);
  // The whole tied model (a first stage: no dx), and a later stage of the untied one.
  for (auto [begin, need_dx] : {std::pair{0, false}, std::pair{2, true}}) {
    INFO("layers [" << begin << ", 5), need_dx " << need_dx);
    const ModelSpec spec = small_gpt(/*tied=*/begin == 0);
    Partition whole(cpu(), spec, begin, 5), split(cpu(), spec, begin, 5);
    whole.init(9);
    split.init(9);
    whole.zero_grad();
    split.zero_grad();
    std::vector<Tensor> x, dy;
    for (int mb = 0; mb < 2; ++mb) {
      std::vector<float> in;
      if (begin == 0) {
        for (int64_t i = 0; i < batch * 5; ++i) in.push_back(static_cast<float>(rng.below(11)));
      } else {
        in = random_normal(rng, batch * numel(whole.input_shape()));
      }
      x.push_back(upload(cpu(), batched(batch, whole.input_shape()), in));
      dy.push_back(upload(cpu(), batched(batch, whole.output_shape()),
                          random_normal(rng, batch * numel(whole.output_shape()), 0.1f)));
      REQUIRE(whole.forward(x[mb], mb, true).to_host() == split.forward(x[mb], mb, true).to_host());
    }
    // ZB-H1's order on a stage: B0 B1 W0 W1 against backward 0, backward 1.
    std::vector<std::vector<float>> dx_whole, dx_split;
    for (int mb = 0; mb < 2; ++mb) dx_whole.push_back(host(whole.backward(dy[mb], mb, need_dx)));
    for (int mb = 0; mb < 2; ++mb) {
      const size_t before = split.stash_bytes();
      dx_split.push_back(host(split.backward_input(dy[mb], mb, need_dx)));
      CHECK(split.stash_bytes() < before);  // B frees what W does not need
      CHECK(split.in_flight() == 2);        // ... but the micro-batch is held until its W
    }
    CHECK(dx_split == dx_whole);
    CHECK(split.grads().to_host() != whole.grads().to_host());  // W's share is still missing
    split.backward_weight(0);
    CHECK(split.in_flight() == 1);
    split.backward_weight(1);
    CHECK(split.in_flight() == 0);
    CHECK(split.stash_bytes() == 0);
    CHECK(split.grads().to_host() == whole.grads().to_host());
  }
}

TEST_CASE("partition: the split backward refuses the wrong order", "[model][partition][zb1][errors]") {
  const ModelSpec spec = mixed_model(0.0);
  Partition p(cpu(), spec, 0, 11);
  p.init(1);
  Tensor x(cpu(), batched(2, spec.input));
  cpu().fill(x, 0.5f);
  Tensor dy(cpu(), batched(2, p.output_shape()));
  cpu().fill(dy, 0.1f);
  CHECK_THROWS_WITH(p.backward_input(dy, 0, false), Contains("backward_input for micro-batch 0") &&
                                                        Contains("without a pending training forward"));
  CHECK_THROWS_WITH(p.backward_weight(0), Contains("without a pending backward_input"));
  p.forward(x, 0, true);
  p.backward_input(dy, 0, false);
  CHECK_THROWS_WITH(p.backward(dy, 0, false), Contains("without a pending training forward"));
  p.forward(x, 0, true);
  CHECK_THROWS_WITH(p.backward_input(dy, 0, false), Contains("forwarded again before its backward_weight"));
  p.backward_weight(0);
  CHECK_THROWS_WITH(p.backward_weight(0), Contains("without a pending backward_input"));
}
