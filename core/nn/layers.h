// layers.h: constructors of the built-in layer types, used by make_layer (registry.cpp).
//
// Each factory reads and validates its layer's JSON fields (through SpecFields)
// and the per-sample input shape `in`, and throws std::invalid_argument naming
// the offending field. The layer keeps `in`: forward/backward check that x is
// (batch, in...). Implementations: linear.cpp, conv2d.cpp, pool2d.cpp,
// activation.cpp, dropout.cpp, flatten.cpp, layernorm.cpp, embedding.cpp, attention.cpp,
// transformer_block.cpp.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "core/nn/layer.h"

namespace cleave::nn_detail {

std::unique_ptr<Layer> make_linear(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_conv2d(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_maxpool2d(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_avgpool2d(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_relu(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_gelu(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_tanh(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_dropout(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_flatten(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_layernorm(const nlohmann::json& spec, const Shape& in);
// The transformer's layers: embedding.cpp, attention.cpp, transformer_block.cpp.
std::unique_ptr<Layer> make_embedding(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_position_embedding(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_causal_self_attention(const nlohmann::json& spec, const Shape& in);
std::unique_ptr<Layer> make_transformer_block(const nlohmann::json& spec, const Shape& in);

}  // namespace cleave::nn_detail
