// split_layout.h: where the layers of a split-learning run live.
//
// Split learning is a pipeline with the data on the client (DESIGN-NOTES 5).
// Vanilla (labels on the server): the client holds layers [0, cut) and its
// data; the server holds [cut, L) and computes the loss from labels the
// client sends. U-shaped (labels on the client): the client also holds the
// tail [cut_back, L) and the loss, the server only the middle [cut, cut_back),
// so neither samples nor labels leave the client.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/model/model_spec.h"

namespace cleave {

struct SplitLayout {
  int num_layers = 0;
  int cut = 0;                    // client front: [0, cut)
  int cut_back = 0;               // U-shaped: client tail [cut_back, L); vanilla: == num_layers
  bool labels_on_client = false;  // U-shaped

  int server_begin() const { return cut; }
  int server_end() const { return cut_back; }
  bool has_tail() const { return labels_on_client; }
  nlohmann::json to_json() const;
};

// The default cut: after the first layer with parameters and the
// parameter-free layers that follow it (activation, pooling, flatten), e.g. 3
// for both models/cnn.json (conv, relu, maxpool | ...) and models/mlp.json
// (flatten, linear, relu | ...). Throws std::invalid_argument when the model
// has no parameterised layer before its last layer.
int default_split_cut(const ModelSpec& spec);
// The default back cut of a U-shaped split: the index of the last layer with
// parameters (the classifier), so the client holds it and the loss.
int default_split_cut_back(const ModelSpec& spec);

// Validates a layout for `spec`: vanilla needs 1 <= cut < L; U-shaped needs
// 1 <= cut < cut_back < L, so every part holds at least one layer
// (-1 selects the default). Throws std::invalid_argument naming the flag and
// the layer range it must fall in ("--cut 12: the model has 10 layers; ...").
SplitLayout make_split_layout(const ModelSpec& spec, int cut, int cut_back, bool labels_on_client);

}  // namespace cleave
