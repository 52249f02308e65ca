// activation.cpp: elementwise activations relu, gelu (exact, erf form, or with
// "approximate": "tanh" GPT-2's tanh form, PyTorch's nn.GELU(approximate='tanh'))
// and tanh, on any per-sample shape. Backward uses x (relu, gelu) or y (tanh), both of
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
      case Activation::gelu:
      case Activation::gelu_tanh: return "gelu";
      case Activation::tanh: return "tanh";
    }
    return "?";
  }
  // The exact gelu writes no "approximate", as it did before the field existed.
  nlohmann::json to_json() const override {
    nlohmann::json j = {{"type", type()}};
    if (act_ == Activation::gelu_tanh) j["approximate"] = "tanh";
    return j;
  }
  Shape output_shape(const Shape& in) const override { return in; }
  int64_t flops_per_sample(const Shape& in) const override {
    // relu: one compare; tanh: one transcendental; gelu 0.5*x*(1+erf(x/sqrt 2)): 5 ops
    return numel(in) * (act_ == Activation::gelu || act_ == Activation::gelu_tanh ? 5 : 1);
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
  SpecFields f(spec);
  const std::string approximate = f.choice("approximate", "none", {"none", "tanh"});
  f.reject_unknown();
  return std::make_unique<ActivationLayer>(approximate == "tanh" ? Activation::gelu_tanh : Activation::gelu, in);
}
std::unique_ptr<Layer> make_tanh(const nlohmann::json& spec, const Shape& in) {
  return make_activation(Activation::tanh, spec, in);
}

}  // namespace cleave::nn_detail
