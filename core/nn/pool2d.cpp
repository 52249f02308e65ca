// pool2d.cpp: max and average pooling over NCHW input (PyTorch nn.MaxPool2d /
// nn.AvgPool2d with ceil_mode=False; average counts padding, count_include_pad=True).
//
// Fields: "kernel" (int or [kh, kw]), "stride" (defaults to the kernel),
// "padding" (default 0, at most half the kernel as in PyTorch). Max pooling
// saves the argmax tensor (batch, C, oh, ow) in the context for backward.
#include <stdexcept>

#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

// Largest input plane whose positions a float argmax holds exactly.
constexpr int64_t kMaxArgmaxPlane = int64_t{1} << 24;

class Pool2d final : public Layer {
 public:
  Pool2d(bool is_max, const Shape& in, const Window2d& g) : max_(is_max), in_(in), g_(g) {}

  std::string type() const override { return max_ ? "maxpool2d" : "avgpool2d"; }
  nlohmann::json to_json() const override {
    return {{"type", type()}, {"kernel", {g_.kh, g_.kw}}, {"stride", {g_.sh, g_.sw}}, {"padding", {g_.ph, g_.pw}}};
  }
  Shape output_shape(const Shape& in) const override {
    Window2d g = make_window(type(), in, {g_.kh, g_.kw}, {g_.sh, g_.sw}, {g_.ph, g_.pw});
    return {g.c, g.out_h(), g.out_w()};
  }
  Shape out() const { return {g_.c, g_.out_h(), g_.out_w()}; }
  int64_t flops_per_sample(const Shape&) const override {
    // one compare (max) or add (average) per window element, plus the division for average
    return numel(out()) * (g_.kh * g_.kw + (max_ ? 0 : 1));
  }
  int64_t saved_floats_per_sample(const Shape&) const override { return max_ ? numel(out()) : 0; }

  void forward(const Tensor& x, const Tensor& y, LayerContext& ctx, bool) override {
    check_batch_shape(max_ ? "maxpool2d input" : "avgpool2d input", x, in_);
    check_batch_shape(max_ ? "maxpool2d output" : "avgpool2d output", y, out());
    Device& d = x.device();
    Window2d g = g_;
    g.n = x.dim(0);
    if (max_) {
      Tensor argmax(d, y.shape());  // (N, C, oh, ow) input-plane index of each maximum
      d.maxpool_forward(x, y, argmax, g);
      ctx.saved.assign(1, argmax);
    } else {
      d.avgpool_forward(x, y, g);
    }
  }

  void backward(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    check_batch_shape(max_ ? "maxpool2d output gradient" : "avgpool2d output gradient", dy, out());
    if (!dx) return;
    check_batch_shape(max_ ? "maxpool2d input gradient" : "avgpool2d input gradient", *dx, in_);
    Device& d = x.device();
    Window2d g = g_;
    g.n = x.dim(0);
    if (max_) {
      if (ctx.saved.size() != 1 || ctx.saved[0].shape() != dy.shape())
        throw std::logic_error("maxpool2d backward without a matching forward context");
      d.maxpool_backward(dy, ctx.saved[0], *dx, g);
    } else {
      d.avgpool_backward(dy, *dx, g);
    }
  }

 private:
  bool max_;
  Shape in_;    // (C, H, W)
  Window2d g_;  // n = 0
};

std::unique_ptr<Layer> make_pool(bool is_max, const nlohmann::json& spec, const Shape& in) {
  const std::string type = is_max ? "maxpool2d" : "avgpool2d";
  SpecFields f(spec);
  const auto kernel = f.pair("kernel", 1);
  const auto stride = f.pair("stride", 1, kernel);
  const auto padding = f.pair("padding", 0, {0, 0});
  f.reject_unknown();
  if (2 * padding[0] > kernel[0] || 2 * padding[1] > kernel[1])
    throw std::invalid_argument("field 'padding': " + hw_str(padding[0], padding[1]) +
                                " must be at most half the kernel " + hw_str(kernel[0], kernel[1]));
  const Window2d g = make_window(type, in, kernel, stride, padding);
  if (is_max && g.h * g.w > kMaxArgmaxPlane)
    throw std::invalid_argument("maxpool2d: input plane " + std::to_string(g.h) + "x" + std::to_string(g.w) +
                                " is too large (at most 2^24 positions)");
  return std::make_unique<Pool2d>(is_max, in, g);
}

}  // namespace

std::unique_ptr<Layer> make_maxpool2d(const nlohmann::json& spec, const Shape& in) { return make_pool(true, spec, in); }
std::unique_ptr<Layer> make_avgpool2d(const nlohmann::json& spec, const Shape& in) {
  return make_pool(false, spec, in);
}

}  // namespace cleave::nn_detail
