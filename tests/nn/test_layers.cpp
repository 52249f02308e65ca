// test_layers.cpp: layer forward passes against naive host references, dropout
// masks, parameter layouts and counts, make_layer's validation messages, and the
// workspace each layer declares for memory plans against what its ops allocate.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/nn/layer.h"
#include "device/cpu/cpu_device.h"
#include "nn/nn_test_util.h"

using namespace cleave;
using namespace cleave::test;
using nlohmann::json;
using Catch::Matchers::Contains;

namespace {

struct Bound {
  std::unique_ptr<Layer> layer;
  Tensor params, grads;
};

Bound build(const json& spec, const Shape& in, const std::vector<float>& p) {
  Bound b{make_layer(spec, in), {}, {}};
  const int64_t n = b.layer->param_count();
  REQUIRE(static_cast<int64_t>(p.size()) == n);
  if (n > 0) {
    b.params = upload(cpu(), {n}, p);
    b.grads = Tensor(cpu(), {n});
    cpu().fill(b.grads, 0.0f);
    b.layer->bind(b.params, b.grads);
  }
  return b;
}

std::vector<float> run(Layer& layer, const Shape& in, int64_t batch, const std::vector<float>& x,
                       bool training = true, uint64_t seed = 0, LayerContext* keep = nullptr) {
  Tensor xt = upload(cpu(), batched(batch, in), x);
  Tensor y(cpu(), batched(batch, layer.output_shape(in)));
  LayerContext ctx;
  ctx.seed = seed;
  layer.forward(xt, y, ctx, training);
  if (keep) *keep = ctx;
  return y.to_host();
}

void require_close(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

std::string error_of(const json& spec, const Shape& in) {
  try {
    make_layer(spec, in);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("linear forward matches x W^T + b with PyTorch's (out, in) layout", "[nn]") {
  Rng rng(1);
  const int64_t n = 3, in = 5, out = 4;
  const auto x = random_normal(rng, n * in);
  const auto p = random_normal(rng, out * in + out);
  Bound b = build({{"type", "linear"}, {"out_features", out}}, {in}, p);
  std::vector<double> want(n * out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = p[out * in + o];
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * p[o * in + k];
      want[i * out + o] = s;
    }
  require_close(run(*b.layer, {in}, n, x), want);
  const auto info = b.layer->param_info();
  REQUIRE(info.size() == 2);
  CHECK(info[0].name == "weight");
  CHECK(info[0].shape == Shape{out, in});
  CHECK(info[0].offset == 0);
  CHECK(info[1].name == "bias");
  CHECK(info[1].shape == Shape{out});
  CHECK(info[1].offset == out * in);
  CHECK(b.layer->flops_per_sample({in}) == 2 * in * out + out);
}

TEST_CASE("conv2d forward matches a direct convolution (stride, padding, rectangular kernel)", "[nn]") {
  Rng rng(2);
  const int64_t n = 2, c = 2, h = 5, w = 6, oc = 3, kh = 3, kw = 2, sh = 2, sw = 1, ph = 1, pw = 0;
  const auto x = random_normal(rng, n * c * h * w);
  const int64_t ckk = c * kh * kw;
  const auto p = random_normal(rng, oc * ckk + oc);
  Bound b = build({{"type", "conv2d"}, {"out_channels", oc}, {"kernel", {kh, kw}}, {"stride", {sh, sw}},
                   {"padding", {ph, pw}}},
                  {c, h, w}, p);
  const int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  REQUIRE(b.layer->output_shape({c, h, w}) == Shape{oc, oh, ow});
  std::vector<double> want(n * oc * oh * ow);
  for (int64_t ni = 0; ni < n; ++ni)
    for (int64_t o = 0; o < oc; ++o)
      for (int64_t yy = 0; yy < oh; ++yy)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double s = p[oc * ckk + o];
          for (int64_t ci = 0; ci < c; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = yy * sh - ph + i, ix = xx * sw - pw + j;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                s += double(x[((ni * c + ci) * h + iy) * w + ix]) * p[((o * c + ci) * kh + i) * kw + j];
              }
          want[((ni * oc + o) * oh + yy) * ow + xx] = s;
        }
  require_close(run(*b.layer, {c, h, w}, n, x), want);
  const auto info = b.layer->param_info();
  REQUIRE(info.size() == 2);
  CHECK(info[0].shape == Shape{oc, c, kh, kw});
  CHECK(info[1].offset == oc * ckk);
  CHECK(b.layer->flops_per_sample({c, h, w}) == 2 * oc * ckk * oh * ow + oc * oh * ow);
  CHECK(b.layer->saved_floats_per_sample({c, h, w}) == 0);
}

TEST_CASE("pooling forward matches direct max / average (padding, stride)", "[nn]") {
  Rng rng(3);
  const int64_t n = 2, c = 2, h = 5, w = 4, k = 3, s = 2, pad = 1;
  const auto x = random_normal(rng, n * c * h * w);
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  for (bool is_max : {true, false}) {
    Bound b = build({{"type", is_max ? "maxpool2d" : "avgpool2d"}, {"kernel", k}, {"stride", s}, {"padding", pad}},
                    {c, h, w}, {});
    REQUIRE(b.layer->output_shape({c, h, w}) == Shape{c, oh, ow});
    std::vector<double> want(n * c * oh * ow);
    for (int64_t pl = 0; pl < n * c; ++pl)
      for (int64_t yy = 0; yy < oh; ++yy)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double acc = is_max ? -1e30 : 0;
          for (int64_t i = 0; i < k; ++i)
            for (int64_t j = 0; j < k; ++j) {
              const int64_t iy = yy * s - pad + i, ix = xx * s - pad + j;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              const double v = x[(pl * h + iy) * w + ix];
              acc = is_max ? std::max(acc, v) : acc + v;
            }
          want[(pl * oh + yy) * ow + xx] = is_max ? acc : acc / (k * k);
        }
    require_close(run(*b.layer, {c, h, w}, n, x), want);
    CHECK(b.layer->saved_floats_per_sample({c, h, w}) == (is_max ? c * oh * ow : 0));
  }
  // stride defaults to the kernel
  CHECK(make_layer({{"type", "maxpool2d"}, {"kernel", 2}}, {1, 28, 28})->output_shape({1, 28, 28}) ==
        Shape{1, 14, 14});
}

TEST_CASE("activations, flatten and layernorm forward match host formulas", "[nn]") {
  Rng rng(4);
  const Shape in{2, 3, 4};
  const int64_t n = 2, m = n * numel(in);
  const auto x = random_normal(rng, m);
  for (const char* type : {"relu", "gelu", "tanh", "flatten"}) {
    Bound b = build({{"type", type}}, in, {});
    std::vector<double> want(m);
    for (int64_t i = 0; i < m; ++i) {
      const double v = x[i];
      const std::string t = type;
      want[i] = t == "relu" ? std::max(v, 0.0)
                : t == "gelu" ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
                : t == "tanh" ? std::tanh(v)
                              : v;
    }
    INFO(type);
    require_close(run(*b.layer, in, n, x), want);
  }
  CHECK(make_layer({{"type", "flatten"}}, in)->output_shape(in) == Shape{24});

  const int64_t cols = in.back(), rows = m / cols;
  const auto p = random_normal(rng, 2 * cols);
  Bound ln = build({{"type", "layernorm"}, {"eps", 1e-3}}, in, p);
  std::vector<double> want(m);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mean += x[r * cols + j];
    mean /= cols;
    for (int64_t j = 0; j < cols; ++j) var += (x[r * cols + j] - mean) * (x[r * cols + j] - mean);
    var /= cols;
    for (int64_t j = 0; j < cols; ++j)
      want[r * cols + j] = (x[r * cols + j] - mean) / std::sqrt(var + 1e-3) * p[j] + p[cols + j];
  }
  require_close(run(*ln.layer, in, n, x), want, 1e-4);
  const auto info = ln.layer->param_info();
  REQUIRE(info.size() == 2);
  CHECK(info[0].name == "weight");
  CHECK(info[0].shape == Shape{cols});
  CHECK(info[1].name == "bias");
  CHECK(info[1].offset == cols);
  CHECK(ln.layer->saved_floats_per_sample(in) == 2 * numel(in) / cols);
}

TEST_CASE("dropout: seeded inverted mask, gradient = mask, identity outside training", "[nn]") {
  const Shape in{4000};
  const double p = 0.25;
  Bound b = build({{"type", "dropout"}, {"p", p}}, in, {});
  std::vector<float> ones(4000, 1.0f);
  LayerContext ctx;
  const auto y1 = run(*b.layer, in, 1, ones, true, 42, &ctx);
  const auto y2 = run(*b.layer, in, 1, ones, true, 42);
  const auto y3 = run(*b.layer, in, 1, ones, true, 43);
  CHECK(y1 == y2);
  CHECK(y1 != y3);
  int64_t dropped = 0;
  for (float v : y1) {
    REQUIRE((v == 0.0f || std::fabs(v - 1.0f / (1.0f - float(p))) < 1e-6f));
    dropped += v == 0.0f;
  }
  CHECK(std::fabs(double(dropped) / 4000 - p) < 0.03);
  // the mask matches Rng(seed): element i dropped iff uniform() < p
  Rng rng(42);
  for (size_t i = 0; i < 100; ++i) CHECK((y1[i] == 0.0f) == (rng.uniform() < float(p)));

  // backward: dx = dy * mask (here dy = 1, so dx = y1)
  Tensor x = upload(cpu(), {1, 4000}, ones), y = upload(cpu(), {1, 4000}, y1);
  Tensor dy = upload(cpu(), {1, 4000}, ones), dx(cpu(), {1, 4000});
  b.layer->backward(x, y, dy, &dx, ctx);
  CHECK(dx.to_host() == y1);
  CHECK(b.layer->saved_floats_per_sample(in) == 4000);

  // evaluation: identity
  CHECK(run(*b.layer, in, 1, ones, false, 42) == ones);
}

TEST_CASE("layers round-trip through to_json and know their parameter counts", "[nn]") {
  struct Case {
    json spec;
    Shape in;
    int64_t params;
  };
  const std::vector<Case> cases = {
      {{{"type", "linear"}, {"out_features", 7}}, {5}, 42},
      {{{"type", "linear"}, {"out_features", 7}, {"bias", false}, {"in_features", 5}}, {5}, 35},
      {{{"type", "conv2d"}, {"out_channels", 4}, {"kernel", 3}}, {2, 6, 6}, 4 * 18 + 4},
      {{{"type", "conv2d"}, {"out_channels", 4}, {"kernel", {1, 3}}, {"bias", false}, {"padding", {0, 1}}},
       {2, 6, 6}, 4 * 6},
      {{{"type", "maxpool2d"}, {"kernel", 2}}, {3, 4, 4}, 0},
      {{{"type", "avgpool2d"}, {"kernel", 3}, {"stride", 1}, {"padding", 1}}, {3, 4, 4}, 0},
      {{{"type", "relu"}}, {3, 4}, 0},
      {{{"type", "gelu"}}, {3}, 0},
      {{{"type", "tanh"}}, {3}, 0},
      {{{"type", "dropout"}, {"p", 0.1}}, {3}, 0},
      {{{"type", "dropout"}}, {3}, 0},
      {{{"type", "flatten"}}, {3, 4, 5}, 0},
      {{{"type", "layernorm"}}, {3, 8}, 16},
  };
  for (const auto& c : cases) {
    INFO(c.spec.dump());
    auto layer = make_layer(c.spec, c.in);
    CHECK(layer->type() == c.spec["type"]);
    CHECK(layer->param_count() == c.params);
    int64_t listed = 0;
    for (const auto& pi : layer->param_info()) {
      CHECK(pi.offset == listed);
      listed += numel(pi.shape);
    }
    CHECK(listed == c.params);
    auto again = make_layer(layer->to_json(), c.in);
    CHECK(again->to_json() == layer->to_json());
    CHECK(again->output_shape(c.in) == layer->output_shape(c.in));
  }
  CHECK(make_layer({{"type", "dropout"}}, {3})->to_json()["p"] == 0.5);
  CHECK(layer_types() == std::vector<std::string>{"avgpool2d", "causal_self_attention", "conv2d", "dropout",
                                                  "embedding", "flatten", "gelu", "layernorm", "linear",
                                                  "maxpool2d", "position_embedding", "relu", "tanh",
                                                  "transformer_block"});
}

TEST_CASE("PyTorch default initialisation bounds", "[nn]") {
  Rng rng(9);
  auto lin = make_layer({{"type", "linear"}, {"out_features", 50}}, {100});
  std::vector<float> v(static_cast<size_t>(lin->param_count()));
  lin->init(rng, v);
  float lo = 1, hi = -1;
  for (float x : v) lo = std::min(lo, x), hi = std::max(hi, x);
  CHECK(lo >= -0.1f);
  CHECK(hi < 0.1f);
  CHECK(lo < -0.098f);  // spread over the whole interval
  CHECK(hi > 0.098f);

  auto conv = make_layer({{"type", "conv2d"}, {"out_channels", 8}, {"kernel", 3}}, {4, 5, 5});
  v.assign(static_cast<size_t>(conv->param_count()), 0);
  conv->init(rng, v);
  const float bound = 1.0f / 6.0f;  // fan_in = 4 * 3 * 3 = 36
  lo = 1, hi = -1;
  for (float x : v) lo = std::min(lo, x), hi = std::max(hi, x);
  CHECK(lo >= -bound);
  CHECK(hi < bound);
  CHECK(hi > 0.9f * bound);

  auto ln = make_layer({{"type", "layernorm"}}, {4});
  v.assign(8, 5.0f);
  ln->init(rng, v);
  CHECK(v == std::vector<float>{1, 1, 1, 1, 0, 0, 0, 0});
}

TEST_CASE("make_layer rejects bad specs with a message naming the field", "[nn][errors]") {
  CHECK_THAT(error_of({{"type", "conv3d"}}, {1, 4, 4}),
             Contains("unknown layer type 'conv3d'") && Contains("conv2d, dropout"));
  CHECK_THAT(error_of({{"out_features", 3}}, {4}), Contains("field 'type'"));
  CHECK_THAT(error_of({{"type", 3}}, {4}), Contains("field 'type'"));
  CHECK_THAT(error_of(json::array({1, 2}), {4}), Contains("JSON object"));
  CHECK_THAT(error_of({{"type", "linear"}}, {4}), Contains("field 'out_features': missing"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", -3}}, {4}),
             Contains("field 'out_features'") && Contains("positive integer"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", 0}}, {4}), Contains("field 'out_features'"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", 2.5}}, {4}),
             Contains("field 'out_features'") && Contains("2.5"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", "8"}}, {4}), Contains("field 'out_features'"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", 3}, {"bias", 1}}, {4}), Contains("field 'bias'"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", 3}, {"units", 3}}, {4}),
             Contains("unknown field 'units'") && Contains("out_features"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", 3}}, {1, 4, 4}),
             Contains("add a flatten layer before it"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", 3}, {"in_features", 5}}, {4}),
             Contains("field 'in_features'"));
  CHECK_THAT(error_of({{"type", "conv2d"}, {"out_channels", 8}, {"kernel", 5}}, {1, 4, 4}),
             Contains("field 'kernel': kernel 5 larger than padded input 4x4"));
  CHECK(error_of({{"type", "conv2d"}, {"out_channels", 8}, {"kernel", 5}, {"padding", 1}}, {1, 4, 4}) ==
        "(no error)");
  CHECK_THAT(error_of({{"type", "conv2d"}, {"out_channels", 8}, {"kernel", {3, 3, 3}}}, {1, 4, 4}),
             Contains("field 'kernel'"));
  CHECK_THAT(error_of({{"type", "conv2d"}, {"out_channels", 8}, {"kernel", 3}, {"stride", 0}}, {1, 4, 4}),
             Contains("field 'stride'"));
  CHECK_THAT(error_of({{"type", "conv2d"}, {"out_channels", 8}, {"kernel", 3}, {"padding", -1}}, {1, 4, 4}),
             Contains("field 'padding'") && Contains("non-negative"));
  CHECK_THAT(error_of({{"type", "conv2d"}, {"out_channels", 8}, {"kernel", 3}}, {16}),
             Contains("(channels, height, width)"));
  CHECK_THAT(error_of({{"type", "conv2d"}, {"out_channels", 8}, {"kernel", 3}, {"in_channels", 2}}, {1, 8, 8}),
             Contains("field 'in_channels'"));
  CHECK_THAT(error_of({{"type", "conv2d"}, {"out_channels", int64_t{1} << 40}, {"kernel", 3}}, {1, 8, 8}),
             Contains("field 'out_channels'") && Contains("too large"));
  CHECK_THAT(error_of({{"type", "maxpool2d"}}, {1, 8, 8}), Contains("field 'kernel': missing"));
  CHECK_THAT(error_of({{"type", "maxpool2d"}, {"kernel", 2}, {"padding", 2}}, {1, 8, 8}),
             Contains("field 'padding'") && Contains("half the kernel"));
  CHECK_THAT(error_of({{"type", "avgpool2d"}, {"kernel", 9}}, {1, 8, 8}), Contains("field 'kernel'"));
  CHECK_THAT(error_of({{"type", "dropout"}, {"p", 1.0}}, {8}), Contains("field 'p'"));
  CHECK_THAT(error_of({{"type", "dropout"}, {"p", -0.1}}, {8}), Contains("field 'p'"));
  CHECK_THAT(error_of({{"type", "dropout"}, {"rate", 0.1}}, {8}), Contains("unknown field 'rate'"));
  CHECK_THAT(error_of({{"type", "relu"}, {"inplace", true}}, {8}),
             Contains("unknown field 'inplace'") && Contains("takes no fields"));
  CHECK_THAT(error_of({{"type", "layernorm"}, {"eps", 0}}, {8}), Contains("field 'eps'"));
  CHECK_THAT(error_of({{"type", "linear"}, {"out_features", int64_t{1} << 30}}, {4096}),
             Contains("linear weight") && Contains("too large"));
  CHECK_THAT(error_of({{"type", "relu"}}, {int64_t{1} << 30, int64_t{1} << 30, 4}),
             Contains("per-sample input") && Contains("too large"));
  CHECK_THAT(error_of({{"type", "relu"}}, {}), Contains("scalar"));
  CHECK_THAT(error_of({{"type", "relu"}}, {3, 0}), Contains("non-positive"));
}

TEST_CASE("forward rejects tensors of the wrong shape", "[nn][errors]") {
  auto lin = make_layer({{"type", "linear"}, {"out_features", 3}}, {4});
  Tensor params(cpu(), {lin->param_count()}), grads(cpu(), {lin->param_count()});
  lin->bind(params, grads);
  Tensor x(cpu(), {2, 5}), y(cpu(), {2, 3});
  LayerContext ctx;
  CHECK_THROWS_WITH(lin->forward(x, y, ctx, true), Contains("linear input") && Contains("(2, 5)"));
  auto mp = make_layer({{"type", "maxpool2d"}, {"kernel", 2}}, {1, 4, 4});
  Tensor x2(cpu(), {2, 1, 4, 4}), y2(cpu(), {2, 1, 2, 2}), dy2(cpu(), {2, 1, 2, 2}), dx2(cpu(), {2, 1, 4, 4});
  LayerContext empty;
  CHECK_THROWS_AS(mp->backward(x2, y2, dy2, &dx2, empty), std::logic_error);
}

TEST_CASE("a layer's workspace bounds the temporaries its ops take", "[nn][memory]") {
  const std::vector<std::pair<json, Shape>> layers = {
      {{{"type", "linear"}, {"out_features", 300}}, {200}},
      {{{"type", "linear"}, {"out_features", 7}, {"bias", false}}, {20}},
      {{{"type", "conv2d"}, {"out_channels", 8}, {"kernel", 3}, {"padding", 1}}, {3, 12, 12}},
      {{{"type", "conv2d"}, {"out_channels", 5}, {"kernel", 1}}, {4, 6, 6}},
      {{{"type", "conv2d"}, {"out_channels", 2}, {"kernel", 3}}, {1, 6, 6}},
      {{{"type", "layernorm"}}, {6, 64}},
      {{{"type", "maxpool2d"}, {"kernel", 2}}, {3, 8, 8}},
      {{{"type", "avgpool2d"}, {"kernel", 2}}, {3, 8, 8}},
      {{{"type", "relu"}}, {50}},
      {{{"type", "gelu"}}, {50}},
      {{{"type", "dropout"}, {"p", 0.3}}, {50}},
      {{{"type", "flatten"}}, {2, 5, 5}}};
  for (const auto& [spec, in] : layers)
    for (int threads : {1, 3})
      for (int64_t batch : {1, 5, 40}) {
        INFO(spec.dump() << " on " << shape_str(in) << ", batch " << batch << ", " << threads << " threads");
        DeviceOptions opts;
        opts.threads = threads;
        CpuDevice dev(opts);
        std::unique_ptr<Layer> layer = make_layer(spec, in);
        const int64_t n = layer->param_count();
        Tensor params, grads;
        if (n > 0) {
          params = Tensor(dev, {n});
          grads = Tensor(dev, {n});
          dev.fill(params, 0.1f);
          dev.fill(grads, 0.f);
          layer->bind(params, grads);
        }
        Shape xs = {batch}, ys = {batch};
        const Shape out = layer->output_shape(in);
        xs.insert(xs.end(), in.begin(), in.end());
        ys.insert(ys.end(), out.begin(), out.end());
        Tensor x(dev, xs), y(dev, ys), dy(dev, ys), dx(dev, xs);
        dev.fill(x, 0.5f);
        dev.fill(dy, 0.25f);
        const int64_t bound = layer->workspace_bytes(in, batch, Backend::cpu);
        LayerContext ctx;
        dev.reset_peak();
        layer->forward(x, y, ctx, true);
        const int64_t forward_temporaries = static_cast<int64_t>(dev.peak_bytes_in_use() - dev.bytes_in_use());
        dev.reset_peak();
        const size_t before = dev.bytes_in_use();
        layer->backward(x, y, dy, &dx, ctx);
        const int64_t backward_temporaries = static_cast<int64_t>(dev.peak_bytes_in_use() - before);
        CHECK(forward_temporaries <= bound);
        CHECK(backward_temporaries <= bound);
        // The per-sample count bounds every backend at every batch size.
        for (Backend b : {Backend::cpu, Backend::opencl, Backend::cuda})
          CHECK(layer->workspace_bytes(in, batch, b) <= 4 * batch * layer->workspace_floats_per_sample(in));
      }
}
