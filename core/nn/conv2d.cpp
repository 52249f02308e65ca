// conv2d.cpp: 2-D convolution over NCHW input (PyTorch nn.Conv2d, groups=1, dilation=1).
//
// The arithmetic is the device's conv2d_forward / conv2d_backward (device/device.h):
// a portable im2col + GEMM lowering that the CPU backend replaces with a per-sample
// form. Neither keeps anything between the passes but x (saved_floats_per_sample()
// is 0): backward recomputes the columns it needs.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

class Conv2d final : public Layer {
 public:
  Conv2d(const Shape& in, const Window2d& g, int64_t out_channels, bool bias)
      : in_(in), g_(g), oc_(out_channels), bias_(bias) {}

  std::string type() const override { return "conv2d"; }
  nlohmann::json to_json() const override {
    return {{"type", "conv2d"},         {"in_channels", g_.c},        {"out_channels", oc_},
            {"kernel", {g_.kh, g_.kw}}, {"stride", {g_.sh, g_.sw}},   {"padding", {g_.ph, g_.pw}},
            {"bias", bias_}};
  }
  Shape output_shape(const Shape& in) const override {
    Window2d g = make_window("conv2d", in, {g_.kh, g_.kw}, {g_.sh, g_.sw}, {g_.ph, g_.pw});
    if (g.c != g_.c)
      throw std::invalid_argument("conv2d: built for " + std::to_string(g_.c) + " input channels, got input " +
                                  shape_str(in));
    return {oc_, g.out_h(), g.out_w()};
  }
  int64_t ckk() const { return g_.c * g_.kh * g_.kw; }
  int64_t ohw() const { return g_.out_h() * g_.out_w(); }
  int64_t param_count() const override { return oc_ * ckk() + (bias_ ? oc_ : 0); }
  std::vector<ParamInfo> param_info() const override {
    std::vector<ParamInfo> p{{"weight", {oc_, g_.c, g_.kh, g_.kw}, 0}};
    if (bias_) p.push_back({"bias", {oc_}, oc_ * ckk()});
    return p;
  }
  void bind(const Tensor& params, const Tensor& grads) override {
    w_ = Tensor::view(params, 0, {oc_, ckk()});
    dw_ = Tensor::view(grads, 0, {oc_, ckk()});
    if (bias_) {
      b_ = Tensor::view(params, oc_ * ckk(), {oc_});
      db_ = Tensor::view(grads, oc_ * ckk(), {oc_});
    }
  }
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels * kh * kw, for weight and bias.
  void init(Rng& rng, std::span<float> out) const override {
    const float bound = 1.0f / std::sqrt(static_cast<float>(ckk()));
    for (float& v : out) v = rng.uniform(-bound, bound);
  }
  // The portable lowering's columns plus its (OC, N*oh*ow) output or gradient copy,
  // or the CPU's columns (one sample's per thread, at most one per sample) plus its
  // weight-gradient partials (one per group of samples, at most one per sample).
  int64_t workspace_floats_per_sample(const Shape&) const override {
    return ckk() * ohw() + std::max(oc_ * ohw(), oc_ * ckk() + oc_);
  }
  int64_t workspace_bytes(const Shape&, int64_t batch, Backend backend) const override {
    Window2d g = g_;
    g.n = batch;
    return static_cast<int64_t>(conv2d_workspace_bytes(backend, g, oc_));
  }
  int64_t flops_per_sample(const Shape&) const override {
    return 2 * oc_ * ckk() * ohw() + (bias_ ? oc_ * ohw() : 0);
  }

  void forward(const Tensor& x, const Tensor& y, LayerContext&, bool) override {
    check_batch_shape("conv2d input", x, in_);
    check_batch_shape("conv2d output", y, {oc_, g_.out_h(), g_.out_w()});
    Window2d g = g_;
    g.n = x.dim(0);
    x.device().conv2d_forward(x, w_, b_, y, g, oc_);
  }

  void backward(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext&) override {
    check_batch_shape("conv2d input", x, in_);
    check_batch_shape("conv2d output gradient", dy, {oc_, g_.out_h(), g_.out_w()});
    if (dx) check_batch_shape("conv2d input gradient", *dx, in_);
    Window2d g = g_;
    g.n = x.dim(0);
    x.device().conv2d_backward(x, w_, dy, dw_, db_, dx ? *dx : Tensor(), g, oc_);
  }

 private:
  Shape in_;      // (C, H, W)
  Window2d g_;    // geometry with n = 0
  int64_t oc_;
  bool bias_;
  Tensor w_, b_, dw_, db_;  // w (OC, C*kh*kw) = (OC, C, kh, kw), b (OC)
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  const int64_t out_channels = f.integer("out_channels", 1);
  const auto kernel = f.pair("kernel", 1);
  const auto stride = f.pair("stride", 1, {1, 1});
  const auto padding = f.pair("padding", 0, {0, 0});
  const bool bias = f.boolean("bias", true);
  const int64_t in_channels = f.integer("in_channels", 1, -1);
  f.reject_unknown();
  const Window2d g = make_window("conv2d", in, kernel, stride, padding);
  if (in_channels != -1 && in_channels != g.c)
    throw std::invalid_argument("field 'in_channels': " + std::to_string(in_channels) +
                                " does not match the input's " + std::to_string(g.c) + " channels");
  check_elements("conv2d weight", {out_channels, g.c, g.kh, g.kw});
  check_elements("conv2d output", {out_channels, g.out_h(), g.out_w()});
  return std::make_unique<Conv2d>(in, g, out_channels, bias);
}

}  // namespace cleave::nn_detail
