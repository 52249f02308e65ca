// state_dict.cpp: PyTorch-named views of parameter blocks (see state_dict.h).
#include "core/io/state_dict.h"

#include <map>
#include <stdexcept>

#include "core/nn/layer.h"

namespace cleave {

namespace {

int resolve_end(const ModelSpec& spec, int begin, int end) {
  const int n = spec.num_layers();
  if (end == -1) end = n;
  if (begin < 0 || end > n || begin >= end)
    throw std::invalid_argument("model '" + spec.name + "': layer range [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") is empty or outside [0, " + std::to_string(n) + ")");
  return end;
}

std::string model_name(const ModelSpec& spec) {
  return "model '" + spec.name + "'" + (spec.source.empty() ? "" : " (" + spec.source + ")");
}

}  // namespace

std::vector<ParamSlot> param_slots(const ModelSpec& spec, int begin, int end) {
  end = resolve_end(spec, begin, end);
  std::vector<ParamSlot> out;
  int64_t base = 0;
  for (int i = begin; i < end; ++i) {
    const auto layer = make_layer(spec.layers[static_cast<size_t>(i)], spec.shapes[static_cast<size_t>(i)]);
    for (const auto& p : layer->param_info())
      out.push_back({std::to_string(i) + "." + p.name, i, p.shape, base + p.offset});
    base += layer->param_count();
  }
  return out;
}

std::vector<NamedTensor> state_dict(const ModelSpec& spec, const std::vector<float>& params, int begin, int end) {
  const auto slots = param_slots(spec, begin, end);
  int64_t total = 0;
  for (const auto& s : slots) total = std::max(total, s.offset + numel(s.shape));
  if (static_cast<int64_t>(params.size()) != total)
    throw std::invalid_argument("state_dict: " + model_name(spec) + " has " + std::to_string(total) +
                                " parameters in these layers, the block has " + std::to_string(params.size()));
  std::vector<NamedTensor> out;
  out.reserve(slots.size());
  for (const auto& s : slots) {
    const auto first = params.begin() + s.offset;
    out.push_back({s.key, s.shape, std::vector<float>(first, first + numel(s.shape))});
  }
  return out;
}

std::vector<float> load_state_dict(const ModelSpec& spec, const std::vector<NamedTensor>& tensors, int begin,
                                   int end) {
  end = resolve_end(spec, begin, end);
  const auto slots = param_slots(spec, begin, end);
  // Every key of the whole model, to tell "another stage's key" from "not this model's key".
  std::map<std::string, Shape> model_keys;
  for (const auto& s : param_slots(spec)) model_keys[s.key] = s.shape;

  std::map<std::string, const NamedTensor*> by_name;
  std::vector<std::string> problems, unexpected, duplicates;
  for (const auto& t : tensors) {
    if (!by_name.emplace(t.name, &t).second) duplicates.push_back(t.name);
    if (!model_keys.count(t.name)) unexpected.push_back(t.name);
  }
  int64_t total = 0;
  for (const auto& s : slots) total = std::max(total, s.offset + numel(s.shape));
  std::vector<float> block(static_cast<size_t>(total), 0.f);
  std::vector<std::string> missing;
  for (const auto& s : slots) {
    const auto it = by_name.find(s.key);
    if (it == by_name.end()) {
      missing.push_back(s.key + " " + shape_str(s.shape));
      continue;
    }
    const NamedTensor& t = *it->second;
    if (t.shape != s.shape) {
      problems.push_back("size mismatch for " + s.key + ": the file has shape " + shape_str(t.shape) +
                         ", the model expects " + shape_str(s.shape));
      continue;
    }
    if (static_cast<int64_t>(t.data.size()) != numel(s.shape)) {
      problems.push_back("tensor " + s.key + " of shape " + shape_str(t.shape) + " holds " +
                         std::to_string(t.data.size()) + " values");
      continue;
    }
    std::copy(t.data.begin(), t.data.end(), block.begin() + s.offset);
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!missing.empty()) problems.insert(problems.begin(), "missing keys: " + list(missing));
  if (!unexpected.empty()) problems.push_back("unexpected keys: " + list(unexpected));
  if (!duplicates.empty()) problems.push_back("duplicate keys: " + list(duplicates));
  if (!problems.empty()) {
    std::string msg = "load_state_dict: the weights do not match " + model_name(spec) + ":";
    for (const auto& p : problems) msg += "\n  " + p;
    throw std::invalid_argument(msg);
  }
  return block;
}

}  // namespace cleave
