// shard.h: splitting a dataset across federated clients.
//
// Every client computes the same assignment of samples to shards from
// (dataset, num_shards, partition, seed) and keeps its own shard, so shards
// never overlap and together cover the dataset. The arithmetic uses only
// IEEE-754 +, -, *, / and sqrt (no libm log/exp/pow, whose last bits differ
// between C libraries), so clients on different machines agree exactly.
//
// Partitions:
//   "iid"              a seeded permutation cut into num_shards near-equal runs
//                      (sizes differ by at most one)
//   "dirichlet:ALPHA"  label skew: for each class, shard proportions are drawn
//                      from Dirichlet(ALPHA, ..., ALPHA) and that class's
//                      samples (shuffled) are cut in those proportions. Small
//                      ALPHA (0.1) gives each shard few classes; large ALPHA
//                      (100) approaches iid. A shard may be empty.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/data/dataset.h"

namespace cleave {

enum class ShardKind { iid, dirichlet };

struct ShardScheme {
  ShardKind kind = ShardKind::iid;
  double alpha = 0.0;  // Dirichlet concentration (> 0) for ShardKind::dirichlet
};

// Parses "iid" or "dirichlet:ALPHA"; throws std::invalid_argument naming the
// problem ("dirichlet:abc", alpha <= 0, an unknown kind).
ShardScheme parse_shard_scheme(const std::string& partition);

// Every shard at once: element s holds the sample indices of shard s in
// ascending order. Throws std::invalid_argument for num_shards < 1 or a bad
// partition string, std::runtime_error when "dirichlet" meets a dataset
// without class labels (num_classes == 0) or labels outside [0, num_classes).
std::vector<std::vector<int64_t>> all_shards(const Dataset& data, int num_shards, const std::string& partition,
                                             uint64_t seed);

// The sample indices (ascending) of shard `shard` in [0, num_shards): the
// same as all_shards(...)[shard]. Throws std::invalid_argument for a shard out
// of range, plus all_shards' errors.
std::vector<int64_t> shard_indices(const Dataset& data, int shard, int num_shards, const std::string& partition,
                                   uint64_t seed);

// Portable natural log / exp used by the Dirichlet sampler (exposed for tests):
// within a few ulp of std::log / std::exp, bit-identical on every IEEE-754 machine.
double portable_log(double x);  // x > 0 and finite
double portable_exp(double x);  // x <= 709

}  // namespace cleave
