// test_gradcheck.cpp: finite-difference checks of every layer's input and
// parameter gradients on several random shapes, and of the checker itself.
#include <catch2/catch.hpp>

#include "core/nn/layer.h"
#include "nn/nn_test_util.h"

using namespace cleave;
using namespace cleave::test;
using nlohmann::json;

namespace {

enum class Values { normal, away_from_zero, distinct };

// Builds the layer, draws x and random parameters, runs the checker, and
// reports the case on failure.
void check_case(const json& spec, const Shape& in, int64_t batch, uint64_t seed, Values values,
                const GradCheckOptions& opt = {}) {
  Rng rng(seed);
  auto layer = make_layer(spec, in);
  const int64_t nx = batch * numel(in);
  std::vector<float> x = values == Values::distinct         ? random_distinct(rng, nx)
                         : values == Values::away_from_zero ? random_away_from_zero(rng, nx)
                                                            : random_normal(rng, nx);
  const std::vector<float> p = random_normal(rng, layer->param_count(), 0.5f);
  const GradCheckReport rep = check_gradients(*layer, in, batch, x, p, rng, opt);
  INFO(spec.dump() << " on " << shape_str(batched(batch, in)) << ": " << rep.checked << " checked, "
                   << rep.failures << " failed, max abs err " << rep.max_abs_err << "; " << rep.first_failure);
  CHECK(rep.checked == nx + layer->param_count());
  CHECK(rep.ok());
}

int64_t pick(Rng& rng, int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng.below(hi - lo + 1)); }

}  // namespace

TEST_CASE("gradcheck: linear", "[nn][gradcheck]") {
  Rng rng(101);
  for (int t = 0; t < 4; ++t) {
    const int64_t in = pick(rng, 1, 7), out = pick(rng, 1, 6), batch = pick(rng, 1, 3);
    const bool bias = t != 2;
    check_case({{"type", "linear"}, {"out_features", out}, {"bias", bias}}, {in}, batch, 1000 + t, Values::normal);
  }
}

TEST_CASE("gradcheck: conv2d", "[nn][gradcheck]") {
  Rng rng(202);
  for (int t = 0; t < 5; ++t) {
    const int64_t c = pick(rng, 1, 3), oc = pick(rng, 1, 3), batch = pick(rng, 1, 3);
    const int64_t h = pick(rng, 3, 6), w = pick(rng, 3, 6);
    const int64_t kh = pick(rng, 1, 3), kw = t == 0 ? kh : pick(rng, 1, 3);
    const int64_t sh = pick(rng, 1, 2), sw = pick(rng, 1, 2), ph = pick(rng, 0, 1), pw = pick(rng, 0, 1);
    json spec = {{"type", "conv2d"}, {"out_channels", oc}, {"kernel", {kh, kw}},  {"stride", {sh, sw}},
                 {"padding", {ph, pw}}, {"bias", t != 3}};
    check_case(spec, {c, h, w}, batch, 2000 + t, Values::normal);
  }
}

TEST_CASE("gradcheck: maxpool2d and avgpool2d", "[nn][gradcheck]") {
  Rng rng(303);
  for (const char* type : {"maxpool2d", "avgpool2d"}) {
    for (int t = 0; t < 4; ++t) {
      const int64_t c = pick(rng, 1, 3), batch = pick(rng, 1, 2), h = pick(rng, 2, 6), w = pick(rng, 2, 6);
      const int64_t k = pick(rng, 1, 2) + (t == 3 ? 1 : 0);
      json spec = {{"type", type}, {"kernel", k}};
      if (t >= 1) spec["stride"] = pick(rng, 1, 2);
      if (t >= 2) spec["padding"] = k / 2;
      // distinct values keep each window's maximum put under +-eps
      check_case(spec, {c, h, w}, batch, 3000 + t, Values::distinct);
    }
  }
}

TEST_CASE("gradcheck: activations", "[nn][gradcheck]") {
  Rng rng(404);
  for (const char* type : {"relu", "gelu", "tanh"}) {
    for (int t = 0; t < 3; ++t) {
      Shape in = t == 0 ? Shape{pick(rng, 1, 8)} : Shape{pick(rng, 1, 3), pick(rng, 1, 4), pick(rng, 1, 4)};
      check_case({{"type", type}}, in, pick(rng, 1, 3), 4000 + t, Values::away_from_zero);
    }
  }
}

TEST_CASE("gradcheck: dropout, flatten, layernorm", "[nn][gradcheck]") {
  Rng rng(505);
  for (int t = 0; t < 3; ++t) {
    const Shape in{pick(rng, 1, 3), pick(rng, 1, 4), pick(rng, 1, 4)};
    check_case({{"type", "dropout"}, {"p", 0.3 + 0.2 * t}}, in, pick(rng, 1, 3), 5000 + t, Values::normal);
    check_case({{"type", "flatten"}}, in, pick(rng, 1, 3), 5100 + t, Values::normal);
    const Shape ln_in = t == 0 ? Shape{pick(rng, 2, 8)} : in;
    check_case({{"type", "layernorm"}}, ln_in, pick(rng, 1, 3), 5200 + t, Values::normal);
  }
}

TEST_CASE("gradcheck detects a wrong gradient", "[nn][gradcheck]") {
  // A linear layer whose backward is 20 % too large in one input-gradient place: the
  // checker must flag it, so a passing check means something.
  class Faulty final : public Layer {
   public:
    explicit Faulty(std::unique_ptr<Layer> inner) : inner_(std::move(inner)) {}
    std::string type() const override { return "faulty"; }
    json to_json() const override { return inner_->to_json(); }
    Shape output_shape(const Shape& in) const override { return inner_->output_shape(in); }
    int64_t param_count() const override { return inner_->param_count(); }
    void bind(const Tensor& p, const Tensor& g) override { inner_->bind(p, g); }
    void forward(const Tensor& x, const Tensor& y, LayerContext& ctx, bool tr) override {
      inner_->forward(x, y, ctx, tr);
    }
    void backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
      inner_->backward(x, y, dy, dx, ctx);
      if (dx) x.device().scale(Tensor::view(*dx, 0, {1}), 1.2f);
    }

   private:
    std::unique_ptr<Layer> inner_;
  };
  Rng rng(606);
  Faulty layer(make_layer({{"type", "linear"}, {"out_features", 4}}, {5}));
  const auto x = random_normal(rng, 10);
  const auto p = random_normal(rng, layer.param_count());
  const GradCheckReport rep = check_gradients(layer, {5}, 2, x, p, rng);
  CHECK(rep.failures == 1);
  CHECK(rep.first_failure.rfind("input[0]", 0) == 0);
}
