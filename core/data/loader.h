// loader.h: mini-batches of a Dataset, in a reproducible order.
//
// The order of an epoch is a pure function of (seed, epoch): a Fisher-Yates
// shuffle driven by Rng(derive_seed(seed, epoch)), or the identity when
// shuffling is off. An epoch that draws fewer samples than the dataset holds
// (a text's windows, Dataset::epoch_samples) keeps only the samples it draws,
// so its memory and time follow the epoch, not the text (seeded_sample).
// Batches are random access, so a run resumed from a checkpoint at (epoch e,
// step s) calls start_epoch(e) and get(s), get(s+1), ... and sees exactly the
// batches the original run saw.
#pragma once

#include <cstdint>
#include <vector>

#include "core/data/dataset.h"

namespace cleave {

struct Batch {
  std::vector<float> x;  // (size, sample_shape...) row-major
  std::vector<float> y;  // (size, target_shape...): (size) for one target per sample
  int64_t size = 0;
  Shape x_shape;         // (size, sample_shape...)
};

class BatchLoader {
 public:
  // Keeps a reference to `data`, which must outlive the loader. Throws
  // std::invalid_argument for batch <= 0 and std::runtime_error when the
  // dataset is inconsistent (see check_dataset). Starts at epoch 0.
  BatchLoader(const Dataset& data, int64_t batch, bool shuffle, uint64_t seed, bool drop_last = false);

  // The samples an epoch covers: the dataset's size, or its epoch_samples
  // when set (the first of the epoch's order: a text's random windows).
  int64_t samples_per_epoch() const;
  // ceil(samples_per_epoch / batch), or floor with drop_last.
  int64_t batches_per_epoch() const;
  // Sets the sample order for `epoch` (>= 0, else std::invalid_argument).
  void start_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Copies the samples of batch `index` of the current epoch; only the last
  // batch may be smaller (when drop_last is off). Throws std::out_of_range for
  // an index outside [0, batches_per_epoch()).
  Batch get(int64_t index) const;
  // The sample order of the current epoch: samples_per_epoch() distinct
  // indices in [0, size) (a permutation of it when the epoch covers it all).
  const std::vector<int64_t>& order() const { return order_; }
  int64_t batch_size() const { return batch_; }
  const Dataset& dataset() const { return *data_; }

 private:
  const Dataset* data_;
  int64_t batch_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  bool ordered_ = false;  // order_ holds epoch_'s order
  std::vector<int64_t> order_;
};

// [0, n) shuffled by Fisher-Yates with Rng(seed): the same for the same seed
// on every machine.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

// The first k of a seeded random order of [0, n) (0 <= k <= n, else
// std::invalid_argument): seeded_permutation(n, seed)'s first k when 2k > n,
// else k distinct values drawn by Rng(seed) in a random order. Memory and
// time O(k log k) for k << n, O(n) <= O(2k) otherwise; the same on every machine.
std::vector<int64_t> seeded_sample(int64_t n, int64_t k, uint64_t seed);

}  // namespace cleave
