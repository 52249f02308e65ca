// dp.cpp: see dp.h.
#include "core/fed/dp.h"

#include <cmath>
#include <random>
#include <stdexcept>

namespace cleave {

void DpSettings::validate() const {
  auto bad = [](const std::string& s) { throw std::invalid_argument(s); };
  if (!std::isfinite(clip) || clip < 0) bad("--dp-clip must be finite and >= 0 (0: no differential privacy)");
  if (!std::isfinite(noise_multiplier) || noise_multiplier < 0) bad("--dp-noise-multiplier must be finite and >= 0");
  if (!(delta > 0 && delta < 1)) bad("--dp-delta must be in (0, 1), got " + std::to_string(delta));
  if (!std::isfinite(target_epsilon) || target_epsilon < 0) bad("--dp-target-epsilon must be finite and >= 0 (0: none)");
  if (enabled()) {
    if (target_epsilon > 0 && noise_multiplier == 0)
      bad("--dp-target-epsilon needs --dp-noise-multiplier above 0: without noise epsilon is infinite after one round");
    return;
  }
  if (noise_multiplier > 0) bad("--dp-noise-multiplier needs --dp-clip C > 0: the noise is scaled to the clip norm");
  if (target_epsilon > 0) bad("--dp-target-epsilon needs --dp-clip and --dp-noise-multiplier");
}

std::string dp_strategy_refusal(FedStrategy s) {
  if (s == FedStrategy::fedavg || s == FedStrategy::fedprox) return "";
  return std::string("--dp-clip needs --strategy fedavg or fedprox, not ") + fed_strategy_name(s) +
         ": the Gaussian noise is calibrated to what one client can add to a sum (at most --dp-clip); " +
         fed_strategy_name(s) + " picks or reorders the updates, so one client can move its result further "
         "and the noise would not cover it";
}

double noise_share_stddev(const DpSettings& dp, int contributors) {
  if (contributors < 1) throw std::invalid_argument("noise shares need at least one contributor");
  return dp.noise_multiplier * dp.clip / std::sqrt(static_cast<double>(contributors));
}

NoiseSource::NoiseSource() {
  std::random_device rd;
  // 256 bits of OS entropy, folded into xoshiro's seed through derive_seed.
  uint64_t w[4];
  for (auto& x : w) x = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  rng_.reseed(derive_seed(w[0], w[1], w[2], w[3]));
}

NoiseSource::NoiseSource(uint64_t seed) : rng_(seed) {}

double NoiseSource::normal() {
  const double u1 = (static_cast<double>(rng_.next_u64() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(rng_.next_u64() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

std::vector<float> dp_average(const std::vector<const ClientUpdate*>& updates, const std::vector<float>& global,
                              const DpSettings& dp, int denominator, NoiseSource& noise,
                              std::vector<std::string>& clipped) {
  if (denominator < static_cast<int>(updates.size()) || denominator < 1)
    throw std::invalid_argument("the DP denominator (" + std::to_string(denominator) +
                                " sampled clients) is below the number of updates (" +
                                std::to_string(updates.size()) + ")");
  const size_t size = global.size();
  std::vector<double> sum(size, 0.0);
  for (const ClientUpdate* u : updates) {
    if (u->params.size() != size)
      throw std::invalid_argument("dp_average: update of " + u->client + " has " + std::to_string(u->params.size()) +
                                  " parameters, the global block " + std::to_string(size));
    double sq = 0;
    for (size_t i = 0; i < size; ++i) {
      const double d = static_cast<double>(u->params[i]) - global[i];
      sq += d * d;
    }
    const double norm = std::sqrt(sq);
    const double scale = norm > dp.clip ? dp.clip / norm : 1.0;
    if (norm > dp.clip) clipped.push_back(u->client);
    for (size_t i = 0; i < size; ++i) sum[i] += (static_cast<double>(u->params[i]) - global[i]) * scale;
  }
  const double stddev = dp.noise_multiplier * dp.clip;
  std::vector<float> out(size);
  for (size_t i = 0; i < size; ++i) {
    const double noisy = stddev > 0 ? sum[i] + stddev * noise.normal() : sum[i];
    out[i] = static_cast<float>(global[i] + noisy / denominator);
  }
  return out;
}

}  // namespace cleave
