// loader.cpp: BatchLoader and the seeded permutation it uses.
#include "core/data/loader.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/util/rng.h"

namespace cleave {

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n > 0 ? n : 0));
  std::iota(order.begin(), order.end(), int64_t{0});
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::vector<int64_t> seeded_sample(int64_t n, int64_t k, uint64_t seed) {
  if (n < 0 || k < 0 || k > n)
    throw std::invalid_argument("seeded_sample: need 0 <= k <= n, got k = " + std::to_string(k) +
                                ", n = " + std::to_string(n));
  if (k > n - k) {  // 2k > n: a dense shuffle costs at most twice the answer
    std::vector<int64_t> order = seeded_permutation(n, seed);
    order.resize(static_cast<size_t>(k));
    return order;
  }
  // k distinct values by rejection (the set is uniform: the draw is symmetric
  // in the labels), in a random order by Fisher-Yates.
  Rng rng(seed);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(k));
  while (static_cast<int64_t>(out.size()) < k) {
    const auto have = static_cast<std::ptrdiff_t>(out.size());
    while (static_cast<int64_t>(out.size()) < k) out.push_back(static_cast<int64_t>(rng.below(static_cast<uint64_t>(n))));
    std::sort(out.begin() + have, out.end());
    std::inplace_merge(out.begin(), out.begin() + have, out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  for (int64_t i = k - 1; i > 0; --i)
    std::swap(out[static_cast<size_t>(i)], out[static_cast<size_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
  return out;
}

BatchLoader::BatchLoader(const Dataset& data, int64_t batch, bool shuffle, uint64_t seed, bool drop_last)
    : data_(&data), batch_(batch), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  if (batch <= 0) throw std::invalid_argument("BatchLoader: batch size must be > 0, got " + std::to_string(batch));
  check_dataset(data);
  start_epoch(0);
}

int64_t BatchLoader::samples_per_epoch() const {
  const int64_t n = data_->size();
  return data_->epoch_samples >= 0 ? std::min(n, data_->epoch_samples) : n;
}

int64_t BatchLoader::batches_per_epoch() const {
  const int64_t n = samples_per_epoch();
  return drop_last_ ? n / batch_ : (n + batch_ - 1) / batch_;
}

void BatchLoader::start_epoch(int64_t epoch) {
  if (epoch < 0) throw std::invalid_argument("BatchLoader: epoch must be >= 0, got " + std::to_string(epoch));
  if (epoch == epoch_ && ordered_) return;  // the order is a function of (seed, epoch)
  epoch_ = epoch;
  const int64_t k = samples_per_epoch();
  if (shuffle_) {
    order_ = seeded_sample(data_->size(), k, derive_seed(seed_, static_cast<uint64_t>(epoch)));
  } else {
    order_.resize(static_cast<size_t>(k));
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
  ordered_ = true;
}

Batch BatchLoader::get(int64_t index) const {
  const int64_t count = batches_per_epoch();
  if (index < 0 || index >= count)
    throw std::out_of_range("BatchLoader: batch " + std::to_string(index) + " is outside [0, " +
                            std::to_string(count) + ") for " + std::to_string(data_->size()) + " samples in batches of " +
                            std::to_string(batch_));
  const int64_t begin = index * batch_;
  const int64_t end = std::min(begin + batch_, samples_per_epoch());
  const size_t per = static_cast<size_t>(data_->sample_numel()), tper = static_cast<size_t>(data_->target_numel());
  Batch b;
  b.size = end - begin;
  b.x_shape = {b.size};
  b.x_shape.insert(b.x_shape.end(), data_->sample_shape.begin(), data_->sample_shape.end());
  b.x.resize(static_cast<size_t>(b.size) * per);
  b.y.resize(static_cast<size_t>(b.size) * tper);
  data_->copy_samples(order_.data() + begin, b.size, b.x.data(), b.y.data());  // one fetch for a source
  return b;
}

}  // namespace cleave
