// balance.cpp: see balance.h.
#include "core/planner/balance.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/nn/layer.h"

namespace cleave {

std::vector<int> balance_ranges(const std::vector<double>& costs, int parts) {
  const int n = static_cast<int>(costs.size());
  if (parts < 1 || parts > n)
    throw std::invalid_argument("cannot split " + std::to_string(n) + " layers into " + std::to_string(parts) +
                                " stages: use at most " + std::to_string(n) + " devices");
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: smallest bottleneck covering layers [0, i) with k stages.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        double v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  std::vector<int> bounds(parts + 1);
  bounds[parts] = n;
  for (int k = parts, i = n; k > 0; --k) {
    i = cut[k][i];
    bounds[k - 1] = i;
  }
  return bounds;
}

std::vector<int> balanced_bounds(const ModelSpec& spec, int64_t batch, int parts) {
  std::vector<double> costs;
  for (int i = 0; i < spec.num_layers(); ++i) {
    auto layer = make_layer(spec.layers[i], spec.shapes[i]);
    costs.push_back(3.0 * static_cast<double>(layer->flops_per_sample(spec.shapes[i])) * static_cast<double>(batch) +
                    10.0 * static_cast<double>(layer->param_count()) + 1.0);
  }
  return balance_ranges(costs, parts);
}

}  // namespace cleave
