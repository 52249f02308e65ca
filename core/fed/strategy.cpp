// strategy.cpp: see strategy.h.
#include "core/fed/strategy.h"

#include "core/fed/dp.h"
#include "core/fed/krum.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <sstream>
#include <stdexcept>

namespace cleave {

FedStrategy parse_fed_strategy(const std::string& name) {
  if (name == "fedavg") return FedStrategy::fedavg;
  if (name == "fedprox") return FedStrategy::fedprox;
  if (name == "median") return FedStrategy::median;
  if (name == "trimmed-mean") return FedStrategy::trimmed_mean;
  if (name == "krum") return FedStrategy::krum;
  if (name == "multi-krum") return FedStrategy::multi_krum;
  throw std::invalid_argument("unknown strategy '" + name +
                              "': use fedavg, fedprox, median, trimmed-mean, krum or multi-krum");
}

const char* fed_strategy_name(FedStrategy s) {
  switch (s) {
    case FedStrategy::fedavg: return "fedavg";
    case FedStrategy::fedprox: return "fedprox";
    case FedStrategy::median: return "median";
    case FedStrategy::trimmed_mean: return "trimmed-mean";
    case FedStrategy::krum: return "krum";
    case FedStrategy::multi_krum: return "multi-krum";
  }
  return "?";
}

std::optional<UpdateRefusal> refuse_update(const ClientUpdate& u, const UpdateBounds& b) {
  auto refuse = [](const char* reason, std::string message) {
    return std::optional<UpdateRefusal>(UpdateRefusal{reason, std::move(message)});
  };
  if (u.params.size() != b.expected_size)
    return refuse("wrong_parameter_count", "update has " + std::to_string(u.params.size()) + " parameters, expected " +
                                               std::to_string(b.expected_size));
  if (u.samples <= 0) return refuse("no_samples", "update reports " + std::to_string(u.samples) + " training samples");
  if (b.registered_samples >= 0 && u.samples > b.registered_samples)
    return refuse("sample_count_exceeds_registered",
                  "update reports " + std::to_string(u.samples) + " training samples, more than the " +
                      std::to_string(b.registered_samples) + " its registration allows");
  if (b.cap_samples >= 0 && u.samples > b.cap_samples)
    return refuse("sample_count_exceeds_cap", "update reports " + std::to_string(u.samples) +
                                                  " training samples, more than the coordinator's cap of " +
                                                  std::to_string(b.cap_samples));
  for (size_t i = 0; i < u.params.size(); ++i)
    if (!std::isfinite(u.params[i]))
      return refuse("non_finite_values", "update holds a non-finite value at parameter " + std::to_string(i));
  return std::nullopt;
}

std::string check_update(const ClientUpdate& u, size_t expected_size) {
  const auto why = refuse_update(u, UpdateBounds{expected_size, -1, -1});
  return why ? why->message : "";
}

bool clip_update(std::vector<float>& params, const std::vector<float>& global, double max_norm) {
  if (params.size() != global.size())
    throw std::invalid_argument("clip_update: the update has " + std::to_string(params.size()) +
                                " parameters, the global block " + std::to_string(global.size()));
  double sq = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const double d = static_cast<double>(params[i]) - global[i];
    sq += d * d;
  }
  const double norm = std::sqrt(sq);
  if (!(norm > max_norm)) return false;
  const double scale = max_norm / norm;
  for (size_t i = 0; i < params.size(); ++i)
    params[i] = static_cast<float>(global[i] + (static_cast<double>(params[i]) - global[i]) * scale);
  return true;
}

namespace {

std::string short_number(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

bool trims_something(double t, int64_t k) { return std::floor(t * static_cast<double>(k)) >= 1; }

// Sample-weighted mean in double (two finite values near FLT_MAX stay finite).
std::vector<float> weighted_mean(const std::vector<const ClientUpdate*>& ok, size_t size) {
  double total = 0;
  for (auto* u : ok) total += static_cast<double>(u->samples);
  std::vector<double> acc(size, 0.0);
  for (auto* u : ok) {
    const double w = static_cast<double>(u->samples) / total;
    for (size_t i = 0; i < size; ++i) acc[i] += w * u->params[i];
  }
  return std::vector<float>(acc.begin(), acc.end());
}

// Coordinate-wise median, or mean after cutting `cut` values at each end.
std::vector<float> coordinate_wise(bool median, size_t cut, const std::vector<const ClientUpdate*>& ok, size_t size) {
  const size_t k = ok.size();
  std::vector<float> out(size), column(k);
  for (size_t i = 0; i < size; ++i) {
    for (size_t c = 0; c < k; ++c) column[c] = ok[c]->params[i];
    std::sort(column.begin(), column.end());
    if (median) {
      // The middle pair is added in double: two finite values near FLT_MAX
      // would overflow to inf as a float sum.
      out[i] = k % 2 ? column[k / 2] : static_cast<float>(0.5 * (static_cast<double>(column[k / 2 - 1]) + column[k / 2]));
    } else {
      double s = 0;
      for (size_t c = cut; c < k - cut; ++c) s += column[c];
      out[i] = static_cast<float>(s / static_cast<double>(k - 2 * cut));
    }
  }
  return out;
}

// Uniform mean of the updates Krum selects; their names go to `selected`.
std::vector<float> krum_mean(const std::vector<const ClientUpdate*>& ok, int f, int m, size_t size,
                             std::vector<std::string>& selected) {
  std::vector<const std::vector<float>*> blocks;
  for (auto* u : ok) blocks.push_back(&u->params);
  std::vector<double> acc(size, 0.0);
  const std::vector<size_t> best = krum_select(blocks, f, m);
  for (size_t i : best) {
    selected.push_back(ok[i]->client);
    for (size_t k = 0; k < size; ++k) acc[k] += ok[i]->params[k];
  }
  std::vector<float> out(size);
  for (size_t k = 0; k < size; ++k) out[k] = static_cast<float>(acc[k] / static_cast<double>(best.size()));
  return out;
}

int krum_m_for(FedStrategy strategy, const AggregateOptions& o, int64_t n) {
  if (strategy == FedStrategy::krum) return 1;
  return o.krum_m > 0 ? o.krum_m : static_cast<int>(n) - o.krum_f;
}

}  // namespace

std::string strategy_refusal(FedStrategy strategy, const AggregateOptions& o, int64_t n) {
  if (strategy == FedStrategy::trimmed_mean) return trimmed_mean_refusal(o.trim_fraction, n);
  if (strategy == FedStrategy::krum || strategy == FedStrategy::multi_krum)
    return krum_refusal(static_cast<int>(n), o.krum_f, krum_m_for(strategy, o, n));
  return "";
}

std::string trimmed_mean_refusal(double t, int64_t k) {
  if (trims_something(t, k)) return "";
  const std::string ts = short_number(t), ks = std::to_string(k);
  std::string msg = "--strategy trimmed-mean with --trim " + ts + " over " + ks + " client update(s) trims nothing (floor(" +
                    ts + " x " + ks + ") = 0)";
  if (t > 0) {
    auto n = static_cast<int64_t>(std::ceil(1.0 / t));
    while (n > 1 && trims_something(t, n - 1)) --n;
    while (!trims_something(t, n)) ++n;
    msg += ": --trim " + ts + " needs at least " + std::to_string(n) + " clients";
  } else {
    msg += ": --trim 0 never trims (--strategy fedavg is the plain mean)";
  }
  if (k >= 3) {
    double m = std::ceil(1000.0 / static_cast<double>(k)) / 1000.0;
    while (!trims_something(m, k)) m += 0.001;
    msg += ", and " + ks + " clients need --trim " + short_number(m) + " or more";
  } else {
    msg += ", and no --trim below 0.5 trims " + ks + " client update(s): use --strategy median or more clients";
  }
  return msg;
}

AggregateResult aggregate(FedStrategy strategy, const std::vector<ClientUpdate>& updates, size_t expected_size,
                          double trim_fraction) {
  AggregateOptions o;
  o.trim_fraction = trim_fraction;
  return aggregate(strategy, updates, expected_size, o);
}

AggregateResult aggregate(FedStrategy strategy, const std::vector<ClientUpdate>& updates, size_t expected_size,
                          const AggregateOptions& options) {
  // Written so that NaN fails too (it compares false with everything).
  if (strategy == FedStrategy::trimmed_mean && !(options.trim_fraction >= 0 && options.trim_fraction < 0.5))
    throw std::invalid_argument("trim fraction must be in [0, 0.5), got " + std::to_string(options.trim_fraction));
  const bool clipping = options.max_update_norm > 0;
  if ((clipping || options.dp) && (!options.global || options.global->size() != expected_size))
    throw std::invalid_argument(std::string(clipping ? "a maximum update norm" : "differential privacy") +
                                " needs the round's global block of " + std::to_string(expected_size) + " parameters");
  if (options.dp) {
    if (const std::string why = dp_strategy_refusal(strategy); !why.empty()) throw std::invalid_argument(why);
    if (!options.dp_noise) throw std::invalid_argument("differential privacy needs a noise source");
  }
  AggregateResult r;
  std::vector<const ClientUpdate*> ok;
  std::deque<ClientUpdate> clipped;  // copies of the updates that were scaled (stable addresses)
  for (const auto& u : updates) {
    std::string why = check_update(u, expected_size);
    if (!why.empty()) {
      r.rejected.push_back(u.client + ": " + why);
      continue;
    }
    r.accepted.push_back(u.client);
    ok.push_back(&u);
    if (!clipping) continue;
    ClientUpdate c = u;
    if (!clip_update(c.params, *options.global, options.max_update_norm)) continue;
    clipped.push_back(std::move(c));
    ok.back() = &clipped.back();
    r.clipped.push_back(u.client);
  }
  if (ok.empty()) throw std::runtime_error("no acceptable client update to aggregate (" +
                                           std::to_string(updates.size()) + " received, all rejected)");
  if (const std::string why = strategy_refusal(strategy, options, static_cast<int64_t>(ok.size()));
      !why.empty() && strategy != FedStrategy::trimmed_mean)  // (a trimmed mean that cuts nothing is the mean)
    throw std::invalid_argument(why);
  if (options.dp) {
    r.params = dp_average(ok, *options.global, *options.dp, options.dp_denominator, *options.dp_noise, r.dp_clipped);
  } else if (strategy == FedStrategy::fedavg || strategy == FedStrategy::fedprox) {
    r.params = weighted_mean(ok, expected_size);
  } else if (strategy == FedStrategy::krum || strategy == FedStrategy::multi_krum) {
    r.params = krum_mean(ok, options.krum_f, krum_m_for(strategy, options, static_cast<int64_t>(ok.size())),
                         expected_size, r.selected);
  } else {
    const size_t cut = strategy == FedStrategy::trimmed_mean
                           ? static_cast<size_t>(std::floor(options.trim_fraction * static_cast<double>(ok.size())))
                           : 0;
    r.params = coordinate_wise(strategy == FedStrategy::median, cut, ok, expected_size);
  }
  return r;
}

}  // namespace cleave
