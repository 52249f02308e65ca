// partition.cpp: layers [begin, end) of a model on one device, with one parameter
// block, one gradient block, and the stashed activations of each micro-batch.
//
// Forward keeps references to x and to every layer's output (no copies): the
// caller must not overwrite x or the returned output until backward(mb) has run.
// Backward releases each activation as soon as the layer that needed it is done.
// Recomputing, forward keeps x alone and backward rebuilds the rest first.
#include "core/model/partition.h"

#include <stdexcept>
#include <string>

#include "core/nn/spec_fields.h"

namespace cleave {

namespace {

std::string range_str(int begin, int end) {
  // Appended piece by piece: `"[" + std::to_string(...)` trips GCC 12's false
  // -Wrestrict on operator+(const char*, string&&) (GCC bug 105329).
  std::string s = "[";
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  s += ')';
  return s;
}

}  // namespace

Partition::Partition(Device& device, const ModelSpec& spec, int begin, int end)
    : device_(&device), spec_(spec), begin_(begin), end_(end) {
  if (begin < 0 || end > spec.num_layers() || begin >= end)
    throw std::invalid_argument("partition " + range_str(begin, end) + " is empty or outside the model's " +
                                std::to_string(spec.num_layers()) + " layers");
  if (static_cast<int>(spec.shapes.size()) != spec.num_layers() + 1)
    throw std::invalid_argument("partition: model spec '" + spec.name + "' has no shapes (use ModelSpec::parse)");
  int64_t total = 0;
  for (int i = begin; i < end; ++i) {
    layers_.push_back(make_layer(spec.layers[static_cast<size_t>(i)], spec.shapes[static_cast<size_t>(i)]));
    offsets_.push_back(total);
    total += layers_.back()->param_count();
  }
  if (total > 0) {
    params_ = Tensor(device, {total});
    grads_ = Tensor(device, {total});
    device.fill(params_, 0.0f);
    device.fill(grads_, 0.0f);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const int64_t n = layers_[l]->param_count();
      if (n == 0) continue;
      layers_[l]->bind(Tensor::view(params_, offsets_[l], {n}), Tensor::view(grads_, offsets_[l], {n}));
    }
  }
  bind_ties();
}

// A tied layer (Layer::tie) reads the owning layer's parameter, which must be in
// this partition: its gradient then collects both layers' contributions in one
// slice. A pipeline cut between the two would need the gradient exchanged
// between stages, which is not implemented: refuse the cut.
void Partition::bind_ties() {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer::Tie tie = layers_[l]->tie();
    if (tie.layer < 0) continue;
    const int global = begin_ + static_cast<int>(l);
    if (tie.layer < begin_)
      throw std::invalid_argument(
          "layer " + std::to_string(global) + " (" + layers_[l]->type() + ") shares layer " +
          std::to_string(tie.layer) + "'s " + tie.param + " (\"tied_to\": " + std::to_string(tie.layer) +
          "), which is not in the stage of layers " + range_str(begin_, end_) +
          ": a model with tied weights cannot be cut between the two layers yet; train it on one device "
          "(--local, or --devices 1) or untie it (remove \"tied_to\" from the model file)");
    const Layer& owner = *layers_[static_cast<size_t>(tie.layer - begin_)];
    for (const auto& p : owner.param_info()) {
      if (p.name != tie.param) continue;
      const int64_t at = offsets_[static_cast<size_t>(tie.layer - begin_)] + p.offset;
      layers_[l]->bind_tied(Tensor::view(params_, at, p.shape), Tensor::view(grads_, at, p.shape));
    }
  }
}

void Partition::init(uint64_t seed) {
  if (!params_.defined()) return;
  std::vector<float> host(static_cast<size_t>(params_.numel()));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int64_t n = layers_[l]->param_count();
    if (n == 0) continue;
    Rng rng(derive_seed(seed, static_cast<uint64_t>(begin_ + static_cast<int>(l))));
    layers_[l]->init(rng, std::span<float>(host.data() + offsets_[l], static_cast<size_t>(n)));
  }
  device_->upload(params_, host.data());
}

void Partition::zero_grad() {
  if (grads_.defined()) device_->fill(grads_, 0.0f);
}

Tensor Partition::forward(const Tensor& x, int microbatch, bool training, uint64_t seed) {
  const std::string where = "partition " + range_str(begin_, end_) + " forward input";
  nn_detail::check_batch_shape(where.c_str(), x, input_shape());
  if (&x.device() != device_)
    throw std::invalid_argument("partition " + range_str(begin_, end_) + ": input lives on another device");
  if (training && stash_.count(microbatch))
    throw std::logic_error("partition " + range_str(begin_, end_) + ": micro-batch " + std::to_string(microbatch) +
                           " already has a pending forward (run its backward first)");
  Stash s = run_layers(x, training, training && !recompute_, seed);
  Tensor out = s.acts.back();
  if (training) {
    if (recompute_) s.acts.resize(1);  // the input and the seed: backward runs the layers again
    stash_.emplace(microbatch, std::move(s));
  }
  return out;
}

Partition::Stash Partition::run_layers(const Tensor& x, bool training, bool keep_all, uint64_t seed) {
  const int64_t batch = x.dim(0);
  Stash s;
  s.seed = seed;
  s.acts.reserve(keep_all ? layers_.size() + 1 : 2);
  s.contexts.resize(layers_.size());
  s.acts.push_back(x);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int global = begin_ + static_cast<int>(l);
    Tensor y(*device_, nn_detail::with_batch(batch, spec_.shapes[static_cast<size_t>(global + 1)]));
    s.contexts[l].seed = derive_seed(seed, static_cast<uint64_t>(global));
    layers_[l]->forward(s.acts.back(), y, s.contexts[l], training);
    if (keep_all) {
      s.acts.push_back(std::move(y));
    } else {
      // Only the latest activation (and the input, which the stash keeps).
      if (s.acts.size() == 2) s.acts.back() = std::move(y); else s.acts.push_back(std::move(y));
      s.contexts[l].saved.clear();
    }
  }
  if (!keep_all) s.contexts.clear();
  return s;
}

Partition::Stash Partition::take_stash(const Tensor& dy, int microbatch, const char* pass) {
  auto it = stash_.find(microbatch);
  if (it == stash_.end())
    throw std::logic_error("partition " + range_str(begin_, end_) + ": " + pass + " for micro-batch " +
                           std::to_string(microbatch) + " without a pending training forward");
  const int64_t batch = it->second.acts.front().dim(0);
  const std::string where = "partition " + range_str(begin_, end_) + " " + pass + " output gradient";
  nn_detail::check_batch_shape(where.c_str(), dy, output_shape());
  if (dy.dim(0) != batch)
    throw std::invalid_argument(where + ": batch " + std::to_string(dy.dim(0)) + " differs from the forward batch " +
                                std::to_string(batch));
  Stash s = std::move(it->second);
  stash_.erase(it);  // freed whatever happens next
  // Recomputing: the stash holds the input and seed only; run the forward again.
  if (s.contexts.empty()) s = run_layers(s.acts.front(), /*training=*/true, /*keep_all=*/true, s.seed);
  return s;
}

int Partition::first_trained_layer() const {
  size_t l = 0;
  while (l < layers_.size() && layers_[l]->param_count() == 0 && layers_[l]->tie().layer < 0) ++l;
  return begin_ + static_cast<int>(l);
}

// The backward walk both backward and backward_input make: layers last to
// first, each given its output gradient and (unless no one needs it) a dx to
// fill by `pass(l, dy, dx)`, then its output and context released. Without
// need_dx, layers before the first one with parameters need no pass at all.
template <class Pass>
Tensor Partition::walk_backward(Stash& s, const Tensor& dy, bool need_dx, Pass&& pass) {
  Tensor grad = dy;
  const size_t stop = need_dx ? 0 : static_cast<size_t>(first_trained_layer() - begin_);
  for (size_t l = layers_.size(); l-- > stop;) {
    const bool want_dx = l > stop || need_dx;
    Tensor dx;
    if (want_dx) dx = Tensor(*device_, s.acts[l].shape());
    pass(l, grad, want_dx ? &dx : nullptr);
    s.acts[l + 1] = Tensor();  // release the output and context of this layer
    s.contexts[l].saved.clear();
    grad = std::move(dx);
  }
  return need_dx ? grad : Tensor();
}

Tensor Partition::backward(const Tensor& dy, int microbatch, bool need_dx) {
  Stash s = take_stash(dy, microbatch, "backward");
  return walk_backward(s, dy, need_dx, [&](size_t l, const Tensor& g, const Tensor* dx) {
    layers_[l]->backward(s.acts[l], s.acts[l + 1], g, dx, s.contexts[l]);
  });
}

Tensor Partition::backward_input(const Tensor& dy, int microbatch, bool need_dx) {
  if (weight_stash_.count(microbatch))
    throw std::logic_error("partition " + range_str(begin_, end_) + ": micro-batch " + std::to_string(microbatch) +
                           " was forwarded again before its backward_weight");
  Stash s = take_stash(dy, microbatch, "backward_input");
  WeightStash w;
  Tensor dx = walk_backward(s, dy, need_dx, [&](size_t l, const Tensor& g, const Tensor* layer_dx) {
    layers_[l]->backward_input(s.acts[l], s.acts[l + 1], g, layer_dx, s.contexts[l]);
    if (layers_[l]->splits_backward()) {  // what its backward_weight needs, until then
      w.layers.push_back(l);
      w.xs.push_back(s.acts[l]);
      w.dys.push_back(g);
      w.contexts.push_back(std::move(s.contexts[l]));
    }
  });
  weight_stash_.emplace(microbatch, std::move(w));
  return dx;
}

void Partition::backward_weight(int microbatch) {
  auto it = weight_stash_.find(microbatch);
  if (it == weight_stash_.end())
    throw std::logic_error("partition " + range_str(begin_, end_) + ": backward_weight for micro-batch " +
                           std::to_string(microbatch) + " without a pending backward_input");
  WeightStash w = std::move(it->second);
  weight_stash_.erase(it);  // freed whatever happens below
  for (size_t i = 0; i < w.layers.size(); ++i) {
    layers_[w.layers[i]]->backward_weight(w.xs[i], w.dys[i], w.contexts[i]);
    w.xs[i] = w.dys[i] = Tensor();
    w.contexts[i].saved.clear();
  }
}

void Partition::set_recompute(bool on) {
  if (in_flight() != 0)
    throw std::logic_error("partition " + range_str(begin_, end_) + ": recomputation changes only between batches (" +
                           std::to_string(in_flight()) + " micro-batches in flight)");
  recompute_ = on;
}

size_t Partition::stash_bytes() const {
  size_t bytes = 0;
  for (const auto& [mb, s] : stash_) {
    for (const auto& t : s.acts) bytes += t.bytes();
    for (const auto& c : s.contexts)
      for (const auto& t : c.saved) bytes += t.bytes();
  }
  for (const auto& [mb, w] : weight_stash_) {
    for (size_t i = 0; i < w.layers.size(); ++i) {
      bytes += w.xs[i].bytes() + w.dys[i].bytes();
      for (const auto& t : w.contexts[i].saved) bytes += t.bytes();
    }
  }
  return bytes;
}

}  // namespace cleave
