// train_config.cpp: see train_config.h.
#include "core/train/train_config.h"

#include <stdexcept>
#include <string>

namespace cleave {

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json out = {{"model_path", model_path}, {"dataset", dataset},   {"epochs", epochs},
          {"batch", batch},           {"seed", seed},         {"limit_train", limit_train},
          {"limit_test", limit_test}, {"max_steps", max_steps}, {"microbatches", microbatches},
          {"optimizer", optimizer.to_json()}, {"backend", backend}, {"threads", threads}};
  if (!text_path.empty()) out["text"] = text_path;
  return out;
}

int64_t microbatch_offset(int64_t batch, int microbatches, int index) {
  if (microbatches < 1 || microbatches > batch)
    throw std::invalid_argument("cannot split a batch of " + std::to_string(batch) + " samples into " +
                                std::to_string(microbatches) + " micro-batches");
  if (index < 0 || index > microbatches)
    throw std::invalid_argument("micro-batch offset " + std::to_string(index) + " is outside [0, " +
                                std::to_string(microbatches) + "]");
  return batch * index / microbatches;
}

}  // namespace cleave
