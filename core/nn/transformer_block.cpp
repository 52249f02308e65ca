// transformer_block.cpp: one pre-LN GPT-2 block as a single layer, so that the
// planner and the pipeline cut stages between blocks:
//   r = x + attn(ln_1(x))
//   y = r + mlp(ln_2(r)),   mlp = c_proj(gelu_tanh(c_fc(.)))   (width -> 4 width -> width)
// x, y (batch, T, C). The parts are the registry's own layers (layernorm,
// causal_self_attention, linear, gelu with approximate "tanh") bound to
// consecutive slices of the block's parameters; names follow nanoGPT
// (ln_1.*, attn.c_attn.*, attn.c_proj.*, ln_2.*, mlp.c_fc.*, mlp.c_proj.*).
// Saved for backward: ln_1(x), r, ln_2(r) (T C each), c_fc's output and its
// gelu (4 T C each), the attention's context and both norms' statistics.
// Split for zb1: B runs every part's input gradient (and the norms' whole
// backward: their device op gives dx, dgamma and dbeta at once) and keeps for W
// gelu's output, ln_2(r), their gradients and the attention's W context, less
// than the forward's context it frees; W runs the four projections' gradients.
#include <algorithm>
#include <stdexcept>

#include "core/nn/gpt_init.h"
#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

class TransformerBlock final : public Layer {
 public:
  TransformerBlock(const Shape& in, int64_t heads) : in_(in), t_(in[0]), c_(in[1]), heads_(heads) {
    using nlohmann::json;
    ln1_ = make_layer({{"type", "layernorm"}}, in);
    attn_ = make_layer({{"type", "causal_self_attention"}, {"heads", heads}}, in);
    ln2_ = make_layer({{"type", "layernorm"}}, in);
    fc_ = make_layer({{"type", "linear"}, {"out_features", 4 * c_}}, in);
    gelu_ = make_layer({{"type", "gelu"}, {"approximate", "tanh"}}, {t_, 4 * c_});
    proj_ = make_layer({{"type", "linear"}, {"out_features", c_}}, {t_, 4 * c_});
  }

  std::string type() const override { return "transformer_block"; }
  nlohmann::json to_json() const override { return {{"type", "transformer_block"}, {"heads", heads_}}; }
  Shape output_shape(const Shape& in) const override {
    if (in != in_)
      throw std::invalid_argument("transformer_block: built for " + shape_str(in_) + ", got input " + shape_str(in));
    return in;
  }
  int64_t param_count() const override {
    int64_t n = 0;
    for (const Part& p : parts()) n += p.layer->param_count();
    return n;
  }
  std::vector<ParamInfo> param_info() const override {
    std::vector<ParamInfo> out;
    int64_t offset = 0;
    for (const Part& p : parts()) {
      append_params(out, p.layer->param_info(), p.prefix, offset);
      offset += p.layer->param_count();
    }
    return out;
  }
  void bind(const Tensor& params, const Tensor& grads) override {
    int64_t offset = 0;
    for (const Part& p : parts()) {
      const int64_t n = p.layer->param_count();
      p.layer->bind(Tensor::view(params, offset, {n}), Tensor::view(grads, offset, {n}));
      offset += n;
    }
  }
  void init(Rng& rng, std::span<float> out) const override { gpt_init(param_info(), rng, out); }
  int64_t flops_per_sample(const Shape& in) const override {
    return attn_->flops_per_sample(in) + fc_->flops_per_sample(in) + proj_->flops_per_sample({t_, 4 * c_}) +
           2 * ln1_->flops_per_sample(in) + gelu_->flops_per_sample({t_, 4 * c_}) + 2 * t_ * c_;
  }
  int64_t saved_floats_per_sample(const Shape& in) const override {
    return 11 * t_ * c_ + attn_->saved_floats_per_sample(in) + 2 * ln1_->saved_floats_per_sample(in);
  }
  // backward's dg, df (4 T C each), dh2, dr, dh1 (T C each), forward's attention
  // output (T C), and the largest part's own temporaries.
  int64_t workspace_floats_per_sample(const Shape& in) const override {
    return 12 * t_ * c_ + std::max({attn_->workspace_floats_per_sample(in), fc_->workspace_floats_per_sample(in),
                                    ln1_->workspace_floats_per_sample(in)});
  }
  int64_t workspace_bytes(const Shape& in, int64_t batch, Backend backend) const override {
    return 4 * batch * 12 * t_ * c_ +
           std::max({attn_->workspace_bytes(in, batch, backend), fc_->workspace_bytes(in, batch, backend),
                     ln1_->workspace_bytes(in, batch, backend)});
  }

  void forward(const Tensor& x, const Tensor& y, LayerContext& ctx, bool training) override {
    check_batch_shape("transformer_block input", x, in_);
    check_batch_shape("transformer_block output", y, in_);
    Device& d = x.device();
    const int64_t n = x.dim(0);
    Tensor h1(d, x.shape()), r(d, x.shape()), h2(d, x.shape()), f(d, {n, t_, 4 * c_}), g(d, {n, t_, 4 * c_});
    LayerContext c_ln1, c_attn, c_ln2, none;
    ln1_->forward(x, h1, c_ln1, training);
    attn_->forward(h1, r, c_attn, training);
    d.axpy(1.0f, x, r);  // r = x + attn(ln_1(x))
    ln2_->forward(r, h2, c_ln2, training);
    fc_->forward(h2, f, none, training);
    gelu_->forward(f, g, none, training);
    proj_->forward(g, y, none, training);
    d.axpy(1.0f, r, y);  // y = r + mlp(ln_2(r))
    ctx.saved = {h1, r, h2, f, g};
    for (LayerContext* c : {&c_ln1, &c_attn, &c_ln2}) {
      ctx.saved.push_back(Tensor());  // separator: the parts' contexts follow in order
      ctx.saved.insert(ctx.saved.end(), c->saved.begin(), c->saved.end());
    }
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    backward_input(x, y, dy, dx, ctx);
    backward_weight(x, dy, ctx);
  }
  bool splits_backward() const override { return true; }
  // B: the input gradient through every part, the norms' gradients with it (one
  // device op gives both); leaves ctx.saved = {g, h2, df, h1, dr, the
  // attention's W context...}, what W needs for the four projections.
  void backward_input(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    check_batch_shape("transformer_block input", x, in_);
    check_batch_shape("transformer_block output gradient", dy, in_);
    if (ctx.saved.size() < 8 || ctx.saved[0].dim(0) != x.dim(0))
      throw std::logic_error("transformer_block backward without a matching forward context");
    Device& d = x.device();
    const Tensor h1 = ctx.saved[0], r = ctx.saved[1], h2 = ctx.saved[2], f = ctx.saved[3], g = ctx.saved[4];
    LayerContext parts[3], none;
    for (size_t i = 6, k = 0; i < ctx.saved.size(); ++i) {
      if (!ctx.saved[i].defined()) ++k;
      else parts[k].saved.push_back(ctx.saved[i]);
    }
    Tensor df(d, f.shape()), dh(d, x.shape()), dr(d, x.shape());
    {
      Tensor dg(d, g.shape());
      proj_->backward_input(g, Tensor(), dy, &dg, none);
      gelu_->backward(f, g, dg, &df, none);
    }
    fc_->backward_input(h2, f, df, &dh, none);
    ln2_->backward(r, h2, dh, &dr, parts[2]);
    d.axpy(1.0f, dy, dr);  // through the residual
    attn_->backward_input(h1, Tensor(), dr, &dh, parts[1]);
    ln1_->backward(x, h1, dh, dx, parts[0]);
    if (dx) d.axpy(1.0f, dr, *dx);
    ctx.saved = {g, h2, df, h1, dr};
    ctx.saved.insert(ctx.saved.end(), parts[1].saved.begin(), parts[1].saved.end());
  }
  // W: the gradients of mlp.c_proj, mlp.c_fc and the attention's projections.
  void backward_weight(const Tensor& x, const Tensor& dy, LayerContext& ctx) override {
    check_batch_shape("transformer_block input", x, in_);
    check_batch_shape("transformer_block output gradient", dy, in_);
    if (ctx.saved.size() < 5 || ctx.saved[0].dim(0) != x.dim(0))
      throw std::logic_error("transformer_block weight gradient without its input gradient's context");
    const Tensor g = ctx.saved[0], h2 = ctx.saved[1], df = ctx.saved[2], h1 = ctx.saved[3], dr = ctx.saved[4];
    LayerContext attn, none;
    attn.saved.assign(ctx.saved.begin() + 5, ctx.saved.end());
    proj_->backward_weight(g, dy, none);
    fc_->backward_weight(h2, df, none);
    attn_->backward_weight(h1, dr, attn);
    ctx.saved.clear();
  }

 private:
  struct Part {
    const char* prefix;
    Layer* layer;
  };
  std::vector<Part> parts() const {
    return {{"ln_1.", ln1_.get()},   {"attn.", attn_.get()},    {"ln_2.", ln2_.get()},
            {"mlp.c_fc.", fc_.get()}, {"mlp.c_proj.", proj_.get()}};
  }

  Shape in_;
  int64_t t_, c_, heads_;
  std::unique_ptr<Layer> ln1_, attn_, ln2_, fc_, gelu_, proj_;
};

}  // namespace

std::unique_ptr<Layer> make_transformer_block(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  const int64_t heads = f.integer("heads", 1);
  f.reject_unknown();
  if (in.size() != 2)
    throw std::invalid_argument("transformer_block needs a per-sample input (positions, width), got " + shape_str(in));
  if (in[1] % heads != 0)
    throw std::invalid_argument("field 'heads': " + std::to_string(heads) + " does not divide the width " +
                                std::to_string(in[1]));
  return std::make_unique<TransformerBlock>(in, heads);
}

}  // namespace cleave::nn_detail
