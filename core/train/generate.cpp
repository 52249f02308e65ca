// generate.cpp: see generate.h.
#include "core/train/generate.h"

#include "core/train/train_checkpoint.h"
#include "device/device.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace cleave {

namespace {

constexpr int64_t kByteVocabulary = 256;

std::string describe_model(const ModelSpec& spec) {
  std::string first = spec.layers.front().value("type", "?");
  return "model '" + spec.name + "': input " + shape_str(spec.input) + ", first layer " + first + ", output " +
         shape_str(spec.output()) + ", loss " + loss_name(spec.loss);
}

}  // namespace

void check_byte_language_model(const ModelSpec& spec, const std::string& source) {
  std::string why;
  const nlohmann::json& first = spec.layers.front();
  if (spec.input.size() != 1)
    why = "its input is not one sequence of token ids";
  else if (first.value("type", "") != "embedding")
    why = "its first layer is not an embedding";
  else if (first.value("num_embeddings", int64_t{0}) != kByteVocabulary)
    why = "its embedding has " + std::to_string(first.value("num_embeddings", int64_t{0})) + " tokens, not 256 bytes";
  else if (spec.loss != LossKind::cross_entropy || spec.output() != Shape{spec.input[0], kByteVocabulary})
    why = "its output is not 256 logits at every position under cross_entropy";
  if (why.empty()) return;
  throw std::invalid_argument(source + ": not a byte-level language model: " + why + " (" + describe_model(spec) +
                              "); `cleave generate` needs a model like models/gpt-tiny.json trained with --text");
}

int sample_token(std::span<const float> logits, const SamplingOptions& options, Rng& rng) {
  if (logits.empty()) throw std::invalid_argument("sample_token: no logits");
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature))
    throw std::invalid_argument("temperature must be a finite number >= 0, got " + std::to_string(options.temperature));
  if (options.top_k < 0) throw std::invalid_argument("top-k must be >= 0, got " + std::to_string(options.top_k));
  for (float l : logits)
    if (!std::isfinite(l))
      throw std::runtime_error("the model's logits are not finite (a diverged checkpoint?): cannot sample");
  const auto best = std::max_element(logits.begin(), logits.end());
  if (options.temperature == 0 || options.top_k == 1) return static_cast<int>(best - logits.begin());
  // The k-th largest logit is the threshold: every logit at least as large stays.
  float threshold = -INFINITY;
  const auto n = static_cast<int64_t>(logits.size());
  if (options.top_k > 0 && options.top_k < n) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(), std::greater<float>());
    threshold = sorted[static_cast<size_t>(options.top_k - 1)];
  }
  std::vector<double> weight(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] < threshold) continue;
    weight[i] = std::exp((static_cast<double>(logits[i]) - *best) / options.temperature);
    total += weight[i];
  }
  const double u = static_cast<double>(rng.uniform()) * total;
  double cumulative = 0;
  int last = static_cast<int>(best - logits.begin());
  for (size_t i = 0; i < weight.size(); ++i) {
    if (weight[i] == 0) continue;
    cumulative += weight[i];
    last = static_cast<int>(i);
    if (u < cumulative) return last;
  }
  return last;  // u rounded up to the total: the last candidate
}

TextGenerator::TextGenerator(Partition& model) : model_(model) {
  const ModelSpec& spec = model.spec();
  check_byte_language_model(spec, spec.source.empty() ? spec.name : spec.source);
  if (model.begin() != 0 || model.end() != spec.num_layers())
    throw std::invalid_argument("TextGenerator: the partition must hold the whole model");
  context_ = spec.input[0];
  vocab_ = spec.output()[1];
}

std::string TextGenerator::generate(const std::string& prompt, int64_t tokens, const SamplingOptions& options,
                                    uint64_t seed, const std::function<void(char)>& on_byte) {
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty: give at least one byte to continue");
  if (tokens < 0) throw std::invalid_argument("tokens must be >= 0, got " + std::to_string(tokens));
  Device& d = model_.device();
  Rng rng(derive_seed(seed, 0x67656e));  // "gen": independent of the training streams of the same seed
  std::string text = prompt;
  std::string out;
  std::vector<float> ids(static_cast<size_t>(context_), 0.0f);
  Tensor x(d, {1, context_});
  for (int64_t n = 0; n < tokens; ++n) {
    const int64_t len = std::min<int64_t>(context_, static_cast<int64_t>(text.size()));
    const size_t from = text.size() - static_cast<size_t>(len);
    for (int64_t t = 0; t < context_; ++t)
      ids[static_cast<size_t>(t)] = t < len ? static_cast<float>(static_cast<unsigned char>(text[from + t])) : 0.0f;
    x.from_host(ids);
    const std::vector<float> logits = model_.forward(x, 0, /*training=*/false).to_host();  // (1, T, vocab)
    const std::span<const float> last(logits.data() + (len - 1) * vocab_, static_cast<size_t>(vocab_));
    const char byte = static_cast<char>(sample_token(last, options, rng));
    text += byte;
    out += byte;
    if (on_byte) on_byte(byte);
  }
  return out;
}

CheckpointLanguageModel load_language_model(const std::string& path, int threads) {
  const CheckpointWeights weights = load_checkpoint_weights(path);
  const ModelSpec spec = ModelSpec::parse(weights.model, path);
  check_byte_language_model(spec, path);
  DeviceOptions o;
  o.threads = threads;
  CheckpointLanguageModel lm;
  lm.device = open_device("cpu", o);
  lm.model = std::make_unique<Partition>(*lm.device, spec, 0, spec.num_layers());
  if (static_cast<int64_t>(weights.params.size()) != lm.model->param_count())
    throw std::invalid_argument(path + ": holds " + std::to_string(weights.params.size()) + " parameters, model '" +
                                spec.name + "' has " + std::to_string(lm.model->param_count()));
  if (lm.model->param_count() > 0) lm.model->params().from_host(weights.params);
  lm.generator = std::make_unique<TextGenerator>(*lm.model);
  return lm;
}

}  // namespace cleave
