// layer_profile.cpp: see layer_profile.h.
#include "core/runtime/daemon/layer_profile.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/model/partition.h"
#include "core/util/rng.h"
#include "core/util/seconds.h"
#include "core/util/stats.h"

namespace cleave {

namespace {

// A micro-batch of `samples` inputs for layer `i` of `spec`: class indices (bytes
// of a text) for a token embedding, activations in [-1, 1] for any other layer.
Tensor profile_input(Device& device, const ModelSpec& spec, int i, int64_t samples, Rng& rng) {
  Shape xs = spec.shapes[i];
  xs.insert(xs.begin(), samples);
  Tensor x(device, xs);
  std::vector<float> host(static_cast<size_t>(x.numel()));
  const nlohmann::json& layer = spec.layers[static_cast<size_t>(i)];
  const int64_t vocabulary = layer.value("type", "") == "embedding" ? layer.value("num_embeddings", int64_t{0}) : 0;
  for (auto& v : host)
    v = vocabulary > 0 ? static_cast<float>(std::min<int64_t>(vocabulary - 1, static_cast<int64_t>(rng.uniform(0.f, 1.f) * vocabulary)))
                       : rng.uniform(-1.f, 1.f);
  x.from_host(host);
  return x;
}

// The output gradient of layer `i` for `samples` samples.
Tensor profile_gradient(Device& device, const ModelSpec& spec, int i, int64_t samples) {
  Shape ys = spec.shapes[i + 1];
  ys.insert(ys.begin(), samples);
  Tensor dy(device, ys);
  device.fill(dy, 0.01f);
  return dy;
}

// A layer's backward as the schedule runs it: whole, or (zb1) its input
// gradient B and then its weight gradient W, which for some layers (a
// convolution's im2col, done by each) costs more than the fused backward.
Tensor backward_pass(Partition& part, const Tensor& dy, bool split_backward, int mb, bool need_dx) {
  if (!split_backward) return part.backward(dy, mb, need_dx);
  Tensor dx = part.backward_input(dy, mb, need_dx);
  part.backward_weight(mb);
  return dx;
}

// Layers up to the model's first one with parameters are timed as the first
// stage runs them, the only stage that can start with them: that layer
// without its input gradient, those before it with no backward at all
// (Partition::first_trained_layer). `need_dx[i]` says which layers are timed
// with their input gradient.
std::vector<bool> input_gradients_timed(const std::vector<std::unique_ptr<Partition>>& parts) {
  std::vector<bool> need_dx(parts.size(), true);
  for (size_t i = 0; i < parts.size(); ++i) {
    need_dx[i] = false;
    if (parts[i]->first_trained_layer() == parts[i]->begin()) break;
  }
  return need_dx;
}

// Each layer alone: forward and at once backward on the same input, median of
// `repetitions`; -1 where the layer does not fit.
std::vector<double> profile_each_alone(Device& device, const ModelSpec& spec, int64_t samples, int repetitions,
                                       bool split_backward) {
  std::vector<double> out;
  Rng rng(12345);
  bool trained_before = false;  // a layer with parameters came before: input gradients timed (input_gradients_timed)
  for (int i = 0; i < spec.num_layers(); ++i) {
    try {
      Partition part(device, spec, i, i + 1);
      part.init(1);
      const bool need_dx = trained_before;
      trained_before = trained_before || part.first_trained_layer() == i;
      const Tensor x = profile_input(device, spec, i, samples, rng), dy = profile_gradient(device, spec, i, samples);
      std::vector<double> times;
      for (int r = 0; r <= repetitions; ++r) {  // r == 0 warms up
        const auto t0 = std::chrono::steady_clock::now();
        part.forward(x, 0, /*training=*/true, 1);
        backward_pass(part, dy, split_backward, 0, need_dx);
        device.synchronize();
        if (r > 0) times.push_back(seconds_since(t0));
      }
      out.push_back(median(times) / static_cast<double>(samples));
    } catch (const OutOfMemory&) {
      out.push_back(-1);
      trained_before = true;  // unknown: time what follows as any later stage runs it
    }
  }
  return out;
}

// One repetition of the chain: `in_flight` micro-batches forward through every
// layer (each kept for backward, as a stage keeps them), then each backward
// through them in reverse, in the order the forwards ran, layer i with its
// input gradient where need_dx[i] (input_gradients_timed); adds each layer's
// time to `t`.
void run_chain_once(Device& device, std::vector<std::unique_ptr<Partition>>& parts, const Tensor& x, const Tensor& dy,
                    int in_flight, bool split_backward, const std::vector<bool>& need_dx, std::vector<double>& t) {
  const int n = static_cast<int>(parts.size());
  for (int mb = 0; mb < in_flight; ++mb) {
    Tensor h = x;
    for (int i = 0; i < n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      h = parts[static_cast<size_t>(i)]->forward(h, mb, /*training=*/true, 1);
      device.synchronize();
      t[static_cast<size_t>(i)] += seconds_since(t0);
    }
  }
  for (int mb = 0; mb < in_flight; ++mb) {
    Tensor g = dy;
    for (int i = n - 1; i >= 0; --i) {
      Partition& part = *parts[static_cast<size_t>(i)];
      // Before the first layer with parameters nothing flows back; those layers only free their micro-batch.
      if (!g.defined()) g = Tensor(device, batched(x.dim(0), part.output_shape()));
      const auto t0 = std::chrono::steady_clock::now();
      g = backward_pass(part, g, split_backward, mb, need_dx[static_cast<size_t>(i)]);
      device.synchronize();
      t[static_cast<size_t>(i)] += seconds_since(t0);
    }
  }
}

// The whole model as training runs it (run_chain_once), each layer's calls
// timed; per layer the median over the repetitions of its time per sample.
// Empty when the model, with `in_flight` micro-batches kept, does not fit.
std::vector<double> profile_in_chain(Device& device, const ModelSpec& spec, int64_t samples, int repetitions,
                                     bool split_backward, int in_flight) {
  const int n = spec.num_layers();
  try {
    std::vector<std::unique_ptr<Partition>> parts;
    for (int i = 0; i < n; ++i) {
      parts.push_back(std::make_unique<Partition>(device, spec, i, i + 1));
      parts.back()->init(1);
    }
    Rng rng(12345);
    const Tensor x = profile_input(device, spec, 0, samples, rng), dy = profile_gradient(device, spec, n - 1, samples);
    const std::vector<bool> need_dx = input_gradients_timed(parts);
    std::vector<std::vector<double>> times(static_cast<size_t>(n));
    for (int r = 0; r <= repetitions; ++r) {  // r == 0 warms up
      std::vector<double> t(static_cast<size_t>(n), 0.0);
      run_chain_once(device, parts, x, dy, in_flight, split_backward, need_dx, t);
      if (r > 0)
        for (int i = 0; i < n; ++i) times[static_cast<size_t>(i)].push_back(t[static_cast<size_t>(i)]);
    }
    std::vector<double> out;
    for (auto& v : times) out.push_back(median(v) / static_cast<double>(samples * in_flight));
    return out;
  } catch (const OutOfMemory&) {
    return {};
  }
}

}  // namespace

std::vector<double> profile_layers(Device& device, const ModelSpec& spec, int64_t samples, bool split_backward,
                                   int in_flight, int repetitions) {
  if (in_flight < 1 || in_flight > kMaxProfileInFlight)
    throw std::invalid_argument("in_flight " + std::to_string(in_flight) + " is outside 1.." +
                                std::to_string(kMaxProfileInFlight));
  if (in_flight > 1) {  // as many micro-batches per repetition: fewer repetitions time as much work
    std::vector<double> chain =
        profile_in_chain(device, spec, samples, std::max(3, repetitions / in_flight), split_backward, in_flight);
    if (!chain.empty()) return chain;
    device.release_cached_memory();
  }
  std::vector<double> chain = profile_in_chain(device, spec, samples, repetitions, split_backward, 1);
  if (!chain.empty()) return chain;
  device.release_cached_memory();
  return profile_each_alone(device, spec, samples, repetitions, split_backward);
}

double profile_update(Device& device, const OptimizerConfig& optimizer, int64_t params, int repetitions) {
  // Parameters, gradients and up to two state blocks must fit next to each other.
  const int64_t fit = static_cast<int64_t>(device.memory().free / (4 * sizeof(float)) / 2);
  const int64_t n = std::max<int64_t>(1024, std::min(params, fit));
  Tensor p(device, {n}), g(device, {n});
  device.fill(p, 0.5f);
  device.fill(g, 0.01f);
  Optimizer opt(device, optimizer, n);
  std::vector<double> times;
  for (int r = 0; r <= repetitions; ++r) {  // r == 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    opt.step(p, g);
    device.fill(g, 0.0f);  // zero_grad
    device.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) times.push_back(s);
    device.fill(g, 0.01f);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] / static_cast<double>(n);
}

}  // namespace cleave
