// activation_noise.cpp: clip and noise for the cut layer; see activation_noise.h.
#include "core/runtime/daemon/activation_noise.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace cleave {

namespace {

int64_t row_count(const std::vector<float>& values, int64_t row_size) {
  if (row_size < 1) throw std::invalid_argument("activation rows must hold at least one value");
  const auto n = static_cast<int64_t>(values.size());
  if (n % row_size != 0)
    throw std::invalid_argument(std::to_string(n) + " activation values are not whole rows of " +
                                std::to_string(row_size));
  return n / row_size;
}

}  // namespace

std::vector<float> clip_rows(std::vector<float>& values, int64_t row_size, float clip) {
  if (!std::isfinite(clip) || !(clip > 0)) throw std::invalid_argument("the activation clip must be finite and positive");
  const int64_t rows = row_count(values, row_size);
  std::vector<float> scales(static_cast<size_t>(rows), 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = values.data() + r * row_size;
    double sq = 0;  // in double: a 1024-value row of large activations stays exact enough
    for (int64_t k = 0; k < row_size; ++k) sq += static_cast<double>(row[k]) * row[k];
    const double norm = std::sqrt(sq);
    if (norm <= clip) continue;  // within the clip (a zero row too): untouched
    const auto s = static_cast<float>(clip / norm);
    for (int64_t k = 0; k < row_size; ++k) row[k] *= s;
    scales[static_cast<size_t>(r)] = s;
  }
  return scales;
}

std::vector<float> clip_and_noise(std::vector<float>& values, int64_t row_size, float clip, float sigma,
                                  NoiseSource& noise) {
  if (!std::isfinite(sigma) || sigma < 0) throw std::invalid_argument("the activation noise must be finite and >= 0");
  std::vector<float> scales = clip_rows(values, row_size, clip);
  const double stddev = static_cast<double>(sigma) * clip;
  if (stddev > 0)
    for (float& v : values) v = static_cast<float>(v + stddev * noise.normal());
  return scales;
}

void scale_rows(std::vector<float>& values, int64_t row_size, const std::vector<float>& scales) {
  const int64_t rows = row_count(values, row_size);
  if (rows != static_cast<int64_t>(scales.size()))
    throw std::invalid_argument("a gradient of " + std::to_string(rows) + " rows for an activation of " +
                                std::to_string(scales.size()));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scales[static_cast<size_t>(r)];
    if (s == 1.0f) continue;
    float* row = values.data() + r * row_size;
    for (int64_t k = 0; k < row_size; ++k) row[k] *= s;
  }
}

}  // namespace cleave
