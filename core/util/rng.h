// rng.h: small, seedable, reproducible random numbers.
//
// Rng is xoshiro256** seeded through splitmix64, so a given seed gives the same
// stream on every machine and compiler (std::mt19937 is portable, but the
// standard distributions are not). derive() mixes extra keys into a seed, so
// (seed, step, micro-batch, layer) always gives the same dropout mask wherever
// the layer runs.
#pragma once

#include <cmath>
#include <cstdint>

namespace cleave {

inline uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A seed derived from `seed` and up to three keys.
inline uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t x = seed ^ 0x6a09e667f3bcc909ULL;
  uint64_t h = splitmix64(x);
  x = h ^ a; h = splitmix64(x);
  x = h ^ b; h = splitmix64(x);
  x = h ^ c; return splitmix64(x);
}

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) s = splitmix64(x);
  }
  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0]; s_[3] ^= s_[1]; s_[1] ^= s_[2]; s_[0] ^= s_[3];
    s_[2] ^= t; s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 24 bits (exactly representable as float).
  float uniform() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller; one value per call, deterministic).
  float normal() {
    double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;
    double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace cleave
