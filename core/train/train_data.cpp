// train_data.cpp: see train_data.h.
#include "core/train/train_data.h"

#include <stdexcept>

namespace cleave {

std::string language_model_mismatch(const ModelSpec& spec) {
  if (spec.input.size() != 1) return "its input " + shape_str(spec.input) + " is not a sequence (T) of byte ids";
  if (spec.layers.empty() || spec.layers.front().value("type", "") != "embedding")
    return "its first layer is not an embedding of byte ids";
  if (spec.loss != LossKind::cross_entropy) return "its loss is not cross_entropy";
  const Shape want = {spec.input[0], 256};
  if (spec.output() != want)
    return "its output " + shape_str(spec.output()) + " is not " + shape_str(want) + " (256 byte logits per position)";
  return "";
}

TrainData load_train_data(const TrainConfig& cfg, const ModelSpec& spec) {
  const std::string why = language_model_mismatch(spec);
  TrainData d;
  if (!cfg.text_path.empty()) {
    if (!why.empty())
      throw std::runtime_error(cfg.model_path + ": --text trains a byte-level language model, but " + why +
                               " (see models/gpt-tiny.json)");
    const int64_t context = spec.input[0];
    d.train = load_text(cfg.text_path, context, /*train=*/true, cfg.limit_train);
    d.test = load_text(cfg.text_path, context, /*train=*/false, cfg.limit_test);
    return d;
  }
  if (why.empty())
    throw std::runtime_error(cfg.model_path + " is a byte-level language model: give it a text to train on with "
                             "--text FILE (--dataset holds class-labelled samples)");
  d.train = load_dataset(cfg.dataset, cfg.dataset_dir, /*train=*/true, cfg.limit_train);
  d.test = load_dataset(cfg.dataset, cfg.dataset_dir, /*train=*/false, cfg.limit_test);
  if (numel(d.train.sample_shape) != numel(spec.input))
    throw std::runtime_error(cfg.model_path + ": model input " + shape_str(spec.input) + " does not match the " +
                             d.train.name + " samples " + shape_str(d.train.sample_shape));
  return d;
}

}  // namespace cleave
