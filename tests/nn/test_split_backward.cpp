// test_split_backward.cpp: every layer's backward split for the zb1 schedule
// (Layer::backward_input, B, and Layer::backward_weight, W) against its whole
// backward. Two micro-batches go through each layer the way ZB-H1 runs them
// (F0 F1 B0 B1 W0 W1): B alone must give backward's dx bit for bit and, in a
// layer that splits, touch no parameter gradient (but a transformer block's
// norms', which do not split); W must then bring the
// gradients to backward's bit for bit, using nothing but what B left in the
// context, which is never larger than what forward saved.
#include <catch2/catch.hpp>

#include "nn/nn_test_util.h"

using namespace cleave;
using namespace cleave::test;
using nlohmann::json;

namespace {

size_t context_bytes(const LayerContext& c) {
  size_t bytes = 0;
  for (const Tensor& t : c.saved) bytes += t.bytes();
  return bytes;
}

// One layer instance with its own parameter and gradient blocks, parameters
// `p`, gradients starting at `g0` (nonzero: W must accumulate, not overwrite).
struct Bound {
  std::unique_ptr<Layer> layer;
  Tensor params, grads;
  Bound(const json& spec, const Shape& in, const std::vector<float>& p, const std::vector<float>& g0)
      : layer(make_layer(spec, in)) {
    const int64_t n = layer->param_count();
    if (n == 0) return;
    params = upload(cpu(), {n}, p);
    grads = upload(cpu(), {n}, g0);
    layer->bind(params, grads);
  }
  std::vector<float> grad_values() const { return grads.defined() ? grads.to_host() : std::vector<float>{}; }
};

void check_split(const json& spec, const Shape& in, int64_t batch, bool splits, std::vector<std::vector<float>> xs = {}) {
  INFO(spec.dump() << " on " << shape_str(batched(batch, in)));
  Rng rng(spec.dump().size());
  const Shape xshape = batched(batch, in);
  const int64_t np = make_layer(spec, in)->param_count();
  const std::vector<float> p = random_normal(rng, np, 0.5f), g0 = random_normal(rng, np, 0.1f);
  Bound whole(spec, in, p, g0), split(spec, in, p, g0);
  CHECK(split.layer->splits_backward() == splits);
  const Shape yshape = batched(batch, whole.layer->output_shape(in));
  while (xs.size() < 2) xs.push_back(random_normal(rng, numel(xshape)));
  std::vector<Tensor> x, y_whole, y_split, dy;
  std::vector<LayerContext> c_whole(2), c_split(2);
  for (size_t mb = 0; mb < 2; ++mb) {
    x.push_back(upload(cpu(), xshape, xs[mb]));
    dy.push_back(upload(cpu(), yshape, random_normal(rng, numel(yshape))));
    for (auto* c : {&c_whole[mb], &c_split[mb]}) c->seed = 40 + mb;
    y_whole.emplace_back(cpu(), yshape);
    y_split.emplace_back(cpu(), yshape);
    whole.layer->forward(x[mb], y_whole[mb], c_whole[mb], true);
    split.layer->forward(x[mb], y_split[mb], c_split[mb], true);
  }
  std::vector<std::vector<float>> dx_whole;
  for (size_t mb = 0; mb < 2; ++mb) {
    Tensor dx(cpu(), xshape);
    whole.layer->backward(x[mb], y_whole[mb], dy[mb], &dx, c_whole[mb]);
    dx_whole.push_back(dx.to_host());
  }
  for (size_t mb = 0; mb < 2; ++mb) {
    const size_t forward_bytes = context_bytes(c_split[mb]);
    Tensor dx(cpu(), xshape);
    split.layer->backward_input(x[mb], y_split[mb], dy[mb], &dx, c_split[mb]);
    CHECK(dx.to_host() == dx_whole[mb]);
    CHECK(context_bytes(c_split[mb]) <= forward_bytes);
    // B leaves every parameter gradient to W, but a block's norms' (one device op gives
    // their dx and gradients at once).
    const std::vector<float> after_b = split.grad_values();
    for (const Layer::ParamInfo& info : splits ? split.layer->param_info() : std::vector<Layer::ParamInfo>{}) {
      if (info.name.rfind("ln_", 0) == 0) continue;
      INFO("parameter " << info.name);
      const auto from = static_cast<size_t>(info.offset), to = from + static_cast<size_t>(numel(info.shape));
      CHECK(std::vector<float>(after_b.begin() + from, after_b.begin() + to) ==
            std::vector<float>(g0.begin() + from, g0.begin() + to));
    }
  }
  for (size_t mb = 0; mb < 2 && splits; ++mb) split.layer->backward_weight(x[mb], dy[mb], c_split[mb]);
  CHECK(split.grad_values() == whole.grad_values());
  if (np > 0) CHECK(whole.grad_values() != g0);  // the gradients did move
}

}  // namespace

TEST_CASE("split backward: B then W equals backward bit for bit, layer by layer", "[nn][zb1]") {
  check_split({{"type", "linear"}, {"out_features", 5}}, {7}, 3, true);
  check_split({{"type", "linear"}, {"out_features", 4}, {"bias", false}}, {6}, 2, true);
  check_split({{"type", "linear"}, {"out_features", 5}}, {3, 4}, 2, true);  // per position
  Rng rng(5);
  std::vector<std::vector<float>> ids(2);
  for (auto& v : ids)
    for (int i = 0; i < 2 * 5; ++i) v.push_back(static_cast<float>(rng.below(7)));
  check_split({{"type", "embedding"}, {"num_embeddings", 7}, {"embedding_dim", 3}}, {5}, 2, true, ids);
  check_split({{"type", "position_embedding"}}, {4, 3}, 2, true);
  check_split({{"type", "causal_self_attention"}, {"heads", 2}}, {5, 4}, 2, true);
  check_split({{"type", "transformer_block"}, {"heads", 2}}, {5, 4}, 2, true);
  // Layers that keep the default: B is the whole backward (layernorm's device op
  // gives dx and its gradients at once; conv2d's too), and W is never called.
  check_split({{"type", "layernorm"}}, {3, 4}, 2, false);
  check_split({{"type", "conv2d"}, {"out_channels", 3}, {"kernel", 3}, {"padding", 1}}, {2, 5, 5}, 2, false);
  check_split({{"type", "relu"}}, {6}, 2, false);
  check_split({{"type", "dropout"}, {"p", 0.5}}, {6}, 2, false);
}

TEST_CASE("split backward: W without B's context is refused", "[nn][zb1][errors]") {
  auto layer = make_layer({{"type", "causal_self_attention"}, {"heads", 2}}, {3, 4});
  Tensor p(cpu(), {layer->param_count()}), g(cpu(), {layer->param_count()});
  layer->bind(p, g);
  LayerContext none;
  Tensor x(cpu(), {1, 3, 4}), dy(cpu(), {1, 3, 4});
  CHECK_THROWS_WITH(layer->backward_weight(x, dy, none), Catch::Contains("without its input gradient's context"));
}
