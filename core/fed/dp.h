// dp.h: client-level differential privacy for FedAvg (DP-FedAvg, McMahan,
// Ramage, Talwar, Zhang 2018, "Learning Differentially Private Recurrent
// Language Models"), issue 18.
//
// Each accepted update's difference from the round's global block g is
// clipped to L2 norm C (the clip); the clipped differences are summed with
// uniform weights (every client counts 1, whatever its sample count: a
// sample-weighted sum would let one client move it by more than C); Gaussian
// noise of standard deviation z*C is added to every coordinate of the sum; and
// the sum is divided by a fixed denominator, the number of clients sampled for
// the round (the fixed-denominator estimator: a client that drops out or is
// refused adds nothing and the denominator stays, so no single client changes
// the result by more than C / denominator):
//   g' = g + (sum_i clip_C(w_i - g) + N(0, (z C)^2 I)) / sampled.
// The accountant (accountant.h) then charges one sampled Gaussian event of
// (q = sampled / live clients, z) per round.
//
// Secure aggregation (not built yet) will have each of the k contributing
// clients add its own share N(0, (z C)^2 / k) before masking, so that the sum
// the coordinator unmasks carries the whole noise (noise_share_stddev).
//
// The noise comes from NoiseSource: xoshiro256** (core/util/rng.h) seeded with
// 256 bits from the operating system (std::random_device, getrandom(2) on
// Linux), never from --seed, so a client that knows the run's flags cannot
// predict it. It is a well-seeded statistical generator, not a cryptographic
// one, and the Gaussian is sampled in floating point (docs/privacy.md says
// what that does not protect against).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/fed/strategy.h"
#include "core/util/rng.h"

namespace cleave {

struct DpSettings {
  double clip = 0;              // C: --dp-clip; > 0 turns DP on
  double noise_multiplier = 0;  // z: --dp-noise-multiplier
  double delta = 1e-5;          // --dp-delta
  double target_epsilon = 0;    // --dp-target-epsilon: > 0 stops before a round would exceed it

  bool enabled() const { return clip > 0; }
  // Throws std::invalid_argument naming the first bad setting (flags by their names).
  void validate() const;
};

// "" when `strategy` can run with DP; otherwise why not (median, trimmed mean
// and Krum pick or reorder updates, so the noise would not cover one client's effect).
std::string dp_strategy_refusal(FedStrategy strategy);

// The standard deviation each of `contributors` clients adds so that the sum carries z*C.
double noise_share_stddev(const DpSettings& dp, int contributors);

// Gaussian noise that clients cannot predict (see the top of this file).
class NoiseSource {
 public:
  NoiseSource();                         // seeded from std::random_device
  explicit NoiseSource(uint64_t seed);   // for tests only: reproducible noise
  double normal();                       // standard normal, Box-Muller in double

 private:
  Rng rng_;
};

// g + (sum of the updates' differences from g clipped to dp.clip + noise) /
// denominator (see the top of this file). Appends to `clipped` the clients
// whose difference was longer than the clip. Throws std::invalid_argument for
// a block of the wrong size or a denominator below the number of updates.
std::vector<float> dp_average(const std::vector<const ClientUpdate*>& updates, const std::vector<float>& global,
                              const DpSettings& dp, int denominator, NoiseSource& noise,
                              std::vector<std::string>& clipped);

}  // namespace cleave
