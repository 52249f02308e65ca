// generate.h: sampling text from a trained byte-level language model
// (`cleave generate`).
//
// A byte-level language model is a model whose per-sample input is (T) token
// ids, whose first layer is an `embedding` of 256 tokens and whose output is
// (T, 256) logits under cross-entropy: the next byte at every position. The
// model is causal, so the logits at position t depend on bytes [0, t] only;
// a context shorter than T is placed at positions [0, len) and the logits at
// len - 1 predict the next byte (what fills the other positions does not
// matter). A context longer than T keeps its last T bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/util/rng.h"

namespace cleave {

struct SamplingOptions {
  double temperature = 1.0;  // > 0 divides the logits; 0: greedy (the most likely byte)
  int64_t top_k = 0;         // > 0: sample among the k most likely bytes only (1: greedy); 0: all
};

// Throws std::invalid_argument "SOURCE: not a byte-level language model: WHY
// (...)" unless `spec` is one (see above).
void check_byte_language_model(const ModelSpec& spec, const std::string& source);

// The index of the next token drawn from `logits` (one per token): greedy when
// temperature is 0 or top_k is 1 (the lowest index among equal maxima, no
// random number drawn), otherwise from softmax(logits / temperature) restricted
// to the logits >= the top_k-th largest, with one rng.uniform() draw. Throws
// std::invalid_argument for a negative temperature or top_k, or no logits, and
// std::runtime_error for a logit that is not finite.
int sample_token(std::span<const float> logits, const SamplingOptions& options, Rng& rng);

// Generates bytes with the whole model in one partition (parameters loaded).
class TextGenerator {
 public:
  // `model` must hold every layer of a byte-level language model; it is only read.
  explicit TextGenerator(Partition& model);

  int64_t context() const { return context_; }
  // Appends `tokens` sampled bytes to `prompt` (non-empty) and returns only the
  // new bytes; `on_byte` (if set) sees each byte as it is drawn. The same
  // prompt, options and seed give the same bytes.
  std::string generate(const std::string& prompt, int64_t tokens, const SamplingOptions& options, uint64_t seed,
                       const std::function<void(char)>& on_byte = {});

 private:
  Partition& model_;
  int64_t context_;
  int64_t vocab_;
};

// A byte-level language model from a checkpoint (`cleave train --text
// --save`), on a CPU device of its own, ready to generate.
struct CheckpointLanguageModel {
  std::unique_ptr<Device> device;
  std::unique_ptr<Partition> model;
  std::unique_ptr<TextGenerator> generator;
};

// Loads `path` (threads: CPU threads, 0 = all cores). Throws
// std::invalid_argument when its model is not a byte-level language model
// (check_byte_language_model) or its parameters do not fit the model, and
// what load_checkpoint_weights throws for an unreadable file.
CheckpointLanguageModel load_language_model(const std::string& path, int threads);

}  // namespace cleave
