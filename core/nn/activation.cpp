// activation.cpp: elementwise activations relu, gelu (exact, erf form) and tanh,
// on any per-sample shape. Backward uses x (relu, gelu) or y (tanh), both of
// which the partition keeps, so nothing is saved in the context.
#include <stdexcept>

#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(Activation act, const Shape& in) : act_(act), in_(in) {}

  std::string type() const override {
    switch (act_) {
      case Activation::relu: return "relu";
      case Activation::gelu: return "gelu";
      case Activation::tanh: return "tanh";
    }
    return "?";
  }
  nlohmann::json to_json() const override { return {{"type", type()}}; }
  Shape output_shape(const Shape& in) const override { return in; }
  int64_t flops_per_sample(const Shape& in) const override {
    // relu: one compare; tanh: one transcendental; gelu 0.5*x*(1+erf(x/sqrt 2)): 5 ops
    return numel(in) * (act_ == Activation::gelu ? 5 : 1);
  }

  void forward(const Tensor& x, const Tensor& y, LayerContext&, bool) override {
    check_batch_shape((type() + " input").c_str(), x, in_);
    if (y.shape() != x.shape())
      throw std::invalid_argument(type() + ": output " + shape_str(y.shape()) + " differs from input " +
                                  shape_str(x.shape()));
    x.device().activation_forward(act_, x, y);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx, LayerContext&) override {
    if (!dx) return;
    check_batch_shape((type() + " input").c_str(), x, in_);
    if (dy.shape() != x.shape() || dx->shape() != x.shape() || y.shape() != x.shape())
      throw std::invalid_argument(type() + " backward: x, y, dy and dx must all be " + shape_str(x.shape()));
    x.device().activation_backward(act_, x, y, dy, *dx);
  }

 private:
  Activation act_;
  Shape in_;
};

std::unique_ptr<Layer> make_activation(Activation act, const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  f.reject_unknown();
  return std::make_unique<ActivationLayer>(act, in);
}

}  // namespace

std::unique_ptr<Layer> make_relu(const nlohmann::json& spec, const Shape& in) {
  return make_activation(Activation::relu, spec, in);
}
std::unique_ptr<Layer> make_gelu(const nlohmann::json& spec, const Shape& in) {
  return make_activation(Activation::gelu, spec, in);
}
std::unique_ptr<Layer> make_tanh(const nlohmann::json& spec, const Shape& in) {
  return make_activation(Activation::tanh, spec, in);
}

}  // namespace cleave::nn_detail
