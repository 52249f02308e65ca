// profile.cpp: per-layer profiles from a ModelSpec, and cluster lookups.
#include "core/planner/profile.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/model/model_spec.h"
#include "core/nn/layer.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"

namespace cleave {

ModelProfile profile_model(const ModelSpec& spec, const std::string& optimizer_kind, double momentum) {
  const int state_mult = optimizer_state_count(optimizer_kind, momentum);
  ModelProfile p;
  p.name = spec.name;
  p.optimizer = optimizer_kind;
  p.input_bytes_per_sample = numel(spec.input) * 4;
  // nn/loss.cpp: targets (target_shape: one class index per row, one per
  // position for a sequence, or the output's shape for mse) and the loss per
  // row (per position for a sequence); cross-entropy adds the argmax hits.
  const Shape& out = spec.shapes.back();
  const bool xent = spec.loss == LossKind::cross_entropy;
  const int64_t positions = xent && out.size() == 2 ? out[0] : 1;
  p.loss_bytes_per_sample = 4 * (numel(target_shape(spec.loss, out)) + positions + (xent ? positions : 0));
  for (int i = 0; i < spec.num_layers(); ++i) {
    const Shape& in = spec.shapes[i];
    std::unique_ptr<Layer> layer = make_layer(spec.layers[i], in);
    LayerProfile l;
    l.type = layer->type();
    l.fwd_flops = layer->flops_per_sample(in);
    l.param_count = layer->param_count();
    l.bwd_flops = l.param_count > 0 ? 2 * l.fwd_flops : l.fwd_flops;
    // A layer that splits its backward computes its weight gradient in W:
    // about the forward's FLOPs again (dW beside dX), half its backward.
    l.weight_grad_flops = layer->splits_backward() ? l.bwd_flops / 2 : 0;
    l.param_bytes = 4 * l.param_count;
    l.grad_bytes = l.param_bytes;
    l.optimizer_state_bytes = state_mult * l.param_bytes;
    l.out_act_bytes = 4 * numel(spec.shapes[i + 1]);
    l.stash_bytes = 4 * (numel(in) + layer->saved_floats_per_sample(in));
    l.workspace_bytes = 4 * layer->workspace_floats_per_sample(in);
    l.workspace_for = [shared = std::shared_ptr<const Layer>(std::move(layer)), in](int64_t samples, Backend backend) {
      return shared->workspace_bytes(in, samples, backend);
    };
    p.layers.push_back(std::move(l));
  }
  return p;
}

LayerTimeFit fit_layer_times(int64_t small, const std::vector<double>& per_sample_small, int64_t large,
                             const std::vector<double>& per_sample_large) {
  if (small < 1 || large <= small || per_sample_small.size() != per_sample_large.size())
    throw std::invalid_argument("fit_layer_times: need 1 <= small < large and one time per layer at each size");
  LayerTimeFit fit;
  for (size_t l = 0; l < per_sample_large.size(); ++l) {
    const double a = per_sample_small[l], b = per_sample_large[l];
    const bool a_ok = std::isfinite(a) && a >= 0, b_ok = std::isfinite(b) && b >= 0;
    if (!a_ok || !b_ok) {  // keep what was measured at the small size: the large one did not fit, or neither did
      fit.per_sample.push_back(a);
      fit.per_microbatch.push_back(0);
      continue;
    }
    const double ta = a * static_cast<double>(small), tb = b * static_cast<double>(large);  // seconds per micro-batch
    const double slope = (tb - ta) / static_cast<double>(large - small);
    const double fixed = std::clamp(ta - slope * static_cast<double>(small), 0.0, ta);
    fit.per_microbatch.push_back(fixed);
    fit.per_sample.push_back(std::max(0.0, (tb - fixed) / static_cast<double>(large)));
  }
  return fit;
}

int Cluster::index_of(const std::string& name) const {
  for (int i = 0; i < num_devices(); ++i)
    if (devices[i].name == name) return i;
  return -1;
}

const LinkProfile& Cluster::link(int from, int to) const {
  auto it = links.find({from, to});
  return it == links.end() ? default_link : it->second;
}

}  // namespace cleave
