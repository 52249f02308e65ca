// registry.cpp: make_layer and layer_types — the table from JSON "type" to layer.
//
// make_layer checks what every layer shares (a JSON object, a string "type" that
// is known, a per-sample input of positive dimensions), lets the layer's factory
// check its own fields, then asks the layer for its output shape so a mismatch
// with the input surfaces here rather than in forward().
#include <stdexcept>
#include <utility>

#include "core/nn/layers.h"
#include "core/nn/spec_fields.h"

namespace cleave {

namespace {

using Factory = std::unique_ptr<Layer> (*)(const nlohmann::json&, const Shape&);

// Sorted by name.
const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> table = {
      {"avgpool2d", nn_detail::make_avgpool2d},
      {"causal_self_attention", nn_detail::make_causal_self_attention},
      {"conv2d", nn_detail::make_conv2d},
      {"dropout", nn_detail::make_dropout},
      {"embedding", nn_detail::make_embedding},
      {"flatten", nn_detail::make_flatten},
      {"gelu", nn_detail::make_gelu},
      {"layernorm", nn_detail::make_layernorm},
      {"linear", nn_detail::make_linear},
      {"maxpool2d", nn_detail::make_maxpool2d},
      {"position_embedding", nn_detail::make_position_embedding},
      {"relu", nn_detail::make_relu},
      {"tanh", nn_detail::make_tanh},
      {"transformer_block", nn_detail::make_transformer_block},
  };
  return table;
}

std::string known_list() {
  std::string s;
  for (const auto& [name, factory] : registry()) s += s.empty() ? name : ", " + name;
  return s;
}

}  // namespace

std::vector<std::string> layer_types() {
  std::vector<std::string> out;
  for (const auto& [name, factory] : registry()) out.push_back(name);
  return out;
}

std::unique_ptr<Layer> make_layer(const nlohmann::json& spec, const Shape& in) {
  if (!spec.is_object()) throw std::invalid_argument("a layer must be a JSON object, got " + spec.dump());
  if (!spec.contains("type")) throw std::invalid_argument("field 'type': missing (known types: " + known_list() + ")");
  const auto& type_json = spec.at("type");
  if (!type_json.is_string())
    throw std::invalid_argument("field 'type': expected a string, got " + type_json.dump());
  const std::string type = type_json.get<std::string>();
  if (in.empty())
    throw std::invalid_argument(type + ": per-sample input is a scalar; expected at least one dimension");
  for (int64_t d : in) {
    if (d < 1) throw std::invalid_argument(type + ": per-sample input " + shape_str(in) + " has a non-positive dimension");
  }
  nn_detail::check_elements(type + ": per-sample input", in);
  for (const auto& [name, factory] : registry()) {
    if (name == type) {
      std::unique_ptr<Layer> layer = factory(spec, in);
      // throws on a mismatch the factory did not catch
      nn_detail::check_elements(type + ": per-sample output", layer->output_shape(in));
      return layer;
    }
  }
  throw std::invalid_argument("field 'type': unknown layer type '" + type + "' (known types: " + known_list() + ")");
}

}  // namespace cleave
