// partition.h: a contiguous range of a model's layers on one device.
//
// A Partition owns one parameter block and one gradient block (each a single
// Tensor); every layer's weights are views into them, so the partition's
// weights are one buffer to checkpoint, send or average. It keeps the
// activations of each micro-batch in flight until that micro-batch's backward
// pass: forward(x, mb) then, later, backward(dy, mb) — or backward_input(dy, mb)
// then backward_weight(mb) (zb1) — for any interleaving of micro-batches
// (GPipe, 1F1B, ZB-H1). Local training is the partition [0, n).
//
// With recomputation (set_recompute) a training forward keeps only the input x
// and the dropout seed of each micro-batch; backward(mb) (or backward_input)
// first runs the forward again with that seed (the same dropout masks, the
// same activations), then back-propagates as without it. The activations then
// live for one backward at a time instead of from each forward to its backward.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/model/model_spec.h"
#include "core/nn/layer.h"

namespace cleave {

class Partition {
 public:
  // Builds layers [begin, end) of `spec` on `device`. Throws std::invalid_argument
  // for an empty or out-of-range interval, OutOfMemory when the blocks do not fit.
  Partition(Device& device, const ModelSpec& spec, int begin, int end);

  Device& device() const { return *device_; }
  const ModelSpec& spec() const { return spec_; }
  int begin() const { return begin_; }
  int end() const { return end_; }
  Shape input_shape() const { return spec_.shapes[begin_]; }   // per sample
  Shape output_shape() const { return spec_.shapes[end_]; }    // per sample
  int64_t param_count() const { return params_.defined() ? params_.numel() : 0; }
  const Tensor& params() const { return params_; }  // (param_count)
  const Tensor& grads() const { return grads_; }    // (param_count)
  Layer& layer(int global_index) { return *layers_.at(global_index - begin_); }
  // Offset of global layer i's parameters inside the block.
  int64_t param_offset(int global_index) const { return offsets_.at(global_index - begin_); }
  // Global index of the first layer that backward(need_dx = false) runs: the
  // first with parameters (or tied to another's), which then skips its own
  // input gradient; the layers before it run no backward at all. end() when
  // none has parameters. The first stage of a pipeline runs its backward so.
  int first_trained_layer() const;

  // PyTorch default initialisation; layer i draws from Rng(derive_seed(seed, i)),
  // so any split of the model starts from the same weights as the whole model.
  void init(uint64_t seed);
  void zero_grad();

  // Runs the layers on x (batch, input_shape...) and returns the output
  // (batch, output_shape...). With `training`, keeps what backward(mb) needs.
  // `seed` drives dropout: pass derive_seed(run_seed, step, mb).
  Tensor forward(const Tensor& x, int microbatch, bool training, uint64_t seed = 0);
  // Back-propagates dy (batch, output_shape...) through micro-batch `mb`,
  // accumulating parameter gradients; returns dx (batch, input_shape...) when
  // need_dx, else an undefined Tensor. Frees the micro-batch's activations.
  // Throws std::logic_error when mb has no pending forward.
  Tensor backward(const Tensor& dy, int microbatch, bool need_dx);
  // backward in the two halves of the zb1 schedule (core/pipeline/schedule.h).
  // backward_input is backward for the input gradient: it returns dx the same
  // way and runs the whole backward of layers that do not split
  // (Layer::splits_backward), but keeps, for each layer that does, its input,
  // its output gradient and what its backward_input left in its context, and
  // frees the rest. backward_weight(mb) then accumulates those layers'
  // parameter gradients, last layer first as backward does, and frees the
  // micro-batch. Together they accumulate exactly what backward does. Both
  // throw std::logic_error out of order (no pending forward; no pending W; a
  // micro-batch forwarded again before its W).
  Tensor backward_input(const Tensor& dy, int microbatch, bool need_dx);
  void backward_weight(int microbatch);
  // Micro-batches whose activations (or, recomputing, inputs) are held (until
  // backward, or until backward_weight), and the bytes they take.
  size_t in_flight() const { return stash_.size() + weight_stash_.size(); }
  size_t stash_bytes() const;

  // Recompute activations in backward (see the file comment). Changes only
  // between batches: throws std::logic_error while micro-batches are in flight.
  void set_recompute(bool on);
  bool recompute() const { return recompute_; }

 private:
  void bind_ties();
  struct Stash {
    std::vector<Tensor> acts;            // acts[i] = input of local layer i; back() = output
    std::vector<LayerContext> contexts;  // one per local layer; empty when only the input is kept
    uint64_t seed = 0;                   // the forward's dropout seed, to run it again
  };
  // The layers' forward from x: keep_all keeps every activation and context
  // (what backward needs), else only x and the latest activation.
  Stash run_layers(const Tensor& x, bool training, bool keep_all, uint64_t seed);
  Device* device_;
  ModelSpec spec_;
  int begin_, end_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<int64_t> offsets_;
  Tensor params_, grads_;
  std::map<int, Stash> stash_;
  // What a micro-batch keeps between backward_input and backward_weight: per
  // layer that splits, last first, its local index, input, output gradient and context.
  struct WeightStash {
    std::vector<size_t> layers;
    std::vector<Tensor> xs, dys;
    std::vector<LayerContext> contexts;
  };
  Stash take_stash(const Tensor& dy, int microbatch, const char* pass);
  template <class Pass>
  Tensor walk_backward(Stash& s, const Tensor& dy, bool need_dx, Pass&& pass);
  std::map<int, WeightStash> weight_stash_;
  bool recompute_ = false;
};

}  // namespace cleave
