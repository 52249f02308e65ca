// shard.cpp: iid and Dirichlet label-skew shards. The build compiles this file
// with -ffp-contract=off so no compiler fuses a*b+c differently elsewhere.
#include "core/data/shard.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/data/loader.h"
#include "core/util/rng.h"

namespace cleave {
namespace {

constexpr uint64_t kIidKey = 0x1d1d;
constexpr uint64_t kDirichletKey = 0xd1c1;
constexpr double kLn2 = 0.6931471805599453094;
// ln 2 split so that k * kLn2Hi is exact for |k| < 2^20 (Cody-Waite).
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kSqrtHalf = 0.7071067811865475244;

// Uniform in (0, 1): 53 random bits, never 0.
double open_uniform(Rng& rng) { return (static_cast<double>(rng.next_u64() >> 11) + 0.5) * 0x1.0p-53; }

// Standard normal by the Marsaglia polar method.
double normal(Rng& rng) {
  while (true) {
    const double u = 2.0 * open_uniform(rng) - 1.0;
    const double v = 2.0 * open_uniform(rng) - 1.0;
    const double s = u * u + v * v;
    if (s >= 1.0 || s == 0.0) continue;
    return u * std::sqrt(-2.0 * portable_log(s) / s);
  }
}

// log of a Gamma(alpha, 1) draw (Marsaglia-Tsang; alpha < 1 via the boost
// Gamma(alpha) = Gamma(alpha + 1) * U^(1/alpha), in log space so tiny alphas
// do not underflow).
double log_gamma_draw(double alpha, Rng& rng) {
  if (alpha < 1.0) return log_gamma_draw(alpha + 1.0, rng) + portable_log(open_uniform(rng)) / alpha;
  const double d = alpha - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    const double x = normal(rng);
    const double t = 1.0 + c * x;
    if (t <= 0.0) continue;
    const double v = t * t * t;
    const double u = open_uniform(rng);
    const double x2 = x * x;
    if (u < 1.0 - 0.0331 * x2 * x2) return portable_log(d * v);
    if (portable_log(u) < 0.5 * x2 + d * (1.0 - v + portable_log(v))) return portable_log(d * v);
  }
}

// Dirichlet(alpha, ..., alpha) proportions over k shards.
std::vector<double> dirichlet(double alpha, int k, Rng& rng) {
  std::vector<double> logs(static_cast<size_t>(k));
  for (double& l : logs) l = log_gamma_draw(alpha, rng);
  const double top = *std::max_element(logs.begin(), logs.end());
  double sum = 0.0;
  for (double& l : logs) sum += (l = portable_exp(l - top));
  for (double& l : logs) l /= sum;
  return logs;
}

}  // namespace

double portable_log(double x) {
  int e = 0;
  double m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1): exact
  if (m < kSqrtHalf) {
    m *= 2.0;
    e -= 1;
  }
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double series = 0.0;
  for (int k = 27; k >= 1; k -= 2) series = series * s2 + 1.0 / k;
  return static_cast<double>(e) * kLn2 + 2.0 * s * series;
}

double portable_exp(double x) {
  if (x < -745.5) return 0.0;
  const double k = std::floor(x / kLn2 + 0.5);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;  // |r| <= ~0.35; k * kLn2Hi is exact
  double p = 1.0;
  for (int n = 20; n >= 1; --n) p = 1.0 + p * r / n;
  return std::ldexp(p, static_cast<int>(k));
}

ShardScheme parse_shard_scheme(const std::string& partition) {
  if (partition == "iid") return {ShardKind::iid, 0.0};
  const std::string prefix = "dirichlet";
  if (partition.rfind(prefix, 0) == 0) {
    if (partition.size() == prefix.size() || partition[prefix.size()] != ':' || partition.size() == prefix.size() + 1)
      throw std::invalid_argument("partition '" + partition + "': dirichlet needs an alpha, e.g. 'dirichlet:0.5'");
    const std::string text = partition.substr(prefix.size() + 1);
    double alpha = 0.0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), alpha);
    if (ec != std::errc() || end != text.data() + text.size())
      throw std::invalid_argument("partition '" + partition + "': alpha '" + text + "' is not a number");
    if (!(alpha > 0.0) || !std::isfinite(alpha))
      throw std::invalid_argument("partition '" + partition + "': alpha must be a finite number > 0");
    return {ShardKind::dirichlet, alpha};
  }
  throw std::invalid_argument("unknown partition '" + partition + "': expected 'iid' or 'dirichlet:ALPHA' (e.g. dirichlet:0.5)");
}

std::vector<std::vector<int64_t>> all_shards(const Dataset& data, int num_shards, const std::string& partition,
                                             uint64_t seed) {
  if (num_shards < 1) throw std::invalid_argument("num_shards must be >= 1, got " + std::to_string(num_shards));
  const ShardScheme scheme = parse_shard_scheme(partition);
  const int64_t n = data.size();
  std::vector<int> shard_of(static_cast<size_t>(n), 0);

  if (scheme.kind == ShardKind::iid) {
    const std::vector<int64_t> order = seeded_permutation(n, derive_seed(seed, kIidKey));
    for (int s = 0; s < num_shards; ++s) {
      const int64_t begin = n * s / num_shards;
      const int64_t end = n * (s + 1) / num_shards;
      for (int64_t k = begin; k < end; ++k) shard_of[static_cast<size_t>(order[static_cast<size_t>(k)])] = s;
    }
  } else {
    if (data.num_classes <= 0)
      throw std::runtime_error("partition '" + partition + "' needs class labels, but dataset '" + data.name +
                               "' has none (num_classes = 0)");
    std::vector<std::vector<int64_t>> by_class(static_cast<size_t>(data.num_classes));
    for (int64_t i = 0; i < n; ++i) {
      const float v = data.y[static_cast<size_t>(i)];
      if (!(v >= 0.0f) || v >= static_cast<float>(data.num_classes) || v != std::floor(v))
        throw std::runtime_error("partition '" + partition + "': sample " + std::to_string(i) + " of dataset '" +
                                 data.name + "' has label " + std::to_string(v) + ", not a class in [0, " +
                                 std::to_string(data.num_classes) + ")");
      by_class[static_cast<size_t>(v)].push_back(i);
    }
    for (size_t c = 0; c < by_class.size(); ++c) {
      const std::vector<int64_t>& members = by_class[c];
      const auto count = static_cast<int64_t>(members.size());
      const std::vector<int64_t> order = seeded_permutation(count, derive_seed(seed, kDirichletKey, c, 1));
      Rng rng(derive_seed(seed, kDirichletKey, c, 0));
      const std::vector<double> p = dirichlet(scheme.alpha, num_shards, rng);
      double cumulative = 0.0;
      int64_t begin = 0;
      for (int s = 0; s < num_shards; ++s) {
        cumulative += p[static_cast<size_t>(s)];
        int64_t end = s + 1 == num_shards ? count
                                          : static_cast<int64_t>(std::floor(cumulative * static_cast<double>(count) + 0.5));
        end = std::clamp(end, begin, count);
        for (int64_t k = begin; k < end; ++k)
          shard_of[static_cast<size_t>(members[static_cast<size_t>(order[static_cast<size_t>(k)])])] = s;
        begin = end;
      }
    }
  }

  std::vector<std::vector<int64_t>> shards(static_cast<size_t>(num_shards));
  for (int64_t i = 0; i < n; ++i) shards[static_cast<size_t>(shard_of[static_cast<size_t>(i)])].push_back(i);
  return shards;
}

std::vector<int64_t> shard_indices(const Dataset& data, int shard, int num_shards, const std::string& partition,
                                   uint64_t seed) {
  if (num_shards < 1) throw std::invalid_argument("num_shards must be >= 1, got " + std::to_string(num_shards));
  if (shard < 0 || shard >= num_shards)
    throw std::invalid_argument("shard " + std::to_string(shard) + " is out of range for " +
                                std::to_string(num_shards) + " shards (expected 0.." +
                                std::to_string(num_shards - 1) + ")");
  return std::move(all_shards(data, num_shards, partition, seed)[static_cast<size_t>(shard)]);
}

}  // namespace cleave
