// gpt_init.h: GPT-2's initialisation for the transformer layers (internal to core/nn).
//
// Matrices ("...weight" of rank 2, embeddings included) are drawn from N(0, 0.02),
// biases are 0 and LayerNorm weights (rank-1 "...weight") are 1, as in GPT-2,
// nanoGPT and llm.c (without their 1/sqrt(2 layers) scaling of residual projections).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/nn/layer.h"

namespace cleave::nn_detail {

inline void gpt_init(const std::vector<Layer::ParamInfo>& params, Rng& rng, std::span<float> out) {
  for (const Layer::ParamInfo& p : params) {
    const bool weight = p.name.size() >= 6 && p.name.compare(p.name.size() - 6, 6, "weight") == 0;
    const int64_t n = numel(p.shape);
    for (int64_t i = 0; i < n; ++i) {
      float& v = out[static_cast<size_t>(p.offset + i)];
      v = !weight ? 0.0f : p.shape.size() == 1 ? 1.0f : 0.02f * rng.normal();
    }
  }
}

// Prefixes every name of `params` with `prefix` and shifts its offset by `offset`.
inline void append_params(std::vector<Layer::ParamInfo>& out, const std::vector<Layer::ParamInfo>& params,
                          const std::string& prefix, int64_t offset) {
  for (const Layer::ParamInfo& p : params) out.push_back({prefix + p.name, p.shape, offset + p.offset});
}

}  // namespace cleave::nn_detail
