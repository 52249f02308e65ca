// test_dp.cpp: DP-FedAvg's server side (core/fed/dp.h) on small blocks: each
// difference from the global block is clipped to C, summed with uniform
// weights and divided by the fixed denominator (the clients sampled); the
// noise has standard deviation z*C on the sum (z*C/denominator on the mean,
// measured over many coordinates); the strategies that are not a mean are
// refused with DP; the settings are validated; and the noise is not --seed's.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "core/fed/dp.h"
#include "core/fed/strategy.h"

using namespace cleave;
using Catch::Contains;

namespace {

ClientUpdate update(const std::string& client, std::vector<float> params, int64_t samples = 10) {
  ClientUpdate u;
  u.client = client;
  u.params = std::move(params);
  u.samples = samples;
  return u;
}

DpSettings dp(double clip, double z) {
  DpSettings d;
  d.clip = clip;
  d.noise_multiplier = z;
  return d;
}

}  // namespace

TEST_CASE("dp: clipped differences, uniform weights, fixed denominator", "[fed][privacy]") {
  const std::vector<float> global{1.f, 1.f};
  // a's step (3, 4) has norm 5 and is clipped to 1: (0.6, 0.8); b's (0.3, 0) stays.
  // Sample counts do not weigh: the sum is (0.9, 0.8); sampled 3 (one dropped out) -> / 3.
  const std::vector<ClientUpdate> u{update("a", {4.f, 5.f}, 1000), update("b", {1.3f, 1.f}, 1)};
  const DpSettings d = dp(1.0, 0.0);
  AggregateOptions o;
  o.global = &global;
  o.dp = &d;
  o.dp_denominator = 3;
  NoiseSource noise(1);
  o.dp_noise = &noise;
  const AggregateResult r = aggregate(FedStrategy::fedavg, u, 2, o);
  CHECK(r.params[0] == Approx(1.0 + 0.9 / 3));
  CHECK(r.params[1] == Approx(1.0 + 0.8 / 3));
  CHECK(r.dp_clipped == std::vector<std::string>{"a"});
  CHECK(r.accepted.size() == 2);
  // The denominator may not be below the updates that arrived.
  o.dp_denominator = 1;
  CHECK_THROWS_WITH(aggregate(FedStrategy::fedavg, u, 2, o), Contains("below the number of updates"));
}

TEST_CASE("dp: the noise on the mean has standard deviation z*C/denominator", "[fed][privacy]") {
  // 20000 coordinates, every client sends the global block: the result is pure noise / 4.
  const size_t n = 20000;
  const std::vector<float> global(n, 0.f);
  std::vector<ClientUpdate> u;
  for (int i = 0; i < 4; ++i) u.push_back(update(std::string(1, static_cast<char>('a' + i)), global));
  const DpSettings d = dp(0.5, 2.0);  // z*C = 1 on the sum, 0.25 on the mean
  NoiseSource noise;
  std::vector<std::string> clipped;
  std::vector<const ClientUpdate*> ok;
  for (const auto& x : u) ok.push_back(&x);
  const std::vector<float> out = dp_average(ok, global, d, 4, noise, clipped);
  double sum = 0, sq = 0;
  for (float v : out) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  CHECK(std::abs(mean) < 0.01);         // 4 standard errors (0.25 / sqrt(20000) = 0.0018) is 0.007
  CHECK(sd == Approx(0.25).epsilon(0.03));  // the sample sd's relative error is about 1/sqrt(2n) = 0.5%
  CHECK(clipped.empty());
  // Two sources seeded by the OS differ; the same test seed repeats.
  NoiseSource a, b, s1(7), s2(7);
  CHECK(a.normal() != b.normal());
  CHECK(s1.normal() == s2.normal());
  CHECK(noise_share_stddev(d, 4) == Approx(0.5));  // 4 shares of variance 0.25 sum to variance 1
}

TEST_CASE("dp: median, trimmed mean and Krum are refused with the reason", "[fed][privacy]") {
  for (FedStrategy s : {FedStrategy::median, FedStrategy::trimmed_mean, FedStrategy::krum, FedStrategy::multi_krum})
    CHECK_THAT(dp_strategy_refusal(s), Contains("--dp-clip needs --strategy fedavg or fedprox") &&
                                           Contains(fed_strategy_name(s)) && Contains("noise would not cover"));
  CHECK(dp_strategy_refusal(FedStrategy::fedavg).empty());
  CHECK(dp_strategy_refusal(FedStrategy::fedprox).empty());
  const std::vector<float> global{0.f};
  const DpSettings d = dp(1, 1);
  NoiseSource noise(3);
  AggregateOptions o;
  o.global = &global;
  o.dp = &d;
  o.dp_denominator = 1;
  o.dp_noise = &noise;
  CHECK_THROWS_WITH(aggregate(FedStrategy::median, {update("a", {1.f})}, 1, o), Contains("fedavg or fedprox"));
}

TEST_CASE("dp: settings are validated by flag name", "[fed][privacy]") {
  CHECK_NOTHROW(DpSettings{}.validate());
  CHECK_NOTHROW(dp(1, 1.1).validate());
  CHECK_THROWS_WITH(dp(-1, 1).validate(), Contains("--dp-clip"));
  CHECK_THROWS_WITH(dp(0, 1).validate(), Contains("--dp-noise-multiplier needs --dp-clip"));
  DpSettings d = dp(1, 1);
  d.delta = 0;
  CHECK_THROWS_WITH(d.validate(), Contains("--dp-delta must be in (0, 1)"));
  d = dp(1, 0);
  d.target_epsilon = 3;
  CHECK_THROWS_WITH(d.validate(), Contains("--dp-target-epsilon needs --dp-noise-multiplier above 0"));
  d = dp(0, 0);
  d.target_epsilon = 3;
  CHECK_THROWS_WITH(d.validate(), Contains("--dp-target-epsilon needs --dp-clip"));
}
