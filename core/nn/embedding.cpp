// embedding.cpp: the token embedding (PyTorch nn.Embedding) and the learned
// positional embedding of a GPT.
//
// embedding: x (batch, positions) holds token ids as floats; y (batch,
// positions, dim) row (b, t) = weight[x[b, t]]. The ids are not differentiable:
// a requested dx is zero. position_embedding: x, y (batch, positions, dim),
// y = x + weight (positions, dim) for every sample; dx = dy. Neither saves
// anything for backward beyond x. Both split their backward (Layer::splits_backward):
// B is dx (zero; dy), W the table's gradient.
#include <stdexcept>

#include "core/nn/gpt_init.h"
#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

class Embedding final : public Layer {
 public:
  Embedding(const Shape& in, int64_t vocab, int64_t dim) : in_(in), vocab_(vocab), dim_(dim) {}

  std::string type() const override { return "embedding"; }
  nlohmann::json to_json() const override {
    return {{"type", "embedding"}, {"num_embeddings", vocab_}, {"embedding_dim", dim_}};
  }
  Shape output_shape(const Shape& in) const override {
    if (in.size() != 1)
      throw std::invalid_argument("embedding needs a per-sample input (positions) of token ids, got " + shape_str(in));
    return {in[0], dim_};
  }
  int64_t param_count() const override { return vocab_ * dim_; }
  std::vector<ParamInfo> param_info() const override { return {{"weight", {vocab_, dim_}, 0}}; }
  void bind(const Tensor& params, const Tensor& grads) override {
    w_ = Tensor::view(params, 0, {vocab_, dim_});
    dw_ = Tensor::view(grads, 0, {vocab_, dim_});
  }
  void init(Rng& rng, std::span<float> out) const override { gpt_init(param_info(), rng, out); }

  void forward(const Tensor& x, const Tensor& y, LayerContext&, bool) override {
    check_batch_shape("embedding input", x, in_);
    check_batch_shape("embedding output", y, output_shape(in_));
    x.device().embedding_forward(x, w_, y, x.numel(), vocab_, dim_);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    backward_input(x, y, dy, dx, ctx);
    backward_weight(x, dy, ctx);
  }
  bool splits_backward() const override { return true; }
  void backward_input(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext&) override {
    check_shapes(x, dy);
    if (dx) x.device().fill(*dx, 0.0f);
  }
  void backward_weight(const Tensor& x, const Tensor& dy, LayerContext&) override {
    check_shapes(x, dy);
    x.device().embedding_backward(x, dy, dw_, x.numel(), vocab_, dim_);
  }

 private:
  void check_shapes(const Tensor& x, const Tensor& dy) const {
    check_batch_shape("embedding input", x, in_);
    check_batch_shape("embedding output gradient", dy, output_shape(in_));
  }

  Shape in_;
  int64_t vocab_, dim_;
  Tensor w_, dw_;  // (vocab, dim)
};

class PositionEmbedding final : public Layer {
 public:
  explicit PositionEmbedding(const Shape& in) : in_(in) {}

  std::string type() const override { return "position_embedding"; }
  nlohmann::json to_json() const override { return {{"type", "position_embedding"}}; }
  Shape output_shape(const Shape& in) const override {
    if (in != in_)
      throw std::invalid_argument("position_embedding: built for " + shape_str(in_) + ", got input " + shape_str(in));
    return in;
  }
  int64_t param_count() const override { return numel(in_); }
  std::vector<ParamInfo> param_info() const override { return {{"weight", in_, 0}}; }
  void bind(const Tensor& params, const Tensor& grads) override {
    w_ = Tensor::view(params, 0, {numel(in_)});
    dw_ = Tensor::view(grads, 0, {numel(in_)});
  }
  void init(Rng& rng, std::span<float> out) const override { gpt_init(param_info(), rng, out); }
  int64_t flops_per_sample(const Shape&) const override { return numel(in_); }
  int64_t workspace_floats_per_sample(const Shape&) const override { return numel(in_); }
  int64_t workspace_bytes(const Shape&, int64_t batch, Backend backend) const override {
    return static_cast<int64_t>(bias_grad_rows_workspace_bytes(backend, batch, numel(in_)));
  }

  // Each sample is one row of numel(in) features: the weight is a bias over rows.
  void forward(const Tensor& x, const Tensor& y, LayerContext&, bool) override {
    check_batch_shape("position_embedding input", x, in_);
    check_batch_shape("position_embedding output", y, in_);
    Device& d = x.device();
    d.copy(x, y);
    d.add_bias_rows(y, w_, x.dim(0), numel(in_));
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    backward_input(x, y, dy, dx, ctx);
    backward_weight(x, dy, ctx);
  }
  bool splits_backward() const override { return true; }
  void backward_input(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext&) override {
    check_batch_shape("position_embedding output gradient", dy, in_);
    if (dx) x.device().copy(dy, *dx);
  }
  void backward_weight(const Tensor& x, const Tensor& dy, LayerContext&) override {
    check_batch_shape("position_embedding output gradient", dy, in_);
    x.device().bias_grad_rows(dy, dw_, dy.dim(0), numel(in_));
  }

 private:
  Shape in_;
  Tensor w_, dw_;  // (positions * dim)
};

}  // namespace

std::unique_ptr<Layer> make_embedding(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  const int64_t vocab = f.integer("num_embeddings", 1);
  const int64_t dim = f.integer("embedding_dim", 1);
  f.reject_unknown();
  if (in.size() != 1)
    throw std::invalid_argument("embedding needs a per-sample input (positions) of token ids, got " + shape_str(in));
  check_elements("embedding weight (" + std::to_string(vocab) + ", " + std::to_string(dim) + ")", {vocab, dim});
  return std::make_unique<Embedding>(in, vocab, dim);
}

std::unique_ptr<Layer> make_position_embedding(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  f.reject_unknown();
  if (in.size() != 2)
    throw std::invalid_argument("position_embedding needs a per-sample input (positions, dim), got " + shape_str(in));
  return std::make_unique<PositionEmbedding>(in);
}

}  // namespace cleave::nn_detail
