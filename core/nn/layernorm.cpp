// layernorm.cpp: layer normalisation over the last dimension (PyTorch
// nn.LayerNorm(in[-1], eps) with elementwise affine "weight" and "bias").
// x is viewed as (rows, cols) with cols = the last dimension and rows = batch
// times the other per-sample dimensions; mean and rstd (rows) are saved for backward.
#include <stdexcept>

#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

class LayerNorm final : public Layer {
 public:
  LayerNorm(const Shape& in, double eps) : in_(in), cols_(in.back()), eps_(eps) {}

  std::string type() const override { return "layernorm"; }
  nlohmann::json to_json() const override { return {{"type", "layernorm"}, {"eps", eps_}}; }
  Shape output_shape(const Shape& in) const override {
    if (in.empty() || in.back() != cols_)
      throw std::invalid_argument("layernorm: built for a last dimension of " + std::to_string(cols_) +
                                  ", got input " + shape_str(in));
    return in;
  }
  int64_t param_count() const override { return 2 * cols_; }
  std::vector<ParamInfo> param_info() const override { return {{"weight", {cols_}, 0}, {"bias", {cols_}, cols_}}; }
  void bind(const Tensor& params, const Tensor& grads) override {
    gamma_ = Tensor::view(params, 0, {cols_});
    beta_ = Tensor::view(params, cols_, {cols_});
    dgamma_ = Tensor::view(grads, 0, {cols_});
    dbeta_ = Tensor::view(grads, cols_, {cols_});
  }
  // weight 1, bias 0 (no random draws).
  void init(Rng&, std::span<float> out) const override {
    for (int64_t i = 0; i < cols_; ++i) out[static_cast<size_t>(i)] = 1.0f;
    for (int64_t i = cols_; i < 2 * cols_; ++i) out[static_cast<size_t>(i)] = 0.0f;
  }
  int64_t rows_per_sample() const { return numel(in_) / cols_; }
  // mean, variance (2 per element), normalise and affine (4 per element)
  int64_t flops_per_sample(const Shape&) const override { return 8 * numel(in_); }
  int64_t saved_floats_per_sample(const Shape&) const override { return 2 * rows_per_sample(); }
  // The CPU's per-thread dgamma / dbeta partials (layernorm_backward), at most one pair per row.
  int64_t workspace_floats_per_sample(const Shape&) const override { return 2 * numel(in_); }
  int64_t workspace_bytes(const Shape&, int64_t batch, Backend backend) const override {
    return static_cast<int64_t>(layernorm_backward_workspace_bytes(backend, batch * rows_per_sample(), cols_));
  }

  void forward(const Tensor& x, const Tensor& y, LayerContext& ctx, bool) override {
    check_batch_shape("layernorm input", x, in_);
    if (y.shape() != x.shape())
      throw std::invalid_argument("layernorm: output " + shape_str(y.shape()) + " differs from input " +
                                  shape_str(x.shape()));
    Device& d = x.device();
    const int64_t rows = x.dim(0) * rows_per_sample();
    Tensor mean(d, {rows}), rstd(d, {rows});
    d.layernorm_forward(x, gamma_, beta_, y, mean, rstd, rows, cols_, static_cast<float>(eps_));
    ctx.saved = {mean, rstd};
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    check_batch_shape("layernorm input", x, in_);
    if (dy.shape() != x.shape())
      throw std::invalid_argument("layernorm backward: dy " + shape_str(dy.shape()) + " differs from x " +
                                  shape_str(x.shape()));
    const int64_t rows = x.dim(0) * rows_per_sample();
    if (ctx.saved.size() != 2 || ctx.saved[0].numel() != rows)
      throw std::logic_error("layernorm backward without a matching forward context");
    Device& d = x.device();
    // The device op always writes dx; use a scratch tensor when the caller wants none.
    Tensor scratch;
    if (dx) {
      if (dx->shape() != x.shape())
        throw std::invalid_argument("layernorm backward: dx " + shape_str(dx->shape()) + " differs from x " +
                                    shape_str(x.shape()));
    } else {
      scratch = Tensor(d, x.shape());
    }
    d.layernorm_backward(x, gamma_, ctx.saved[0], ctx.saved[1], dy, dx ? *dx : scratch, dgamma_, dbeta_, rows,
                         cols_);
  }

 private:
  Shape in_;
  int64_t cols_;
  double eps_;
  Tensor gamma_, beta_, dgamma_, dbeta_;  // (cols)
};

}  // namespace

std::unique_ptr<Layer> make_layernorm(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  const double eps = f.number("eps", 1e-5, 0.0, 1.0, true);
  f.reject_unknown();
  if (in.empty()) throw std::invalid_argument("layernorm needs an input of rank >= 1 per sample");
  if (!(eps > 0)) throw std::invalid_argument("field 'eps': must be positive, got " + nlohmann::json(eps).dump());
  return std::make_unique<LayerNorm>(in, eps);
}

}  // namespace cleave::nn_detail
