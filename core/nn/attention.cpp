// attention.cpp: causal multi-head self-attention (GPT-2's CausalSelfAttention).
//
// x, y (batch, T, C), heads H, head size hs = C / H:
//   qkv = x c_attn^T + b          (batch, T, 3C): q, k, v side by side, head h at columns h*hs
//   att = causal_softmax(q k^T / sqrt(hs))   per (sample, head), (T, T)
//   out = att v                   (batch, T, C), heads side by side
//   y   = out c_proj^T + b
// The per-head products are gemm calls on strided views of qkv, so the layer
// needs only gemm, the bias ops and causal_softmax_* from the device.
// Saved for backward: qkv, att and out, 4 T C + H T^2 floats per sample.
// Temporaries: the scores in forward (H T^2); in backward dout (T C), dqkv
// (3 T C), datt and dscores (2 H T^2), plus the bias gradients' partials.
// Split for zb1: B keeps out and dqkv (4 T C, less than the 4 T C + H T^2 it
// frees) for W, which computes the projections' gradients from them.
#include <cmath>
#include <stdexcept>

#include "core/nn/gpt_init.h"
#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave::nn_detail {

namespace {

// A (rows, cols) matrix with row stride ld starting `offset` floats into t, as
// the flat view gemm needs.
Tensor mat(const Tensor& t, int64_t offset, int64_t rows, int64_t cols, int64_t ld) {
  return Tensor::view(t, offset, {(rows - 1) * ld + cols});
}

class CausalSelfAttention final : public Layer {
 public:
  CausalSelfAttention(const Shape& in, int64_t heads) : in_(in), t_(in[0]), c_(in[1]), heads_(heads) {}

  std::string type() const override { return "causal_self_attention"; }
  nlohmann::json to_json() const override { return {{"type", "causal_self_attention"}, {"heads", heads_}}; }
  Shape output_shape(const Shape& in) const override {
    if (in != in_)
      throw std::invalid_argument("causal_self_attention: built for " + shape_str(in_) + ", got input " +
                                  shape_str(in));
    return in;
  }
  int64_t param_count() const override { return 4 * c_ * c_ + 4 * c_; }
  std::vector<ParamInfo> param_info() const override {
    return {{"c_attn.weight", {3 * c_, c_}, 0},
            {"c_attn.bias", {3 * c_}, 3 * c_ * c_},
            {"c_proj.weight", {c_, c_}, 3 * c_ * c_ + 3 * c_},
            {"c_proj.bias", {c_}, 4 * c_ * c_ + 3 * c_}};
  }
  void bind(const Tensor& params, const Tensor& grads) override {
    const std::vector<ParamInfo> info = param_info();
    Tensor* p[] = {&w_attn_, &b_attn_, &w_proj_, &b_proj_};
    Tensor* g[] = {&dw_attn_, &db_attn_, &dw_proj_, &db_proj_};
    for (size_t i = 0; i < info.size(); ++i) {
      *p[i] = Tensor::view(params, info[i].offset, info[i].shape);
      *g[i] = Tensor::view(grads, info[i].offset, info[i].shape);
    }
  }
  void init(Rng& rng, std::span<float> out) const override { gpt_init(param_info(), rng, out); }
  int64_t flops_per_sample(const Shape&) const override { return 8 * t_ * c_ * c_ + 4 * t_ * t_ * c_; }
  int64_t saved_floats_per_sample(const Shape&) const override { return 4 * t_ * c_ + heads_ * t_ * t_; }
  int64_t workspace_floats_per_sample(const Shape&) const override {
    return 4 * t_ * c_ + 2 * heads_ * t_ * t_ + 3 * t_ * c_;  // backward's, plus bias_grad_rows' partials
  }
  int64_t workspace_bytes(const Shape&, int64_t batch, Backend backend) const override {
    return 4 * batch * (4 * t_ * c_ + 2 * heads_ * t_ * t_) +
           static_cast<int64_t>(bias_grad_rows_workspace_bytes(backend, batch * t_, 3 * c_));
  }

  void forward(const Tensor& x, const Tensor& y, LayerContext& ctx, bool) override {
    check_batch_shape("causal_self_attention input", x, in_);
    check_batch_shape("causal_self_attention output", y, in_);
    Device& d = x.device();
    const int64_t n = x.dim(0), rows = n * t_, hs = c_ / heads_;
    Tensor qkv(d, {n, t_, 3 * c_}), att(d, {n, heads_, t_, t_}), out(d, {n, t_, c_});
    d.gemm(false, true, rows, 3 * c_, c_, 1.0f, x, c_, w_attn_, c_, 0.0f, qkv, 3 * c_);
    d.add_bias_rows(qkv, b_attn_, rows, 3 * c_);
    {
      Tensor scores(d, {n, heads_, t_, t_});
      for_heads(n, [&](int64_t q, int64_t, int64_t s) {  // scores = q k^T
        d.gemm(false, true, t_, t_, hs, 1.0f, mat(qkv, q, t_, hs, 3 * c_), 3 * c_,
               mat(qkv, q + c_, t_, hs, 3 * c_), 3 * c_, 0.0f, Tensor::view(scores, s, {t_ * t_}), t_);
      });
      d.causal_softmax_forward(scores, att, n * heads_, t_, 1.0f / std::sqrt(static_cast<float>(hs)));
    }
    for_heads(n, [&](int64_t q, int64_t o, int64_t s) {  // out = att v
      d.gemm(false, false, t_, hs, t_, 1.0f, Tensor::view(att, s, {t_ * t_}), t_,
             mat(qkv, q + 2 * c_, t_, hs, 3 * c_), 3 * c_, 0.0f, mat(out, o, t_, hs, c_), c_);
    });
    d.gemm(false, true, rows, c_, c_, 1.0f, out, c_, w_proj_, c_, 0.0f, y, c_);
    d.add_bias_rows(y, b_proj_, rows, c_);
    ctx.saved = {qkv, att, out};
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    backward_input(x, y, dy, dx, ctx);
    backward_weight(x, dy, ctx);
  }
  bool splits_backward() const override { return true; }
  // B: dqkv through the heads and dx from it; leaves ctx.saved = {out, dqkv}
  // (qkv and att are freed), what W needs.
  void backward_input(const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx, LayerContext& ctx) override {
    check_batch_shape("causal_self_attention input", x, in_);
    check_batch_shape("causal_self_attention output gradient", dy, in_);
    if (ctx.saved.size() != 3 || ctx.saved[0].dim(0) != x.dim(0))
      throw std::logic_error("causal_self_attention backward without a matching forward context");
    Device& d = x.device();
    const Tensor qkv = ctx.saved[0], att = ctx.saved[1], out = ctx.saved[2];
    const int64_t n = x.dim(0), rows = n * t_, hs = c_ / heads_;
    Tensor dout(d, {n, t_, c_}), dqkv(d, {n, t_, 3 * c_});
    d.gemm(false, false, rows, c_, c_, 1.0f, dy, c_, w_proj_, c_, 0.0f, dout, c_);
    {
      Tensor datt(d, {n, heads_, t_, t_}), dscores(d, {n, heads_, t_, t_});
      for_heads(n, [&](int64_t q, int64_t o, int64_t s) {
        // datt = dout v^T; dv = att^T dout
        d.gemm(false, true, t_, t_, hs, 1.0f, mat(dout, o, t_, hs, c_), c_, mat(qkv, q + 2 * c_, t_, hs, 3 * c_),
               3 * c_, 0.0f, Tensor::view(datt, s, {t_ * t_}), t_);
        d.gemm(true, false, t_, hs, t_, 1.0f, Tensor::view(att, s, {t_ * t_}), t_, mat(dout, o, t_, hs, c_), c_,
               0.0f, mat(dqkv, q + 2 * c_, t_, hs, 3 * c_), 3 * c_);
      });
      d.causal_softmax_backward(att, datt, dscores, n * heads_, t_, 1.0f / std::sqrt(static_cast<float>(hs)));
      for_heads(n, [&](int64_t q, int64_t, int64_t s) {
        // dq = dscores k; dk = dscores^T q
        const Tensor ds = Tensor::view(dscores, s, {t_ * t_});
        d.gemm(false, false, t_, hs, t_, 1.0f, ds, t_, mat(qkv, q + c_, t_, hs, 3 * c_), 3 * c_, 0.0f,
               mat(dqkv, q, t_, hs, 3 * c_), 3 * c_);
        d.gemm(true, false, t_, hs, t_, 1.0f, ds, t_, mat(qkv, q, t_, hs, 3 * c_), 3 * c_, 0.0f,
               mat(dqkv, q + c_, t_, hs, 3 * c_), 3 * c_);
      });
    }
    if (dx) d.gemm(false, false, rows, c_, 3 * c_, 1.0f, dqkv, 3 * c_, w_attn_, c_, 0.0f, *dx, c_);
    ctx.saved = {out, dqkv};
  }
  // W: both projections' weight and bias gradients, from {out, dqkv}.
  void backward_weight(const Tensor& x, const Tensor& dy, LayerContext& ctx) override {
    check_batch_shape("causal_self_attention input", x, in_);
    check_batch_shape("causal_self_attention output gradient", dy, in_);
    if (ctx.saved.size() != 2 || ctx.saved[0].dim(0) != x.dim(0))
      throw std::logic_error("causal_self_attention weight gradient without its input gradient's context");
    Device& d = x.device();
    const Tensor &out = ctx.saved[0], &dqkv = ctx.saved[1];
    const int64_t rows = x.dim(0) * t_;
    d.gemm(true, false, c_, c_, rows, 1.0f, dy, c_, out, c_, 1.0f, dw_proj_, c_);
    d.bias_grad_rows(dy, db_proj_, rows, c_);
    d.gemm(true, false, 3 * c_, c_, rows, 1.0f, dqkv, 3 * c_, x, c_, 1.0f, dw_attn_, c_);
    d.bias_grad_rows(dqkv, db_attn_, rows, 3 * c_);
    ctx.saved.clear();
  }

 private:
  // Calls f(q, o, s) for every (sample, head): q is the offset of the head's
  // query block in qkv, o of its block in out, s of its (T, T) matrix in att.
  template <typename F>
  void for_heads(int64_t n, F&& f) const {
    const int64_t hs = c_ / heads_;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t h = 0; h < heads_; ++h) f(b * t_ * 3 * c_ + h * hs, b * t_ * c_ + h * hs, (b * heads_ + h) * t_ * t_);
  }

  Shape in_;
  int64_t t_, c_, heads_;
  Tensor w_attn_, b_attn_, w_proj_, b_proj_, dw_attn_, db_attn_, dw_proj_, db_proj_;
};

}  // namespace

std::unique_ptr<Layer> make_causal_self_attention(const nlohmann::json& spec, const Shape& in) {
  SpecFields f(spec);
  const int64_t heads = f.integer("heads", 1);
  f.reject_unknown();
  if (in.size() != 2)
    throw std::invalid_argument("causal_self_attention needs a per-sample input (positions, width), got " +
                                shape_str(in));
  if (in[1] % heads != 0)
    throw std::invalid_argument("field 'heads': " + std::to_string(heads) + " does not divide the width " +
                                std::to_string(in[1]));
  check_elements("causal_self_attention weight (" + std::to_string(3 * in[1]) + ", " + std::to_string(in[1]) + ")",
                 {3 * in[1], in[1]});
  return std::make_unique<CausalSelfAttention>(in, heads);
}

}  // namespace cleave::nn_detail
