// linear.cpp: fully connected layer, y = x W^T + b (PyTorch nn.Linear).
//
// Input is rank 1 per sample (batch, in), or rank 2 (batch, positions, in) for a
// layer applied at every position (a GPT's vocabulary projection), which is the
// rank-1 case on batch * positions rows. W (out, in), b (out), both views into
// the partition's parameter block. Nothing is saved for backward beyond x.
//
// With "tied_to": k the weight is layer k's `weight` (a GPT's vocabulary
// projection sharing the token embedding's (vocab, width) table, nanoGPT's
// `lm_head.weight = wte.weight`): the layer owns only its bias, and the
// partition binds the shared weight and its gradient with bind_tied().
#include <cmath>
#include <stdexcept>

#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

class Linear final : public Layer {
 public:
  Linear(const Shape& in, int64_t out_features, bool bias, int tied_to)
      : in_(in), positions_(in.size() == 2 ? in[0] : 1), in_features_(in.back()), out_features_(out_features),
        bias_(bias), tied_to_(tied_to) {}

  static void check_rank(const Shape& in);
  std::string type() const override { return "linear"; }
  nlohmann::json to_json() const override {
    nlohmann::json j = {
        {"type", "linear"}, {"in_features", in_features_}, {"out_features", out_features_}, {"bias", bias_}};
    if (tied()) j["tied_to"] = tied_to_;
    return j;
  }
  Shape output_shape(const Shape& in) const override {
    check_rank(in);
    if (in.back() != in_features_)
      throw std::invalid_argument("field 'in_features': layer has " + std::to_string(in_features_) +
                                  " but its input has " + std::to_string(in.back()) + " features");
    if (in.size() == 2) return {in[0], out_features_};
    return {out_features_};
  }
  int64_t param_count() const override { return own_weight_count() + (bias_ ? out_features_ : 0); }
  std::vector<ParamInfo> param_info() const override {
    std::vector<ParamInfo> p;
    if (!tied()) p.push_back({"weight", {out_features_, in_features_}, 0});
    if (bias_) p.push_back({"bias", {out_features_}, own_weight_count()});
    return p;
  }
  void bind(const Tensor& params, const Tensor& grads) override {
    const int64_t nw = own_weight_count();
    if (!tied()) {
      w_ = Tensor::view(params, 0, {out_features_, in_features_});
      dw_ = Tensor::view(grads, 0, {out_features_, in_features_});
    }
    if (bias_) {
      b_ = Tensor::view(params, nw, {out_features_});
      db_ = Tensor::view(grads, nw, {out_features_});
    }
  }
  Tie tie() const override {
    if (!tied()) return {};
    return {tied_to_, "weight", {out_features_, in_features_}};
  }
  void bind_tied(const Tensor& param, const Tensor& grad) override {
    w_ = Tensor::view(param, 0, {out_features_, in_features_});
    dw_ = Tensor::view(grad, 0, {out_features_, in_features_});
  }
  // U(-1/sqrt(in), 1/sqrt(in)) for weight and bias (PyTorch's kaiming_uniform_(a=sqrt(5))).
  // A tied weight is initialised by the layer that owns it.
  void init(Rng& rng, std::span<float> out) const override {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_features_));
    for (float& v : out) v = rng.uniform(-bound, bound);
  }
  // The CPU's per-thread bias-gradient partials (bias_grad_rows), at most one row per sample.
  int64_t workspace_floats_per_sample(const Shape&) const override { return bias_ ? positions_ * out_features_ : 0; }
  int64_t workspace_bytes(const Shape&, int64_t batch, Backend backend) const override {
    return bias_ ? static_cast<int64_t>(bias_grad_rows_workspace_bytes(backend, batch * positions_, out_features_))
                 : 0;
  }
  int64_t flops_per_sample(const Shape&) const override {
    return positions_ * (2 * in_features_ * out_features_ + (bias_ ? out_features_ : 0));
  }

  void forward(const Tensor& x, const Tensor& y, LayerContext&, bool) override {
    check_bound();
    check_batch_shape("linear input", x, in_);
    const int64_t n = x.dim(0) * positions_;
    check_batch_shape("linear output", y, output_shape(in_));
    if (y.dim(0) != x.dim(0)) throw std::invalid_argument("linear: output batch differs from input batch");
    Device& d = x.device();
    // y (n, out) = x (n, in) * W^T (in, out)
    d.gemm(false, true, n, out_features_, in_features_, 1.0f, x, in_features_, w_, in_features_, 0.0f, y,
           out_features_);
    if (bias_) d.add_bias_rows(y, b_, n, out_features_);
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    backward_input(x, y, dy, dx, ctx);
    backward_weight(x, dy, ctx);
  }
  bool splits_backward() const override { return true; }
  void backward_input(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext&) override {
    const int64_t n = checked_rows(x, dy);
    if (!dx) return;
    check_batch_shape("linear input gradient", *dx, in_);
    // dx (n, in) = dy (n, out) * W (out, in)
    x.device().gemm(false, false, n, in_features_, out_features_, 1.0f, dy, out_features_, w_, in_features_, 0.0f,
                    *dx, in_features_);
  }
  void backward_weight(const Tensor& x, const Tensor& dy, LayerContext&) override {
    const int64_t n = checked_rows(x, dy);
    Device& d = x.device();
    // dW (out, in) += dy^T (out, n) * x (n, in)
    d.gemm(true, false, out_features_, in_features_, n, 1.0f, dy, out_features_, x, in_features_, 1.0f, dw_,
           in_features_);
    if (bias_) d.bias_grad_rows(dy, db_, n, out_features_);
  }

 private:
  bool tied() const { return tied_to_ >= 0; }
  int64_t own_weight_count() const { return tied() ? 0 : out_features_ * in_features_; }
  // Rows of the matrices behind x and dy, after checking both against the layer.
  int64_t checked_rows(const Tensor& x, const Tensor& dy) const {
    check_bound();
    check_batch_shape("linear input", x, in_);
    check_batch_shape("linear output gradient", dy, output_shape(in_));
    return x.dim(0) * positions_;
  }
  void check_bound() const {
    if (!w_.defined())
      throw std::logic_error("linear: weight tied to layer " + std::to_string(tied_to_) +
                             " but never bound (build it in a Partition that holds layer " +
                             std::to_string(tied_to_) + ")");
  }

  Shape in_;
  int64_t positions_, in_features_, out_features_;
  bool bias_;
  int tied_to_;  // -1: own weight
  Tensor w_, b_, dw_, db_;  // w (out, in), b (out)
};

}  // namespace

void Linear::check_rank(const Shape& in) {
  if (in.size() != 1 && in.size() != 2)
    throw std::invalid_argument("linear needs a rank-1 input per sample (or rank 2: positions, features), got " +
                                shape_str(in) + " (add a flatten layer before it)");
}

std::unique_ptr<Layer> make_linear(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  const int64_t out_features = f.integer("out_features", 1);
  const bool bias = f.boolean("bias", true);
  const int64_t in_features = f.integer("in_features", 1, -1);
  const int64_t tied_to = f.integer("tied_to", 0, -1);
  f.reject_unknown();
  Linear::check_rank(in);
  if (in_features != -1 && in_features != in.back())
    throw std::invalid_argument("field 'in_features': " + std::to_string(in_features) + " does not match the input's " +
                                std::to_string(in.back()) + " features");
  check_elements("linear weight (" + std::to_string(out_features) + ", " + std::to_string(in.back()) + ")",
                 {out_features, in.back()});
  return std::make_unique<Linear>(in, out_features, bias, static_cast<int>(tied_to));
}

}  // namespace cleave::nn_detail
