// layer.h: the Layer interface every layer of a sequential model implements.
//
// A layer is stateless between calls apart from its parameters: whatever forward
// needs to keep for backward goes into the LayerContext the caller owns, one per
// (layer, micro-batch). That is what lets a pipeline stage keep several
// micro-batches in flight. Parameters and their gradients are views into the
// partition's contiguous blocks, bound once with bind().
//
// Shapes passed to output_shape() exclude the batch dimension; tensors passed to
// forward/backward include it: x (batch, in...), y (batch, out...).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/util/rng.h"
#include "device/device.h"

namespace cleave {

// What forward saves for backward (masks, argmax, statistics), plus the seed
// that makes stochastic layers (dropout) reproducible for a given step and
// micro-batch, wherever the layer runs.
struct LayerContext {
  std::vector<Tensor> saved;
  uint64_t seed = 0;
};

class Layer {
 public:
  virtual ~Layer() = default;

  // JSON "type" of this layer, e.g. "linear".
  virtual std::string type() const = 0;
  // The JSON object describing this layer (round-trips through make_layer).
  virtual nlohmann::json to_json() const = 0;
  // Per-sample output shape for a per-sample input shape; throws
  // std::invalid_argument with a message naming the mismatch.
  virtual Shape output_shape(const Shape& in) const = 0;

  // Number of float parameters (0 for parameter-free layers).
  virtual int64_t param_count() const { return 0; }
  // Named parameter tensors, in block order, with PyTorch's names and layouts
  // ("weight" (out, in) / (out, in, kh, kw), "bias"). Offsets are relative to
  // this layer's slice of the block.
  struct ParamInfo {
    std::string name;
    Shape shape;
    int64_t offset;
  };
  virtual std::vector<ParamInfo> param_info() const { return {}; }
  // Binds views into the partition's parameter and gradient blocks (param_count() floats each).
  virtual void bind(const Tensor& params, const Tensor& grads) {}

  // Weight tying: a layer that uses an earlier layer's parameter instead of its
  // own (a GPT's vocabulary projection reading the token embedding's table)
  // names it here: the global index of that layer and the name and shape of
  // the parameter (one of its param_info()). The tied tensor is not in this
  // layer's param_count(); the partition binds it with bind_tied(), and both
  // layers add their gradients into the one gradient slice.
  struct Tie {
    int layer = -1;  // -1: not tied
    std::string param;
    Shape shape;
  };
  virtual Tie tie() const { return {}; }
  // Views of the tied parameter and its gradient, in the owning layer's slices.
  virtual void bind_tied(const Tensor& param, const Tensor& grad) {}
  // Writes PyTorch's default initialisation into `out` (param_count() floats, host).
  virtual void init(Rng& rng, std::span<float> out) const {}

  // Forward FLOPs per sample (multiply-add = 2), for profiles and throughput reports.
  virtual int64_t flops_per_sample(const Shape& in) const { return 0; }
  // Floats of context saved per sample by forward (beyond x and y), for memory plans.
  virtual int64_t saved_floats_per_sample(const Shape& in) const { return 0; }
  // Floats per sample of temporaries forward or backward may hold while it runs
  // (beyond x, y, their gradients and the saved context; freed before it
  // returns) on any backend, for any batch and thread count: a per-sample bound
  // for memory plans that do not know the device.
  virtual int64_t workspace_floats_per_sample(const Shape& in) const { return 0; }
  // Bytes of those temporaries for a batch of `batch` samples on a device of
  // `backend`, whatever its thread count (the device's *_workspace_bytes of the
  // ops the layer runs). At most 4 * batch * workspace_floats_per_sample(in).
  virtual int64_t workspace_bytes(const Shape& in, int64_t batch, Backend backend) const {
    (void)backend;
    return 4 * batch * workspace_floats_per_sample(in);
  }

  // y = f(x). `training` switches dropout on. Fills ctx.saved as needed.
  virtual void forward(const Tensor& x, const Tensor& y, LayerContext& ctx, bool training) = 0;
  // Accumulates parameter gradients into the bound gradient block and, when dx
  // is non-null, writes the input gradient into *dx (overwriting it).
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx,
                        LayerContext& ctx) = 0;

  // backward split in two for the zb1 schedule (core/pipeline/schedule.h): B,
  // the input gradient the previous stage waits for, and W, the parameter
  // gradients nobody waits for. A layer that splits says so in
  // splits_backward(); its backward_input writes *dx (when non-null) and leaves
  // in ctx.saved what backward_weight needs (never more than forward saved),
  // and backward_weight(x, dy, ctx), called once later with the same x and dy,
  // accumulates the parameter gradients. B then W accumulates exactly what
  // backward does (the same ops on the same values). The defaults suit a layer
  // that does not split: B is the whole backward, and nothing calls its W.
  virtual bool splits_backward() const { return false; }
  virtual void backward_input(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx,
                              LayerContext& ctx) {
    backward(x, y, dy, dx, ctx);
  }
  virtual void backward_weight(const Tensor& x, const Tensor& dy, LayerContext& ctx) {}
};

// Builds a layer from its JSON object, e.g. {"type": "conv2d", "out_channels": 32,
// "kernel": 3}. `in` is the per-sample input shape (needed for e.g. Linear's
// in_features when the file omits it). Throws std::invalid_argument naming the
// field that is wrong.
std::unique_ptr<Layer> make_layer(const nlohmann::json& spec, const Shape& in);

// Layer types make_layer knows, for error messages and docs.
std::vector<std::string> layer_types();

}  // namespace cleave
