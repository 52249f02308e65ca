// model_spec.h: a sequential model described by a JSON file.
//
//   {"name": "cnn", "input": [1, 28, 28], "loss": "cross_entropy",
//    "layers": [{"type": "conv2d", "out_channels": 32, "kernel": 3}, {"type": "relu"}, ...]}
//
// Parsing checks every layer against the shape flowing into it, so a bad file
// fails at load time with "FILE: layer 3 (conv2d): ..." instead of mid-training.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/tensor.h"

namespace cleave {

enum class LossKind { cross_entropy, mse };

struct ModelSpec {
  std::string name;
  std::string source;                  // file it came from (for messages)
  Shape input;                         // per-sample input shape, e.g. (1, 28, 28)
  LossKind loss = LossKind::cross_entropy;
  std::vector<nlohmann::json> layers;  // one JSON object per layer, validated
  std::vector<Shape> shapes;           // shapes[i] = per-sample input of layer i; back() = output

  int num_layers() const { return static_cast<int>(layers.size()); }
  Shape output() const { return shapes.back(); }

  // Throws std::runtime_error "PATH: ..." for a missing / unreadable / invalid file.
  static ModelSpec load(const std::string& path);
  // Validates `doc`; `source` names it in error messages.
  static ModelSpec parse(const nlohmann::json& doc, const std::string& source);
  nlohmann::json to_json() const;
};

const char* loss_name(LossKind k);

}  // namespace cleave
