// test_transformer.cpp: the GPT layers (embedding, position_embedding,
// causal_self_attention, gelu "tanh", per-position linear, transformer_block)
// and the sequence cross-entropy: finite-difference gradients, the causal mask,
// a block against its hand-composed parts, and a tiny GPT that learns.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"
#include "nn/nn_test_util.h"

using namespace cleave;
using namespace cleave::test;
using nlohmann::json;

namespace {

void check_layer(const json& spec, const Shape& in, int64_t batch, uint64_t seed, std::vector<float> x = {},
                 GradCheckOptions opt = {}) {
  Rng rng(seed);
  auto layer = make_layer(spec, in);
  if (x.empty()) x = random_normal(rng, batch * numel(in));
  const std::vector<float> p = random_normal(rng, layer->param_count(), 0.5f);
  const GradCheckReport rep = check_gradients(*layer, in, batch, x, p, rng, opt);
  INFO(spec.dump() << " on " << shape_str(batched(batch, in)) << ": " << rep.checked << " checked, " << rep.failures
                   << " failed, max abs err " << rep.max_abs_err << "; " << rep.first_failure);
  CHECK(rep.checked == (opt.check_input ? batch * numel(in) : 0) + layer->param_count());
  CHECK(rep.ok());
}

std::vector<float> token_ids(Rng& rng, int64_t n, int64_t vocab) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& t : v) t = static_cast<float>(rng.below(static_cast<uint64_t>(vocab)));
  return v;
}

}  // namespace

TEST_CASE("gradcheck: embedding and position_embedding", "[nn][gradcheck][gpt]") {
  Rng rng(71);
  GradCheckOptions no_input;
  no_input.check_input = false;  // token ids are not differentiable
  check_layer({{"type", "embedding"}, {"num_embeddings", 7}, {"embedding_dim", 3}}, {5}, 2, 7100,
              token_ids(rng, 10, 7), no_input);
  check_layer({{"type", "position_embedding"}}, {4, 3}, 3, 7101);
}

TEST_CASE("embedding rejects ids that are not tokens", "[nn][gpt]") {
  auto layer = make_layer({{"type", "embedding"}, {"num_embeddings", 4}, {"embedding_dim", 2}}, {2});
  Tensor p(cpu(), {8}), g(cpu(), {8});
  layer->bind(p, g);
  LayerContext ctx;
  Tensor y(cpu(), {1, 2, 2});
  CHECK_THROWS_WITH(layer->forward(upload(cpu(), {1, 2}, {1.0f, 4.0f}), y, ctx, true),
                    Catch::Contains("not a class index in [0, 4)"));
  CHECK_THROWS(layer->forward(upload(cpu(), {1, 2}, {1.5f, 0.0f}), y, ctx, true));
}

TEST_CASE("gradcheck: causal_self_attention", "[nn][gradcheck][gpt]") {
  check_layer({{"type", "causal_self_attention"}, {"heads", 2}}, {5, 4}, 2, 7200);
  check_layer({{"type", "causal_self_attention"}, {"heads", 1}}, {3, 3}, 1, 7201);
  check_layer({{"type", "causal_self_attention"}, {"heads", 3}}, {4, 6}, 2, 7202);
}

TEST_CASE("causal_self_attention: a position never sees a later one", "[nn][gpt]") {
  Rng rng(73);
  const Shape in{6, 4};
  auto layer = make_layer({{"type", "causal_self_attention"}, {"heads", 2}}, in);
  Tensor p = upload(cpu(), {layer->param_count()}, random_normal(rng, layer->param_count(), 0.5f));
  Tensor g(cpu(), {layer->param_count()});
  layer->bind(p, g);
  std::vector<float> x = random_normal(rng, 24);
  auto run = [&](const std::vector<float>& xv) {
    Tensor y(cpu(), {1, 6, 4});
    LayerContext ctx;
    layer->forward(upload(cpu(), {1, 6, 4}, xv), y, ctx, false);
    return y.to_host();
  };
  const std::vector<float> before = run(x);
  for (int j = 16; j < 24; ++j) x[static_cast<size_t>(j)] += 1.0f;  // change positions 4 and 5
  const std::vector<float> after = run(x);
  for (int j = 0; j < 16; ++j) CHECK(after[static_cast<size_t>(j)] == before[static_cast<size_t>(j)]);
  bool changed = false;
  for (int j = 16; j < 24; ++j) changed = changed || after[static_cast<size_t>(j)] != before[static_cast<size_t>(j)];
  CHECK(changed);
}

TEST_CASE("gradcheck: gelu tanh, per-position linear, transformer_block", "[nn][gradcheck][gpt]") {
  Rng rng(74);
  check_layer({{"type", "gelu"}, {"approximate", "tanh"}}, {3, 4}, 2, 7400, random_away_from_zero(rng, 24));
  check_layer({{"type", "linear"}, {"out_features", 3}}, {4, 5}, 2, 7401);
  check_layer({{"type", "transformer_block"}, {"heads", 2}}, {3, 4}, 2, 7402);
  check_layer({{"type", "transformer_block"}, {"heads", 1}}, {2, 2}, 1, 7403);
}

TEST_CASE("gelu approximate tanh: GPT-2's formula, exact gelu unchanged", "[nn][gpt]") {
  auto tanh_gelu = make_layer({{"type", "gelu"}, {"approximate", "tanh"}}, {3});
  auto exact = make_layer({{"type", "gelu"}}, {3});
  CHECK(exact->to_json() == json{{"type", "gelu"}});
  CHECK(tanh_gelu->to_json() == json{{"type", "gelu"}, {"approximate", "tanh"}});
  CHECK_THROWS_WITH(make_layer({{"type", "gelu"}, {"approximate", "erf"}}, {3}),
                    Catch::Contains("field 'approximate'"));
  const std::vector<float> xs{-1.5f, 0.3f, 2.0f};
  Tensor x = upload(cpu(), {1, 3}, xs), y(cpu(), {1, 3});
  LayerContext ctx;
  tanh_gelu->forward(x, y, ctx, false);
  const std::vector<float> got = y.to_host();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    CHECK(got[i] == Approx(want).epsilon(1e-6));
  }
}

TEST_CASE("transformer_block equals its hand-composed parts", "[nn][gpt]") {
  Rng rng(75);
  const int64_t n = 2, t = 5, c = 4;
  const Shape in{t, c};
  auto block = make_layer({{"type", "transformer_block"}, {"heads", 2}}, in);
  std::vector<std::unique_ptr<Layer>> parts;
  parts.push_back(make_layer({{"type", "layernorm"}}, in));
  parts.push_back(make_layer({{"type", "causal_self_attention"}, {"heads", 2}}, in));
  parts.push_back(make_layer({{"type", "layernorm"}}, in));
  parts.push_back(make_layer({{"type", "linear"}, {"out_features", 4 * c}}, in));
  parts.push_back(make_layer({{"type", "gelu"}, {"approximate", "tanh"}}, {t, 4 * c}));
  parts.push_back(make_layer({{"type", "linear"}, {"out_features", c}}, {t, 4 * c}));
  const int64_t np = block->param_count();
  int64_t sum = 0;
  for (auto& l : parts) sum += l->param_count();
  REQUIRE(sum == np);
  const std::vector<float> pv = random_normal(rng, np, 0.5f);
  Device& d = cpu();
  Tensor pb = upload(d, {np}, pv), gb(d, {np}), pp = upload(d, {np}, pv), gp(d, {np});
  d.fill(gb, 0.0f);
  d.fill(gp, 0.0f);
  block->bind(pb, gb);
  for (int64_t off = 0; auto& l : parts) {
    l->bind(Tensor::view(pp, off, {l->param_count()}), Tensor::view(gp, off, {l->param_count()}));
    off += l->param_count();
  }
  const Tensor x = upload(d, {n, t, c}, random_normal(rng, n * t * c));
  const Tensor dy = upload(d, {n, t, c}, random_normal(rng, n * t * c));
  // the block
  Tensor y(d, {n, t, c}), dx(d, {n, t, c});
  LayerContext ctx;
  block->forward(x, y, ctx, true);
  block->backward(x, y, dy, &dx, ctx);
  // by hand: r = x + attn(ln1(x)); y = r + proj(gelu(fc(ln2(r))))
  auto T = [&](Shape s) { return Tensor(d, {n, s[0], s[1]}); };
  Tensor h1 = T(in), a = T(in), r = T(in), h2 = T(in), f = T({t, 4 * c}), g = T({t, 4 * c}), m = T(in), y2 = T(in);
  LayerContext cx[6];
  parts[0]->forward(x, h1, cx[0], true);
  parts[1]->forward(h1, a, cx[1], true);
  d.copy(x, r);
  d.axpy(1.0f, a, r);
  parts[2]->forward(r, h2, cx[2], true);
  parts[3]->forward(h2, f, cx[3], true);
  parts[4]->forward(f, g, cx[4], true);
  parts[5]->forward(g, m, cx[5], true);
  d.copy(r, y2);
  d.axpy(1.0f, m, y2);
  Tensor dg = T({t, 4 * c}), df = T({t, 4 * c}), dh2 = T(in), dr = T(in), dh1 = T(in), dx2 = T(in);
  parts[5]->backward(g, m, dy, &dg, cx[5]);
  parts[4]->backward(f, g, dg, &df, cx[4]);
  parts[3]->backward(h2, f, df, &dh2, cx[3]);
  parts[2]->backward(r, h2, dh2, &dr, cx[2]);
  d.axpy(1.0f, dy, dr);
  parts[1]->backward(h1, a, dr, &dh1, cx[1]);
  parts[0]->backward(x, h1, dh1, &dx2, cx[0]);
  d.axpy(1.0f, dr, dx2);
  auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
    REQUIRE(u.size() == v.size());
    for (size_t i = 0; i < u.size(); ++i) CHECK(u[i] == Approx(v[i]).margin(1e-6).epsilon(1e-5));
  };
  same(y.to_host(), y2.to_host());
  same(dx.to_host(), dx2.to_host());
  same(gb.to_host(), gp.to_host());
  // The block's parameter names are its parts' names under nanoGPT's prefixes.
  const auto info = block->param_info();
  REQUIRE(info.size() == 12);
  CHECK(info[0].name == "ln_1.weight");
  CHECK(info[2].name == "attn.c_attn.weight");
  CHECK(info[2].shape == Shape{3 * c, c});
  CHECK(info[11].name == "mlp.c_proj.bias");
  CHECK(info[11].offset + c == np);
}

TEST_CASE("sequence cross-entropy: mean over positions, gradient by finite differences", "[nn][loss][gpt]") {
  Rng rng(76);
  const int64_t n = 2, t = 3, v = 5;
  std::vector<float> z = random_normal(rng, n * t * v);
  const std::vector<float> labels = token_ids(rng, n * t, v);
  Device& d = cpu();
  const Tensor targets = upload(d, {n, t}, labels);
  Tensor dz(d, {n, t, v});
  const LossResult r = compute_loss(d, LossKind::cross_entropy, upload(d, {n, t, v}, z), targets, dz, 0.5f);
  // reference: per sample, the mean over positions of -log softmax
  double want = 0;
  for (int64_t row = 0; row < n * t; ++row) {
    double mx = -1e30, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, double(z[row * v + j]));
    for (int64_t j = 0; j < v; ++j) s += std::exp(double(z[row * v + j]) - mx);
    want += (mx + std::log(s) - z[row * v + static_cast<int64_t>(labels[row])]) / t;
  }
  CHECK(r.loss_sum == Approx(want).epsilon(1e-5));
  const std::vector<float> ana = dz.to_host();
  const float eps = 1e-2f;
  for (size_t i = 0; i < z.size(); ++i) {
    const float orig = z[i];
    z[i] = orig + eps;
    const double lp = evaluate_loss(d, LossKind::cross_entropy, upload(d, {n, t, v}, z), targets).loss_sum;
    z[i] = orig - eps;
    const double lm = evaluate_loss(d, LossKind::cross_entropy, upload(d, {n, t, v}, z), targets).loss_sum;
    z[i] = orig;
    CHECK(ana[i] == Approx(0.5 * (lp - lm) / (2 * eps)).margin(3e-4).epsilon(3e-3));
  }
  CHECK_THROWS_WITH(compute_loss(d, LossKind::cross_entropy, upload(d, {n, t, v}, z), upload(d, {n * t}, labels), dz,
                                 1.0f),
                    Catch::Contains("targets must be (2, 3)"));
  CHECK(target_shape(LossKind::cross_entropy, {t, v}) == Shape{t});
  CHECK(target_shape(LossKind::cross_entropy, {v}) == Shape{});
}

namespace {

// A small GPT: 2 blocks, context 16, width 32, bytes.
const char* kSmallGpt = R"({"name": "gpt-test", "input": [16], "loss": "cross_entropy", "layers": [
  {"type": "embedding", "num_embeddings": 256, "embedding_dim": 32}, {"type": "position_embedding"},
  {"type": "transformer_block", "heads": 2}, {"type": "transformer_block", "heads": 2},
  {"type": "layernorm"}, {"type": "linear", "out_features": 256}]})";

// Windows of a repeating text: x = bytes [s, s + T), y = bytes [s + 1, s + T + 1).
void text_batch(Rng& rng, int64_t batch, int64_t t, std::vector<float>& x, std::vector<float>& y) {
  const std::string text = "the quick brown fox jumps over the lazy dog. ";
  x.resize(static_cast<size_t>(batch * t));
  y.resize(x.size());
  for (int64_t b = 0; b < batch; ++b) {
    const size_t s = rng.below(text.size());
    for (int64_t i = 0; i < t; ++i) {
      x[static_cast<size_t>(b * t + i)] = static_cast<unsigned char>(text[(s + i) % text.size()]);
      y[static_cast<size_t>(b * t + i)] = static_cast<unsigned char>(text[(s + i + 1) % text.size()]);
    }
  }
}

// Trains `steps` Adam steps of the model cut at `cut` (0: one partition) and returns the losses.
std::vector<double> train_gpt(int cut, int steps) {
  const ModelSpec spec = ModelSpec::parse(json::parse(kSmallGpt), "gpt-test");
  Device& d = cpu();
  std::vector<std::unique_ptr<Partition>> parts;
  if (cut == 0) {
    parts.push_back(std::make_unique<Partition>(d, spec, 0, spec.num_layers()));
  } else {
    parts.push_back(std::make_unique<Partition>(d, spec, 0, cut));
    parts.push_back(std::make_unique<Partition>(d, spec, cut, spec.num_layers()));
  }
  std::vector<Optimizer> opts;
  OptimizerConfig oc;
  oc.lr = 3e-3f;
  for (auto& p : parts) {
    p->init(42);
    opts.emplace_back(d, oc, p->param_count());
  }
  Rng rng(5);
  std::vector<double> losses;
  const int64_t batch = 8, t = 16;
  for (int s = 0; s < steps; ++s) {
    std::vector<float> xs, ys;
    text_batch(rng, batch, t, xs, ys);
    Tensor h = upload(d, {batch, t}, xs);
    for (auto& p : parts) h = p->forward(h, 0, true);
    Tensor dh(d, h.shape());
    losses.push_back(
        compute_loss(d, LossKind::cross_entropy, h, upload(d, {batch, t}, ys), dh, 1.0f / batch).loss_sum / batch);
    for (size_t i = parts.size(); i-- > 0;) dh = parts[i]->backward(dh, 0, i > 0);
    for (size_t i = 0; i < parts.size(); ++i) {
      opts[i].step(parts[i]->params(), parts[i]->grads());
      parts[i]->zero_grad();
    }
  }
  return losses;
}

}  // namespace

TEST_CASE("a small GPT learns a repeating text", "[nn][gpt][train]") {
  const ModelSpec spec = ModelSpec::parse(json::parse(kSmallGpt), "gpt-test");
  CHECK(spec.output() == Shape{16, 256});
  const std::vector<double> losses = train_gpt(0, 60);
  INFO("first loss " << losses.front() << ", last " << losses.back());
  CHECK(losses.front() == Approx(std::log(256.0)).margin(0.3));
  CHECK(losses.back() < 1.0);
}

TEST_CASE("a GPT cut between blocks trains like the whole model", "[nn][gpt][train]") {
  const std::vector<double> whole = train_gpt(0, 5);
  for (int cut : {2, 3}) {
    const std::vector<double> split = train_gpt(cut, 5);
    INFO("cut at layer " << cut);
    for (size_t s = 0; s < whole.size(); ++s) CHECK(split[s] == Approx(whole[s]).epsilon(1e-6));
  }
}

TEST_CASE("the shipped GPT models", "[nn][gpt][model]") {
  for (const auto& [file, params] : {std::pair<const char*, int64_t>{"gpt-tiny.json", 867328},
                                     std::pair<const char*, int64_t>{"gpt-small.json", 6482688}}) {
    const ModelSpec spec = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/" + file);
    INFO(file);
    int64_t n = 0;
    for (int i = 0; i < spec.num_layers(); ++i) n += make_layer(spec.layers[i], spec.shapes[i])->param_count();
    CHECK(n == params);
    CHECK(spec.output() == Shape{spec.input[0], 256});
  }
}
