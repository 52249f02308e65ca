// Tests for load_text (--text): the 90/10 byte split, training windows drawn
// by the seeded loader (targets shifted by one, distinct per epoch, the same
// for the same seed), fixed validation windows, limits and too-short files.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "fixtures.h"

using namespace cleave;

namespace {

// n bytes, byte i = (i * 7 + i / 256) % 256: every window differs from its neighbours.
std::string pattern_bytes(int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s.push_back(static_cast<char>((i * 7 + i / 256) % 256));
  return s;
}

float byte_at(const std::string& s, int64_t i) { return static_cast<float>(static_cast<unsigned char>(s[i])); }

}  // namespace

TEST_CASE("text: the first 90% of the bytes train, the last 10% validate", "[data][text]") {
  test::TempDir dir;
  const std::string path = dir.file("t.txt"), bytes = pattern_bytes(1003);  // cut at floor(902.7) = 902
  test::write_text(path, bytes);
  const Dataset train = load_text(path, 8, /*train=*/true);
  REQUIRE(train.text);
  CHECK(train.text->size() == 902);
  CHECK(train.size() == 902 - 8);        // every offset whose window and next byte fit
  CHECK(train.epoch_samples == 902 / 8);  // an epoch: about one pass over the training bytes
  CHECK(train.sample_shape == Shape{8});
  CHECK(train.target_shape == Shape{8});
  CHECK(train.num_classes == 256);
  check_dataset(train);

  const Dataset val = load_text(path, 8, /*train=*/false);
  REQUIRE(val.text);
  CHECK(val.x.empty());  // windows of the bytes, not floats
  CHECK(val.size() == (101 - 1) / 8);  // 12 non-overlapping windows of the 101 validation bytes
  CHECK(val.text->size() == 12 * 8 + 1);  // only the bytes they cover
  check_dataset(val);
  // Window w: validation bytes [8w, 8w + 8), targets one byte later.
  std::vector<float> x(8), y(8);
  for (int64_t w = 0; w < val.size(); ++w) {
    val.copy_sample(w, x.data(), y.data());
    for (int64_t t = 0; t < 8; ++t) {
      CHECK(x[t] == byte_at(bytes, 902 + w * 8 + t));
      CHECK(y[t] == byte_at(bytes, 902 + w * 8 + t + 1));
    }
  }
  const Dataset limited = load_text(path, 8, false, 5);  // --limit-test
  CHECK(limited.size() == 5);
  CHECK(limited.text->size() == 5 * 8 + 1);
  CHECK(load_text(path, 8, false, 0).size() == 0);
  CHECK(load_text(path, 8, true, 40).epoch_samples == 40);  // --limit-train: windows per epoch
  CHECK(load_text(path, 8, true, 5000).epoch_samples == 902 - 8);  // capped at the windows there are
}

TEST_CASE("text: training windows are seeded, distinct in an epoch, targets shifted by one", "[data][text]") {
  test::TempDir dir;
  const std::string path = dir.file("t.txt"), bytes = pattern_bytes(5000);
  test::write_text(path, bytes);
  const Dataset train = load_text(path, 16, true);
  const int64_t per_epoch = 4500 / 16;
  BatchLoader a(train, 10, /*shuffle=*/true, 7), b(train, 10, true, 7), c(train, 10, true, 8);
  CHECK(a.samples_per_epoch() == per_epoch);
  CHECK(a.batches_per_epoch() == (per_epoch + 9) / 10);
  std::set<int64_t> offsets;
  for (int64_t k = 0; k < per_epoch; ++k) offsets.insert(a.order()[k]);
  CHECK(static_cast<int64_t>(offsets.size()) == per_epoch);
  CHECK(*offsets.rbegin() <= 4500 - 16 - 1);  // the last target byte is still a training byte

  const Batch first = a.get(0);
  REQUIRE(first.size == 10);
  CHECK(first.x_shape == Shape{10, 16});
  REQUIRE(first.y.size() == 160);
  for (int64_t k = 0; k < 10; ++k) {
    const int64_t o = a.order()[k];
    for (int64_t t = 0; t < 16; ++t) {
      CHECK(first.x[k * 16 + t] == byte_at(bytes, o + t));
      CHECK(first.y[k * 16 + t] == byte_at(bytes, o + t + 1));
    }
  }
  const Batch last = a.get(a.batches_per_epoch() - 1);
  CHECK(last.size == per_epoch - 10 * (a.batches_per_epoch() - 1));
  CHECK(b.get(3).x == a.get(3).x);  // same seed, same windows
  CHECK(c.get(3).x != a.get(3).x);  // another seed, other windows
  const std::vector<float> epoch0 = a.get(0).x;
  a.start_epoch(1);
  CHECK(a.get(0).x != epoch0);  // each epoch draws its own windows
}

TEST_CASE("text: a file too short for a window, missing, or a directory is refused naming it", "[data][text]") {
  test::TempDir dir;
  const std::string path = dir.file("short.txt");
  test::write_text(path, pattern_bytes(60));  // 54 train bytes, 6 validation bytes
  CHECK(load_text(path, 8, true).size() == 54 - 8);
  CHECK_THROWS_WITH(load_text(path, 8, false), Catch::Contains("short.txt") && Catch::Contains("validation") &&
                                                   Catch::Contains("at least 9"));
  CHECK_THROWS_WITH(load_text(path, 64, true), Catch::Contains("training") && Catch::Contains("context 64"));
  CHECK_THROWS_WITH(load_text(dir.file("none.txt"), 8, true), Catch::Contains("none.txt"));
  CHECK_THROWS_WITH(load_text(dir.str(), 8, true), Catch::Contains(dir.str()) && Catch::Contains("not a regular file"));
}

TEST_CASE("text: subset materialises windows", "[data][text]") {
  test::TempDir dir;
  const std::string path = dir.file("t.txt"), bytes = pattern_bytes(500);
  test::write_text(path, bytes);
  const Dataset train = load_text(path, 4, true);
  const Dataset s = subset(train, {3, 100});
  CHECK_FALSE(s.text);
  REQUIRE(s.size() == 2);
  CHECK(s.x[4] == byte_at(bytes, 100));
  CHECK(s.y[7] == byte_at(bytes, 104));
  check_dataset(s);
}
