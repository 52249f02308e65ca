// krum.cpp: see krum.h.
#include "core/fed/krum.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace cleave {

std::string krum_refusal(int n, int f, int m) {
  if (f < 0) return "--krum-f must be >= 0, got " + std::to_string(f);
  if (n < 2 * f + 3)
    return "Krum with --krum-f " + std::to_string(f) + " needs at least 2f + 3 = " + std::to_string(2 * f + 3) +
           " client updates per round, got " + std::to_string(n) + ": sample more clients or lower --krum-f (" +
           (n >= 3 ? "at most " + std::to_string((n - 3) / 2) + " for " + std::to_string(n) + " updates)"
                   : "no f works below 3 updates)");
  if (m < 1 || m > n - f)
    return "multi-Krum over " + std::to_string(n) + " updates with --krum-f " + std::to_string(f) +
           " averages 1 to n - f = " + std::to_string(n - f) + " of them, not --krum-m " + std::to_string(m);
  return "";
}

std::vector<size_t> krum_select(const std::vector<const std::vector<float>*>& blocks, int f, int m) {
  const int n = static_cast<int>(blocks.size());
  if (const std::string why = krum_refusal(n, f, m); !why.empty()) throw std::invalid_argument(why);
  const size_t size = blocks[0]->size();
  for (const auto* b : blocks)
    if (b->size() != size) throw std::invalid_argument("krum: updates of different sizes");
  // Pairwise squared distances, in double.
  std::vector<double> d(static_cast<size_t>(n) * static_cast<size_t>(n), 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      double s = 0;
      const float* a = blocks[static_cast<size_t>(i)]->data();
      const float* b = blocks[static_cast<size_t>(j)]->data();
      for (size_t k = 0; k < size; ++k) {
        const double x = static_cast<double>(a[k]) - b[k];
        s += x * x;
      }
      d[static_cast<size_t>(i * n + j)] = d[static_cast<size_t>(j * n + i)] = s;
    }
  const size_t neighbours = static_cast<size_t>(n - f - 2);
  std::vector<double> score(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::vector<double> others;
    for (int j = 0; j < n; ++j)
      if (j != i) others.push_back(d[static_cast<size_t>(i * n + j)]);
    std::partial_sort(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(neighbours), others.end());
    score[static_cast<size_t>(i)] =
        std::accumulate(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(neighbours), 0.0);
  }
  std::vector<size_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  order.resize(static_cast<size_t>(m));
  return order;
}

}  // namespace cleave
