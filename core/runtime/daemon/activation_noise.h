// activation_noise.h: local differential privacy for the cut layer of split
// learning (`cleave split --activation-noise SIGMA --activation-clip C`, issue 18).
//
// Before a split client's cut-layer activation leaves the device, each
// sample's row (the activation of one sample, flattened) is clipped to L2 norm
// C and Gaussian noise of standard deviation SIGMA*C is added to every value:
//   released_i = a_i * s_i + N(0, (SIGMA C)^2 I),   s_i = min(1, C / ||a_i||).
// One sample's row can move by at most 2C (replace it by any other row), so
// each release is a Gaussian mechanism with noise multiplier SIGMA / 2 for that
// sample (docs/privacy.md, "Local DP for split learning").
//
// The noise comes from NoiseSource (core/fed/dp.h): seeded from the operating
// system, never from --seed.
#pragma once

#include <cstdint>
#include <vector>

#include "core/fed/dp.h"

namespace cleave {

// Clips every row of `values` (rows of `row_size` floats, values.size() a
// multiple of it) to L2 norm `clip`, in place; returns each row's scale
// min(1, clip / norm) (1 for a row already within the clip, a zero row too).
// Throws std::invalid_argument for a row_size < 1, a size that is not a whole
// number of rows, or a clip that is not finite and positive.
std::vector<float> clip_rows(std::vector<float>& values, int64_t row_size, float clip);

// clip_rows, then N(0, (sigma * clip)^2) added to every value from `noise`.
// Returns the rows' scales (for scale_rows on the way back). Throws as
// clip_rows does, and for a sigma that is negative or not finite.
std::vector<float> clip_and_noise(std::vector<float>& values, int64_t row_size, float clip, float sigma,
                                  NoiseSource& noise);

// Multiplies row i of `values` by scales[i], in place: the gradient through
// the clip when each row's scale is held constant. Throws std::invalid_argument
// when the rows and the scales do not match.
void scale_rows(std::vector<float>& values, int64_t row_size, const std::vector<float>& scales);

}  // namespace cleave
