// layer_profile.cpp: see layer_profile.h.
#include "core/runtime/daemon/layer_profile.h"

#include <algorithm>
#include <chrono>

#include "core/model/partition.h"
#include "core/util/rng.h"

namespace cleave {

std::vector<double> profile_layers(Device& device, const ModelSpec& spec, int64_t samples, int repetitions) {
  std::vector<double> out;
  Rng rng(12345);
  for (int i = 0; i < spec.num_layers(); ++i) {
    try {
      Partition part(device, spec, i, i + 1);
      part.init(1);
      Shape xs = spec.shapes[i];
      xs.insert(xs.begin(), samples);
      Tensor x(device, xs);
      std::vector<float> host(static_cast<size_t>(x.numel()));
      // A token embedding reads class indices (bytes of a text); any other layer activations.
      const nlohmann::json& layer = spec.layers[static_cast<size_t>(i)];
      const int64_t vocabulary = layer.value("type", "") == "embedding" ? layer.value("num_embeddings", int64_t{0}) : 0;
      for (auto& v : host)
        v = vocabulary > 0 ? static_cast<float>(std::min<int64_t>(vocabulary - 1, static_cast<int64_t>(rng.uniform(0.f, 1.f) * vocabulary)))
                           : rng.uniform(-1.f, 1.f);
      x.from_host(host);
      Shape ys = spec.shapes[i + 1];
      ys.insert(ys.begin(), samples);
      Tensor dy(device, ys);
      device.fill(dy, 0.01f);
      std::vector<double> times;
      for (int r = 0; r <= repetitions; ++r) {  // r == 0 warms up
        const auto t0 = std::chrono::steady_clock::now();
        part.forward(x, 0, /*training=*/true, 1);
        part.backward(dy, 0, /*need_dx=*/true);
        device.synchronize();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) times.push_back(s);
      }
      std::sort(times.begin(), times.end());
      out.push_back(times[times.size() / 2] / static_cast<double>(samples));
    } catch (const OutOfMemory&) {
      out.push_back(-1);
    }
  }
  return out;
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
