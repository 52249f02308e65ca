// flatten.cpp: (batch, d1, d2, ...) -> (batch, d1*d2*...), PyTorch nn.Flatten().
// Row-major data is unchanged, so forward and backward are device copies.
#include <stdexcept>

#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

class Flatten final : public Layer {
 public:
  explicit Flatten(const Shape& in) : in_(in) {}

  std::string type() const override { return "flatten"; }
  nlohmann::json to_json() const override { return {{"type", "flatten"}}; }
  Shape output_shape(const Shape& in) const override { return {numel(in)}; }

  void forward(const Tensor& x, const Tensor& y, LayerContext&, bool) override {
    check_batch_shape("flatten input", x, in_);
    check_batch_shape("flatten output", y, {numel(in_)});
    if (y.dim(0) != x.dim(0)) throw std::invalid_argument("flatten: output batch differs from input batch");
    x.device().copy(x, y);
  }
  void backward(const Tensor&, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext&) override {
    if (!dx) return;
    check_batch_shape("flatten output gradient", dy, {numel(in_)});
    check_batch_shape("flatten input gradient", *dx, in_);
    dy.device().copy(dy, *dx);
  }

 private:
  Shape in_;
};

}  // namespace

std::unique_ptr<Layer> make_flatten(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  f.reject_unknown();
  return std::make_unique<Flatten>(in);
}

}  // namespace cleave::nn_detail
