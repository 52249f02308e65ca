// model_spec.cpp: loading and validating model JSON files.
//
// Every layer is built once with make_layer against the shape flowing into it,
// which validates its fields and yields its output shape; the layer's normalised
// JSON (explicit kernel/stride/padding, in_features, ...) is what the spec keeps.
// Layer indices in messages are 0-based, like Partition's global layer indices.
#include "core/model/model_spec.h"

#include <filesystem>
#include <stdexcept>

#include "core/io/untrusted_json.h"
#include "core/nn/layer.h"

namespace cleave {

using nlohmann::json;

namespace {

const char* const kTopFields[] = {"name", "description", "input", "loss", "layers"};

std::invalid_argument spec_error(const std::string& source, const std::string& what) {
  return std::invalid_argument(source + ": " + what);
}

Shape parse_input(const json& v, const std::string& source) {
  if (!v.is_array() || v.empty())
    throw spec_error(source, "field 'input': expected a non-empty array of positive integers (per-sample shape, "
                             "e.g. [1, 28, 28]), got " + json_excerpt(v));
  Shape s;
  for (const json& d : v) {
    if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > (int64_t{1} << 30))
      throw spec_error(source, "field 'input': expected positive integers, got " + json_excerpt(v));
    s.push_back(d.get<int64_t>());
  }
  return s;
}

LossKind parse_loss(const json& v, const std::string& source) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "cross_entropy") return LossKind::cross_entropy;
    if (s == "mse") return LossKind::mse;
  }
  throw spec_error(source, "field 'loss': unknown loss " + json_excerpt(v) + " (known: cross_entropy, mse)");
}

// A layer tied to layer `t` (Layer::tie) must come after it, and `t` must have
// the named parameter with the same shape.
void check_tie(const ModelSpec& spec, int index, const Layer& layer) {
  const Layer::Tie tie = layer.tie();
  if (tie.layer < 0) return;
  if (tie.layer >= index)
    throw std::invalid_argument("field 'tied_to': " + std::to_string(tie.layer) +
                                " is not an earlier layer (a layer can share the weight of a layer before it)");
  const auto t = static_cast<size_t>(tie.layer);
  const auto target = make_layer(spec.layers[t], spec.shapes[t]);
  for (const auto& p : target->param_info()) {
    if (p.name != tie.param) continue;
    if (p.shape != tie.shape)
      throw std::invalid_argument("field 'tied_to': layer " + std::to_string(tie.layer) + " (" + target->type() +
                                  ")'s " + p.name + " is " + shape_str(p.shape) + ", this layer needs " +
                                  shape_str(tie.shape));
    return;
  }
  throw std::invalid_argument("field 'tied_to': layer " + std::to_string(tie.layer) + " (" + target->type() +
                              ") has no parameter '" + tie.param + "' to share (tie to an embedding)");
}

}  // namespace

const char* loss_name(LossKind k) {
  switch (k) {
    case LossKind::cross_entropy: return "cross_entropy";
    case LossKind::mse: return "mse";
  }
  return "unknown";
}

ModelSpec ModelSpec::parse(const json& doc, const std::string& source) {
  if (!doc.is_object()) throw spec_error(source, "a model must be a JSON object, got " + json_excerpt(doc));
  for (const auto& [key, value] : doc.items()) {
    bool known = false;
    for (const char* f : kTopFields) known = known || key == f;
    if (!known)
      throw spec_error(source, "unknown field '" + key + "' (known: name, description, input, loss, layers)");
  }
  ModelSpec spec;
  spec.source = source;
  if (doc.contains("name")) {
    if (!doc["name"].is_string() || doc["name"].get<std::string>().empty())
      throw spec_error(source, "field 'name': expected a non-empty string, got " + json_excerpt(doc["name"]));
    spec.name = doc["name"].get<std::string>();
  } else {
    spec.name = std::filesystem::path(source).stem().string();
    if (spec.name.empty()) spec.name = "model";
  }
  if (doc.contains("description") && !doc["description"].is_string())
    throw spec_error(source, "field 'description': expected a string");
  if (!doc.contains("input")) throw spec_error(source, "field 'input': missing (per-sample shape, e.g. [1, 28, 28])");
  spec.input = parse_input(doc["input"], source);
  if (doc.contains("loss")) spec.loss = parse_loss(doc["loss"], source);
  if (!doc.contains("layers")) throw spec_error(source, "field 'layers': missing");
  const json& layers = doc["layers"];
  if (!layers.is_array() || layers.empty())
    throw spec_error(source, "field 'layers': expected a non-empty array of layer objects");

  spec.shapes.push_back(spec.input);
  for (size_t i = 0; i < layers.size(); ++i) {
    const json& lj = layers[i];
    const std::string type =
        lj.is_object() && lj.contains("type") && lj["type"].is_string() ? lj["type"].get<std::string>() : "?";
    try {
      std::unique_ptr<Layer> layer = make_layer(lj, spec.shapes.back());
      check_tie(spec, static_cast<int>(i), *layer);
      spec.shapes.push_back(layer->output_shape(spec.shapes.back()));
      spec.layers.push_back(layer->to_json());
    } catch (const std::invalid_argument& e) {
      throw spec_error(source, "layer " + std::to_string(i) + " (" + type + "): " + e.what());
    }
  }
  if (spec.loss == LossKind::cross_entropy && spec.output().size() != 1 && spec.output().size() != 2)
    throw spec_error(source, "loss cross_entropy needs a per-sample output of rank 1 (classes), or 2 (positions, "
                             "classes) for a sequence, got " + shape_str(spec.output()) +
                                 " (add a flatten and a linear layer)");
  return spec;
}

ModelSpec ModelSpec::load(const std::string& path) {
  // Size and depth limits before the parse: a hostile file is refused, not a crash.
  const json doc = read_untrusted_json_file(path, kFileJsonLimits, "model file");
  try {
    return parse(doc, path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());  // already "PATH: ..."
  }
}

json ModelSpec::to_json() const {
  json layers_json = json::array();
  for (const auto& l : layers) layers_json.push_back(l);
  return {{"name", name}, {"input", input}, {"loss", loss_name(loss)}, {"layers", layers_json}};
}

}  // namespace cleave
