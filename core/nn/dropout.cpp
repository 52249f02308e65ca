// dropout.cpp: inverted dropout (PyTorch nn.Dropout). In training, each element is
// kept with probability 1 - p and scaled by 1 / (1 - p); the mask is drawn on the
// host from Rng(ctx.seed), so a given (seed, step, micro-batch, layer) gives the
// same mask on every device, uploaded once and saved in the context (backward:
// dx = dy * mask). Outside training, and for p = 0, it is the identity.
#include <stdexcept>
#include <vector>

#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

class Dropout final : public Layer {
 public:
  Dropout(const Shape& in, double p) : in_(in), p_(p) {}

  std::string type() const override { return "dropout"; }
  nlohmann::json to_json() const override { return {{"type", "dropout"}, {"p", p_}}; }
  Shape output_shape(const Shape& in) const override { return in; }
  int64_t flops_per_sample(const Shape& in) const override { return numel(in); }  // one multiply
  int64_t saved_floats_per_sample(const Shape& in) const override { return p_ > 0 ? numel(in) : 0; }

  void forward(const Tensor& x, const Tensor& y, LayerContext& ctx, bool training) override {
    check_batch_shape("dropout input", x, in_);
    if (y.shape() != x.shape())
      throw std::invalid_argument("dropout: output " + shape_str(y.shape()) + " differs from input " +
                                  shape_str(x.shape()));
    Device& d = x.device();
    ctx.saved.clear();
    if (!training || p_ == 0) {
      d.copy(x, y);
      return;
    }
    std::vector<float> mask(static_cast<size_t>(x.numel()));
    Rng rng(ctx.seed);
    const float p = static_cast<float>(p_);
    const float keep_scale = static_cast<float>(1.0 / (1.0 - p_));
    for (float& m : mask) m = rng.uniform() < p ? 0.0f : keep_scale;
    Tensor mask_t(d, x.shape());  // (batch, in...)
    d.upload(mask_t, mask.data());
    d.mul(x, mask_t, y);
    ctx.saved.assign(1, mask_t);
  }

  void backward(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    if (!dx) return;
    check_batch_shape("dropout output gradient", dy, in_);
    if (dx->shape() != dy.shape())
      throw std::invalid_argument("dropout backward: dx " + shape_str(dx->shape()) + " differs from dy " +
                                  shape_str(dy.shape()));
    Device& d = dy.device();
    if (ctx.saved.empty()) {
      d.copy(dy, *dx);  // forward ran as the identity
    } else {
      if (ctx.saved[0].shape() != dy.shape())
        throw std::logic_error("dropout backward: saved mask does not match dy");
      d.mul(dy, ctx.saved[0], *dx);
    }
  }

 private:
  Shape in_;
  double p_;
};

}  // namespace

std::unique_ptr<Layer> make_dropout(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  const double p = f.number("p", 0.5, 0.0, 1.0, false);
  f.reject_unknown();
  return std::make_unique<Dropout>(in, p);
}

}  // namespace cleave::nn_detail
