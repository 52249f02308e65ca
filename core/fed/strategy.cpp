// strategy.cpp: see strategy.h.
#include "core/fed/strategy.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace cleave {

FedStrategy parse_fed_strategy(const std::string& name) {
  if (name == "fedavg") return FedStrategy::fedavg;
  if (name == "fedprox") return FedStrategy::fedprox;
  if (name == "median") return FedStrategy::median;
  if (name == "trimmed-mean") return FedStrategy::trimmed_mean;
  throw std::invalid_argument("unknown strategy '" + name + "': use fedavg, fedprox, median or trimmed-mean");
}

const char* fed_strategy_name(FedStrategy s) {
  switch (s) {
    case FedStrategy::fedavg: return "fedavg";
    case FedStrategy::fedprox: return "fedprox";
    case FedStrategy::median: return "median";
    case FedStrategy::trimmed_mean: return "trimmed-mean";
  }
  return "?";
}

std::string check_update(const ClientUpdate& u, size_t expected_size) {
  if (u.params.size() != expected_size)
    return "update has " + std::to_string(u.params.size()) + " parameters, expected " + std::to_string(expected_size);
  if (u.samples <= 0) return "update reports " + std::to_string(u.samples) + " training samples";
  for (size_t i = 0; i < u.params.size(); ++i)
    if (!std::isfinite(u.params[i])) return "update holds a non-finite value at parameter " + std::to_string(i);
  return "";
}

AggregateResult aggregate(FedStrategy strategy, const std::vector<ClientUpdate>& updates, size_t expected_size,
                          double trim_fraction) {
  AggregateResult r;
  std::vector<const ClientUpdate*> ok;
  for (const auto& u : updates) {
    std::string why = check_update(u, expected_size);
    if (why.empty()) {
      ok.push_back(&u);
      r.accepted.push_back(u.client);
    } else {
      r.rejected.push_back(u.client + ": " + why);
    }
  }
  if (ok.empty()) throw std::runtime_error("no acceptable client update to aggregate (" +
                                           std::to_string(updates.size()) + " received, all rejected)");
  r.params.assign(expected_size, 0.f);
  const size_t k = ok.size();
  if (strategy == FedStrategy::fedavg || strategy == FedStrategy::fedprox) {
    double total = 0;
    for (auto* u : ok) total += static_cast<double>(u->samples);
    std::vector<double> acc(expected_size, 0.0);
    for (auto* u : ok) {
      const double w = static_cast<double>(u->samples) / total;
      for (size_t i = 0; i < expected_size; ++i) acc[i] += w * u->params[i];
    }
    for (size_t i = 0; i < expected_size; ++i) r.params[i] = static_cast<float>(acc[i]);
    return r;
  }
  // Written so that NaN fails too (it compares false with everything).
  if (strategy == FedStrategy::trimmed_mean && !(trim_fraction >= 0 && trim_fraction < 0.5))
    throw std::invalid_argument("trim fraction must be in [0, 0.5), got " + std::to_string(trim_fraction));
  const size_t cut = strategy == FedStrategy::trimmed_mean ? static_cast<size_t>(std::floor(trim_fraction * k)) : 0;
  std::vector<float> column(k);
  for (size_t i = 0; i < expected_size; ++i) {
    for (size_t c = 0; c < k; ++c) column[c] = ok[c]->params[i];
    std::sort(column.begin(), column.end());
    if (strategy == FedStrategy::median) {
      // The middle pair is added in double: two finite values near FLT_MAX
      // would overflow to inf as a float sum.
      r.params[i] = k % 2 ? column[k / 2]
                          : static_cast<float>(0.5 * (static_cast<double>(column[k / 2 - 1]) + column[k / 2]));
    } else {
      double s = 0;
      for (size_t c = cut; c < k - cut; ++c) s += column[c];
      r.params[i] = static_cast<float>(s / static_cast<double>(k - 2 * cut));
    }
  }
  return r;
}

}  // namespace cleave
