// test_activation_noise.cpp: the split client's local DP on the cut layer
// (core/runtime/daemon/activation_noise.h): clipping bounds every row's L2
// norm and leaves shorter rows alone, the noise has standard deviation
// SIGMA*C, the gradient is scaled by the same per-row factor, bad settings
// are refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "core/runtime/daemon/activation_noise.h"
#include "core/util/rng.h"

using namespace cleave;

namespace {

double row_norm(const std::vector<float>& v, int64_t row, int64_t row_size) {
  double sq = 0;
  for (int64_t k = 0; k < row_size; ++k) sq += static_cast<double>(v[row * row_size + k]) * v[row * row_size + k];
  return std::sqrt(sq);
}

// `rows` rows of `row_size` values; row r is scaled so that its norm spreads from ~0 to ~4.
std::vector<float> spread_rows(int64_t rows, int64_t row_size, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(rows * row_size));
  for (auto& x : v) x = static_cast<float>(rng.normal());
  for (int64_t r = 0; r < rows; ++r) {
    const double want = 4.0 * static_cast<double>(r) / static_cast<double>(rows);
    const double have = row_norm(v, r, row_size);
    for (int64_t k = 0; k < row_size; ++k) v[r * row_size + k] = static_cast<float>(v[r * row_size + k] * want / have);
  }
  return v;
}

}  // namespace

TEST_CASE("clip_rows bounds every row's L2 norm and leaves shorter rows untouched", "[split][dp]") {
  const int64_t rows = 200, row_size = 37;
  const float clip = 1.5f;
  const std::vector<float> before = spread_rows(rows, row_size, 5);
  std::vector<float> v = before;
  const std::vector<float> scales = clip_rows(v, row_size, clip);
  REQUIRE(scales.size() == rows);
  int clipped = 0, kept = 0;
  for (int64_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    const double n0 = row_norm(before, r, row_size), n1 = row_norm(v, r, row_size);
    CHECK(n1 <= clip * (1 + 1e-6));
    if (n0 <= clip) {  // untouched, bit for bit
      ++kept;
      CHECK(scales[static_cast<size_t>(r)] == 1.0f);
      for (int64_t k = 0; k < row_size; ++k) CHECK(v[r * row_size + k] == before[r * row_size + k]);
    } else {  // on the sphere of radius C, same direction
      ++clipped;
      CHECK(n1 == Approx(clip).epsilon(1e-5));
      CHECK(scales[static_cast<size_t>(r)] == Approx(clip / n0).epsilon(1e-6));
      for (int64_t k = 0; k < row_size; ++k)
        CHECK(v[r * row_size + k] == Approx(before[r * row_size + k] * clip / n0).margin(1e-6));
    }
  }
  CHECK(clipped > 50);  // the rows' norms spread from 0 to 4 around C = 1.5: both kinds are tested
  CHECK(kept > 50);
  std::vector<float> zero(static_cast<size_t>(row_size), 0.0f);
  CHECK(clip_rows(zero, row_size, clip) == std::vector<float>{1.0f});
  CHECK(zero == std::vector<float>(static_cast<size_t>(row_size), 0.0f));
}

TEST_CASE("clip_and_noise adds Gaussian noise of standard deviation SIGMA*C to every value", "[split][dp]") {
  const int64_t rows = 1000, row_size = 100;  // 100k values
  const float clip = 2.0f, sigma = 0.7f;
  const std::vector<float> x = spread_rows(rows, row_size, 9);
  std::vector<float> clipped = x;
  const std::vector<float> want_scales = clip_rows(clipped, row_size, clip);
  std::vector<float> noised = x;
  NoiseSource noise(123);
  CHECK(clip_and_noise(noised, row_size, clip, sigma, noise) == want_scales);
  double sum = 0, sq = 0;
  for (size_t i = 0; i < noised.size(); ++i) {
    const double d = static_cast<double>(noised[i]) - clipped[i];
    sum += d;
    sq += d * d;
  }
  const double n = static_cast<double>(noised.size());
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  const double want = static_cast<double>(sigma) * clip;  // 1.4; sigma alone (0.7) or C alone (2) fail
  // The standard error of the empirical std over 100k values is about 0.2%: 2% fails a wrong scale.
  CHECK(sd == Approx(want).epsilon(0.02));
  CHECK(std::abs(mean) < 5 * want / std::sqrt(n));

  // SIGMA = 0: the clip alone, bit for bit.
  std::vector<float> quiet = x;
  CHECK(clip_and_noise(quiet, row_size, clip, 0.0f, noise) == want_scales);
  CHECK(quiet == clipped);

  // Seeded from the operating system: two sources draw different noise.
  std::vector<float> a = x, b = x;
  NoiseSource os_a, os_b;
  (void)clip_and_noise(a, row_size, clip, sigma, os_a);
  (void)clip_and_noise(b, row_size, clip, sigma, os_b);
  CHECK(a != b);
}

TEST_CASE("scale_rows multiplies each gradient row by its activation row's scale", "[split][dp]") {
  std::vector<float> g = {1, 2, 3, 4, 5, 6};
  scale_rows(g, 3, {0.5f, 1.0f});
  CHECK(g == std::vector<float>{0.5f, 1, 1.5f, 4, 5, 6});
  CHECK_THROWS_WITH(scale_rows(g, 3, {1.0f}), Catch::Contains("2 rows"));
  CHECK_THROWS_WITH(scale_rows(g, 4, {1.0f}), Catch::Contains("not whole rows"));
}

TEST_CASE("clip and noise refuse settings that protect nothing", "[split][dp]") {
  std::vector<float> v = {3, 4};
  NoiseSource noise(1);
  CHECK_THROWS_WITH(clip_rows(v, 2, 0.0f), Catch::Contains("clip"));
  CHECK_THROWS_WITH(clip_rows(v, 2, std::nanf("")), Catch::Contains("clip"));
  CHECK_THROWS_WITH(clip_and_noise(v, 2, 1.0f, -1.0f, noise), Catch::Contains("noise"));
  CHECK_THROWS_WITH(clip_and_noise(v, 2, 1.0f, INFINITY, noise), Catch::Contains("noise"));
  CHECK_THROWS_WITH(clip_rows(v, 0, 1.0f), Catch::Contains("at least one value"));
  CHECK(v == std::vector<float>{3, 4});  // refused before anything was touched
}
