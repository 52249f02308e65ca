// train_data.h: the data a training run reads (`cleave train`, local and
// pipelined): --dataset, or --text for a language model, with the model's
// fit to it checked before anything is trained.
#pragma once

#include <string>

#include "core/data/dataset.h"
#include "core/model/model_spec.h"
#include "core/train/train_config.h"

namespace cleave {

struct TrainData {
  Dataset train;
  Dataset test;  // with --text: the validation windows
};

// "" when `spec` is a byte-level language model: input (T) token ids read by
// an `embedding` first layer, cross-entropy over an output (T, 256); else why not.
std::string language_model_mismatch(const ModelSpec& spec);

// cfg.text_path set: load_text(text_path, T) with --limit-train / --limit-test
// as windows; else load_dataset(dataset, dataset_dir, limits). Throws
// std::runtime_error naming the model file when the model does not fit the
// data: --text with a model that is not a language model, a language model
// without --text, or a sample shape whose size differs from the model's input.
TrainData load_train_data(const TrainConfig& cfg, const ModelSpec& spec);

}  // namespace cleave
