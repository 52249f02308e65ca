// Tests for the IDX reader, the Fashion-MNIST lookup and load_dataset on IDX
// directories: generated tiny files (plain and gzip, good and broken) and, where
// installed, the real Fashion-MNIST files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>

#include "core/data/dataset.h"
#include "data/fixtures.h"
#include "skip.h"

using namespace cleave;
using cleave::test::idx_bytes;
using cleave::test::image_payload;
using cleave::test::label_payload;
using cleave::test::TempDir;
using cleave::test::write_bytes;
using Catch::Matchers::Contains;

namespace {

// Writes images (n, rows, cols) and labels (n) to dir, gz or not; returns the paths.
std::pair<std::string, std::string> write_pair(const TempDir& dir, const std::string& prefix, uint32_t n, uint32_t rows,
                                               uint32_t cols, uint32_t classes, bool gz) {
  const std::string ext = gz ? ".gz" : "";
  const std::string images = dir.file(prefix + "-images-idx3-ubyte" + ext);
  const std::string labels = dir.file(prefix + "-labels-idx1-ubyte" + ext);
  write_bytes(images, idx_bytes({n, rows, cols}, image_payload(n, rows, cols)), gz);
  write_bytes(labels, idx_bytes({n}, label_payload(n, classes)), gz);
  return {images, labels};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

const Dataset& fashion_train() {
  static const Dataset d = load_fashion_mnist("", true);  // the default lookup, as CLEAVE_SKIP_UNLESS_FASHION_MNIST
  return d;
}

double pixel_sum(const Dataset& d, int64_t sample) {
  const int64_t per = d.sample_numel();
  return std::accumulate(d.x.begin() + sample * per, d.x.begin() + (sample + 1) * per, 0.0);
}

}  // namespace

TEST_CASE("idx: reads plain and gzip files alike", "[data][idx]") {
  TempDir dir;
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    const auto [images, labels] = write_pair(dir, gz ? "gz" : "raw", 5, 3, 4, 3, gz);
    const Dataset d = load_idx(images, labels, "tiny");
    CHECK(d.name == "tiny");
    CHECK(d.size() == 5);
    CHECK(d.sample_shape == Shape{1, 3, 4});
    CHECK(d.num_classes == 3);
    REQUIRE(d.x.size() == 5 * 12);
    for (int k = 0; k < 5; ++k) {
      CHECK(d.y[k] == static_cast<float>(k % 3));
      for (int i = 0; i < 12; ++i) CHECK(d.x[k * 12 + i] == Approx(((k * 7 + i) % 256) / 255.0f));
    }
    CHECK_NOTHROW(check_dataset(d));
  }
}

TEST_CASE("idx: pixels are scaled to [0, 1]", "[data][idx]") {
  TempDir dir;
  write_bytes(dir.file("i"), idx_bytes({1, 1, 3}, {0, 128, 255}), false);
  write_bytes(dir.file("l"), idx_bytes({1}, {0}), false);
  const Dataset d = load_idx(dir.file("i"), dir.file("l"), "px");
  CHECK(d.x[0] == 0.0f);
  CHECK(d.x[1] == Approx(128.0 / 255.0));
  CHECK(d.x[2] == 1.0f);
}

TEST_CASE("idx: limit reads the first samples only", "[data][idx]") {
  TempDir dir;
  const auto [images, labels] = write_pair(dir, "train", 10, 2, 2, 4, true);
  const Dataset all = load_idx(images, labels, "t");
  const Dataset two = load_idx(images, labels, "t", 2);
  CHECK(two.size() == 2);
  CHECK(two.x == std::vector<float>(all.x.begin(), all.x.begin() + 8));
  CHECK(two.y == std::vector<float>{0, 1});
  CHECK(load_idx(images, labels, "t", 0).size() == 0);
  CHECK(load_idx(images, labels, "t", 100).size() == 10);
}

TEST_CASE("idx: other ranks give (features) and (c, h, w) samples", "[data][idx]") {
  TempDir dir;
  write_bytes(dir.file("i2"), idx_bytes({2, 6}, image_payload(2, 1, 6)), false);
  write_bytes(dir.file("i4"), idx_bytes({2, 3, 2, 2}, image_payload(2, 3, 4)), false);
  write_bytes(dir.file("l"), idx_bytes({2}, {1, 0}), false);
  CHECK(load_idx(dir.file("i2"), dir.file("l"), "f").sample_shape == Shape{6});
  CHECK(load_idx(dir.file("i4"), dir.file("l"), "f").sample_shape == Shape{3, 2, 2});
}

TEST_CASE("idx: truncated files are reported with counts", "[data][idx]") {
  TempDir dir;
  std::vector<unsigned char> bytes = idx_bytes({5, 3, 4}, image_payload(5, 3, 4));
  bytes.resize(bytes.size() - 5);  // 4 whole images and part of the fifth
  const std::string labels = dir.file("labels");
  write_bytes(labels, idx_bytes({5}, label_payload(5, 3)), false);

  for (bool gz : {false, true}) {
    CAPTURE(gz);
    const std::string images = dir.file(gz ? "short.gz" : "short");
    write_bytes(images, bytes, gz);
    const std::string msg = error_of([&] { load_idx(images, labels, "t"); });
    CHECK_THAT(msg, Contains(images + ": truncated: header says 5 images of 3x4 but file holds 4"));
    // Only what is needed is read: the first 4 samples are intact.
    CHECK(load_idx(images, labels, "t", 4).size() == 4);
  }

  SECTION("a gzip stream cut short") {
    const std::string whole = dir.file("whole.gz");
    write_bytes(whole, idx_bytes({5, 3, 4}, image_payload(5, 3, 4)), true);
    const auto size = std::filesystem::file_size(whole);
    std::filesystem::resize_file(whole, size - 12);  // drops the gzip trailer and some data
    CHECK_THAT(error_of([&] { load_idx(whole, labels, "t"); }),
               Contains(whole + ": truncated: header says 5 images of 3x4 but file holds "));
  }
  SECTION("corrupt gzip data") {
    const std::string corrupt = dir.file("corrupt.gz");
    write_bytes(corrupt, idx_bytes({5, 3, 4}, image_payload(5, 3, 4)), true);
    std::vector<char> raw(std::filesystem::file_size(corrupt));
    {
      std::ifstream in(corrupt, std::ios::binary);
      in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
    }
    raw[15] = static_cast<char>(0xff);
    {
      std::ofstream out(corrupt, std::ios::binary);
      out.write(raw.data(), static_cast<std::streamsize>(raw.size()));
    }
    const std::string msg = error_of([&] { load_idx(corrupt, labels, "t"); });
    CHECK_THAT(msg, Contains(corrupt + ": read error: corrupt gzip data"));
    CHECK(msg.find(corrupt, corrupt.size()) == std::string::npos);  // the path once, not twice
  }
  SECTION("labels") {
    const std::string images = dir.file("images");
    write_bytes(images, idx_bytes({5, 3, 4}, image_payload(5, 3, 4)), false);
    std::vector<unsigned char> lb = idx_bytes({5}, label_payload(5, 3));
    lb.resize(lb.size() - 2);
    write_bytes(labels, lb, false);
    CHECK_THAT(error_of([&] { load_idx(images, labels, "t"); }),
               Contains(labels + ": truncated: header says 5 labels but file holds 3"));
  }
  SECTION("inside the header") {
    const std::string images = dir.file("hdr");
    write_bytes(images, {0, 0, 8, 3, 0, 0}, false);
    CHECK_THAT(error_of([&] { load_idx(images, labels, "t"); }), Contains(images + ": truncated"));
    write_bytes(images, {0, 0}, false);
    CHECK_THAT(error_of([&] { load_idx(images, labels, "t"); }), Contains("truncated"));
    write_bytes(images, {}, false);
    CHECK_THAT(error_of([&] { load_idx(images, labels, "t"); }), Contains(images + ": empty file"));
  }
}

TEST_CASE("idx: bad magic, wrong rank and wrong element type are refused", "[data][idx]") {
  TempDir dir;
  const auto [images, labels] = write_pair(dir, "ok", 3, 2, 2, 2, false);
  const std::string bad = dir.file("bad");
  write_bytes(bad, {0x1f, 0x8c, 0x08, 0x03, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, false);
  CHECK_THAT(error_of([&] { load_idx(bad, labels, "t"); }), Contains(bad + ": bad magic 0x1F8C0803: not an IDX file"));
  // A label file where images belong (rank 1) and the other way round.
  CHECK_THAT(error_of([&] { load_idx(labels, labels, "t"); }), Contains(labels + ": bad magic 0x00000801"));
  CHECK_THAT(error_of([&] { load_idx(labels, labels, "t"); }), Contains("1 dimension(s), but images need 2 to 4"));
  CHECK_THAT(error_of([&] { load_idx(images, images, "t"); }), Contains(images + ": bad magic 0x00000803"));
  // Float elements (type 0x0D) are not supported.
  write_bytes(bad, idx_bytes({1, 1, 1}, {0, 0, 0, 0}, 0x0D), false);
  CHECK_THAT(error_of([&] { load_idx(bad, labels, "t"); }), Contains("element type 0x0D is not supported"));
  // A zero image dimension.
  write_bytes(bad, idx_bytes({1, 0, 4}, {}), false);
  CHECK_THAT(error_of([&] { load_idx(bad, labels, "t"); }), Contains("dimension 1 of the IDX header is 0"));
  // A directory and a missing file.
  CHECK_THAT(error_of([&] { load_idx(dir.str(), labels, "t"); }), Contains("is a directory"));
  CHECK_THAT(error_of([&] { load_idx(dir.file("nope"), labels, "t"); }), Contains(dir.file("nope") + ": cannot open"));
}

TEST_CASE("idx: image and label counts must match, no trailing data", "[data][idx]") {
  TempDir dir;
  write_bytes(dir.file("i"), idx_bytes({5, 2, 2}, image_payload(5, 2, 2)), true);
  write_bytes(dir.file("l"), idx_bytes({4}, label_payload(4, 2)), true);
  const std::string msg = error_of([&] { load_idx(dir.file("i"), dir.file("l"), "t"); });
  CHECK_THAT(msg, Contains(dir.file("i") + " holds 5 images but " + dir.file("l") + " holds 4 labels"));

  std::vector<unsigned char> payload = image_payload(5, 2, 2);
  payload.push_back(42);
  write_bytes(dir.file("i"), idx_bytes({5, 2, 2}, payload), false);
  write_bytes(dir.file("l"), idx_bytes({5}, label_payload(5, 2)), false);
  CHECK_THAT(error_of([&] { load_idx(dir.file("i"), dir.file("l"), "t"); }), Contains("holds more data"));
  CHECK(load_idx(dir.file("i"), dir.file("l"), "t", 5).size() == 5);  // explicit limit reads only what it needs
}

TEST_CASE("load_dataset: a directory of IDX files", "[data][idx]") {
  TempDir dir;
  write_pair(dir, "train", 6, 2, 3, 3, true);
  write_pair(dir, "t10k", 4, 2, 3, 3, false);
  const Dataset train = load_dataset(dir.str(), "", true, -1);
  const Dataset test = load_dataset(dir.str(), "", false, 2);
  CHECK(train.size() == 6);
  CHECK(test.size() == 2);
  CHECK(train.sample_shape == Shape{1, 2, 3});
  CHECK_THAT(train.name, Contains("/train"));
  // Relative to --dataset-dir.
  const std::filesystem::path p(dir.str());
  CHECK(load_dataset(p.filename().string(), p.parent_path().string(), true, 1).size() == 1);

  TempDir only_train;
  write_pair(only_train, "train", 2, 1, 1, 2, false);
  CHECK_THAT(error_of([&] { load_dataset(only_train.str(), "", false, -1); }), Contains("no IDX test split"));
  CHECK_THAT(error_of([&] { load_dataset("no-such-dataset", "", true, -1); }),
             Contains("unknown dataset 'no-such-dataset'"));
  CHECK_THAT(error_of([&] { load_dataset("", "", true, -1); }), Contains("no dataset given"));
}

TEST_CASE("fashion-mnist: lookup order and the not-found message", "[data][fashion]") {
  TempDir empty;
  const std::string msg = error_of([&] { find_fashion_mnist(empty.str()); });
  CHECK_THAT(msg, Contains("Fashion-MNIST not found in " + empty.str()));
  CHECK_THAT(msg, Contains("apt-get install dataset-fashion-mnist"));
  CHECK_THAT(msg, Contains("--dataset-dir"));
  CHECK_THAT(msg, Contains("train-images-idx3-ubyte[.gz]"));

  // A fake Fashion-MNIST (28x28, 10 classes, a few samples) through $CLEAVE_DATA_DIR.
  TempDir fake;
  write_pair(fake, "train", 12, 28, 28, 10, true);
  write_pair(fake, "t10k", 3, 28, 28, 10, false);
  const char* old = std::getenv("CLEAVE_DATA_DIR");
  const std::string saved = old ? old : "";
  ::setenv("CLEAVE_DATA_DIR", fake.str().c_str(), 1);
  CHECK(find_fashion_mnist("") == fake.str());
  const Dataset d = load_fashion_mnist("", true);
  CHECK(d.size() == 12);
  CHECK(d.num_classes == 10);
  CHECK(d.name == "fashion-mnist/train");
  CHECK(load_dataset("fashion-mnist", "", false, -1).size() == 3);
  // The override wins over the environment.
  CHECK_THAT(error_of([&] { find_fashion_mnist(empty.str()); }), Contains(empty.str()));
  ::setenv("CLEAVE_DATA_DIR", empty.str().c_str(), 1);
  CHECK_THAT(error_of([&] { find_fashion_mnist(""); }), Contains("$CLEAVE_DATA_DIR"));
  if (old) ::setenv("CLEAVE_DATA_DIR", saved.c_str(), 1);
  else ::unsetenv("CLEAVE_DATA_DIR");

  // Not 28x28: refused.
  TempDir wrong;
  write_pair(wrong, "train", 2, 4, 4, 10, false);
  write_pair(wrong, "t10k", 2, 4, 4, 10, false);
  CHECK_THAT(error_of([&] { load_fashion_mnist(wrong.str(), true); }), Contains("must be 28x28"));
}

TEST_CASE("fashion-mnist: the real train split", "[data][fashion]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const Dataset& d = fashion_train();
  CHECK(d.size() == 60000);
  CHECK(d.sample_shape == Shape{1, 28, 28});
  CHECK(d.num_classes == 10);
  CHECK(d.x.size() == 60000u * 784u);
  std::vector<int> hist(10, 0);
  for (float v : d.y) hist.at(static_cast<size_t>(v))++;
  CHECK(hist == std::vector<int>(10, 6000));
  const std::vector<float> first = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  CHECK(std::vector<float>(d.y.begin(), d.y.begin() + 10) == first);
  // Sample 0 (an ankle boot): pixel byte sum 76247, centre pixel 217; the last sample sums to 16684.
  CHECK(pixel_sum(d, 0) * 255.0 == Approx(76247.0).epsilon(1e-6));
  CHECK(d.x[14 * 28 + 14] * 255.0f == Approx(217.0f));
  CHECK(pixel_sum(d, 59999) * 255.0 == Approx(16684.0).epsilon(1e-6));
  CHECK(*std::min_element(d.x.begin(), d.x.end()) == 0.0f);
  CHECK(*std::max_element(d.x.begin(), d.x.end()) == 1.0f);
}

TEST_CASE("fashion-mnist: the real test split and limit", "[data][fashion]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const Dataset t = load_dataset("fashion-mnist", "", false, -1);
  CHECK(t.size() == 10000);
  CHECK(t.name == "fashion-mnist/test");
  std::vector<int> hist(10, 0);
  for (float v : t.y) hist.at(static_cast<size_t>(v))++;
  CHECK(hist == std::vector<int>(10, 1000));
  CHECK(std::vector<float>(t.y.begin(), t.y.begin() + 10) == std::vector<float>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  CHECK(pixel_sum(t, 0) * 255.0 == Approx(33456.0).epsilon(1e-6));
  CHECK(t.x[14 * 28 + 14] * 255.0f == Approx(110.0f));

  const Dataset head = load_fashion_mnist("", true, 100);
  const Dataset& full = fashion_train();
  CHECK(head.size() == 100);
  CHECK(head.x == std::vector<float>(full.x.begin(), full.x.begin() + 100 * 784));
  CHECK(head.y == std::vector<float>(full.y.begin(), full.y.begin() + 100));
}
