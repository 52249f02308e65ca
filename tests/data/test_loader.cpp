// Tests for BatchLoader: seeded permutations, epoch coverage, partial last
// batches and random access for resumed runs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <set>

#include "core/data/loader.h"
#include "core/util/rng.h"

using namespace cleave;

namespace {

// n samples of shape (2, 3): sample i holds i*10 + j, label i % 7.
Dataset counting_dataset(int64_t n) {
  Dataset d;
  d.name = "count";
  d.sample_shape = {2, 3};
  d.num_classes = 7;
  for (int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < 6; ++j) d.x.push_back(static_cast<float>(i * 10 + j));
    d.y.push_back(static_cast<float>(i % 7));
  }
  return d;
}

bool is_permutation_of_range(const std::vector<int64_t>& v) {
  std::vector<int64_t> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

TEST_CASE("loader: shuffled orders are seeded permutations", "[data][loader]") {
  const Dataset d = counting_dataset(1000);
  BatchLoader a(d, 32, true, 42);
  BatchLoader b(d, 32, true, 42);
  BatchLoader c(d, 32, true, 43);
  CHECK(is_permutation_of_range(a.order()));
  CHECK(a.order() == b.order());
  CHECK(a.order() != c.order());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  CHECK(a.order() != identity);

  const std::vector<int64_t> epoch0 = a.order();
  a.start_epoch(1);
  CHECK(a.epoch() == 1);
  CHECK(is_permutation_of_range(a.order()));
  CHECK(a.order() != epoch0);
  a.start_epoch(0);
  CHECK(a.order() == epoch0);  // a function of (seed, epoch) only
  CHECK(a.order() == seeded_permutation(1000, derive_seed(42, 0)));

  BatchLoader plain(d, 32, false, 42);
  plain.start_epoch(5);
  CHECK(plain.order() == identity);
}

TEST_CASE("loader: batches cover the epoch exactly once", "[data][loader]") {
  const Dataset d = counting_dataset(103);
  BatchLoader loader(d, 10, true, 7);
  loader.start_epoch(3);
  REQUIRE(loader.batches_per_epoch() == 11);
  std::multiset<int64_t> seen;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    const Batch batch = loader.get(b);
    CHECK(batch.size == (b == 10 ? 3 : 10));
    CHECK(batch.x_shape == Shape{batch.size, 2, 3});
    REQUIRE(batch.x.size() == static_cast<size_t>(batch.size * 6));
    REQUIRE(batch.y.size() == static_cast<size_t>(batch.size));
    for (int64_t k = 0; k < batch.size; ++k) {
      const auto sample = static_cast<int64_t>(batch.x[k * 6]) / 10;
      CHECK(sample == loader.order()[b * 10 + k]);
      CHECK(batch.y[k] == static_cast<float>(sample % 7));
      for (int j = 0; j < 6; ++j) CHECK(batch.x[k * 6 + j] == static_cast<float>(sample * 10 + j));
      seen.insert(sample);
    }
  }
  CHECK(seen.size() == 103);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 103);
  CHECK_THROWS_AS(loader.get(11), std::out_of_range);
  CHECK_THROWS_AS(loader.get(-1), std::out_of_range);
}

TEST_CASE("loader: drop_last, resume and bad arguments", "[data][loader]") {
  const Dataset d = counting_dataset(103);
  BatchLoader dropping(d, 10, true, 7, true);
  CHECK(dropping.batches_per_epoch() == 10);
  CHECK(dropping.get(9).size == 10);
  CHECK_THROWS_AS(dropping.get(10), std::out_of_range);

  // A run "resumed" at epoch 2, step 4 sees the same batch as the original.
  BatchLoader original(d, 16, true, 99);
  original.start_epoch(2);
  const Batch expected = original.get(4);
  BatchLoader resumed(d, 16, true, 99);
  resumed.start_epoch(2);
  const Batch got = resumed.get(4);
  CHECK(got.x == expected.x);
  CHECK(got.y == expected.y);

  const Dataset empty = counting_dataset(0);
  CHECK(BatchLoader(empty, 4, true, 1).batches_per_epoch() == 0);
  CHECK(BatchLoader(counting_dataset(3), 8, true, 1, true).batches_per_epoch() == 0);
  CHECK_THROWS_AS(BatchLoader(d, 0, true, 1), std::invalid_argument);
  CHECK_THROWS_AS(original.start_epoch(-1), std::invalid_argument);
  Dataset broken = counting_dataset(4);
  broken.x.pop_back();
  CHECK_THROWS_AS(BatchLoader(broken, 2, true, 1), std::runtime_error);
  Dataset bad_label = counting_dataset(4);
  bad_label.y[2] = 7.0f;
  CHECK_THROWS_AS(BatchLoader(bad_label, 2, true, 1), std::runtime_error);
}

TEST_CASE("loader: seeded samples are distinct, uniform and follow seeded_permutation when dense", "[data][loader]") {
  // Dense (2k > n): the permutation's first k, so a whole epoch is unchanged.
  CHECK(seeded_sample(1000, 1000, 5) == seeded_permutation(1000, 5));
  const std::vector<int64_t> full = seeded_permutation(1000, 5);
  CHECK(seeded_sample(1000, 600, 5) == std::vector<int64_t>(full.begin(), full.begin() + 600));
  CHECK(seeded_sample(7, 0, 5).empty());
  CHECK_THROWS_AS(seeded_sample(10, 11, 5), std::invalid_argument);
  CHECK_THROWS_AS(seeded_sample(10, -1, 5), std::invalid_argument);

  // Sparse (2k <= n): k distinct values in range, a function of the seed.
  const std::vector<int64_t> s = seeded_sample(1000000, 5000, 9);
  REQUIRE(s.size() == 5000);
  CHECK(std::set<int64_t>(s.begin(), s.end()).size() == 5000);
  CHECK(*std::min_element(s.begin(), s.end()) >= 0);
  CHECK(*std::max_element(s.begin(), s.end()) < 1000000);
  CHECK(seeded_sample(1000000, 5000, 9) == s);
  CHECK(seeded_sample(1000000, 5000, 10) != s);
  CHECK(!std::is_sorted(s.begin(), s.end()));  // shuffled, not the sorted set

  // Uniform: over many seeds, every value is drawn and every position holds
  // every value about equally often (n = 10, k = 4: each value in 40% of the
  // samples, each (position, value) 10%).
  const int seeds = 20000;
  std::vector<int> drawn(10, 0), at_first(10, 0);
  for (int seed = 0; seed < seeds; ++seed) {
    const std::vector<int64_t> v = seeded_sample(10, 4, static_cast<uint64_t>(seed));
    REQUIRE(std::set<int64_t>(v.begin(), v.end()).size() == 4);
    for (int64_t x : v) ++drawn[static_cast<size_t>(x)];
    ++at_first[static_cast<size_t>(v[0])];
  }
  for (int x = 0; x < 10; ++x) {
    CHECK(std::abs(drawn[x] / double(seeds) - 0.4) < 0.02);
    CHECK(std::abs(at_first[x] / double(seeds) - 0.1) < 0.015);
  }
}

TEST_CASE("loader: an epoch of a few samples from a huge dataset keeps only those", "[data][loader]") {
  // 2^40 samples held by a source (as a long text's windows would be), an
  // epoch of 1000: the loader must not order all 2^40 (8 TiB of indices).
  Dataset huge;
  huge.name = "huge";
  huge.sample_shape = {1};
  huge.num_classes = 2;
  auto source = std::make_shared<Dataset::Source>();
  source->count = int64_t{1} << 40;
  source->fetch = [](const int64_t* idx, int64_t n, float* x, float* y) {
    for (int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(idx[i] % 1000);
      y[i] = static_cast<float>(idx[i] % 2);
    }
  };
  huge.source = source;
  huge.epoch_samples = 1000;
  BatchLoader loader(huge, 100, true, 3);
  CHECK(loader.samples_per_epoch() == 1000);
  REQUIRE(loader.order().size() == 1000);
  CHECK(std::set<int64_t>(loader.order().begin(), loader.order().end()).size() == 1000);
  CHECK(*std::max_element(loader.order().begin(), loader.order().end()) > (int64_t{1} << 39));  // drawn from all of it
  const Batch b = loader.get(9);
  CHECK(b.size == 100);
  CHECK(b.x[0] == static_cast<float>(loader.order()[900] % 1000));
  const std::vector<int64_t> epoch0 = loader.order();
  loader.start_epoch(1);
  CHECK(loader.order() != epoch0);
  loader.start_epoch(0);
  CHECK(loader.order() == epoch0);

  BatchLoader in_order(huge, 100, false, 3);  // no shuffle: the first 1000
  CHECK(in_order.order().size() == 1000);
  CHECK(in_order.order().back() == 999);
}
