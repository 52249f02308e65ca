// test_generate.cpp: sampling the next byte (core/train/generate.h): the
// distribution softmax(logits / temperature) restricted to the top k, greedy
// for temperature 0 and top-k 1, seeded reproducibility, the check that a model
// is a byte-level language model, and a causal model's continuation not
// depending on what pads a short context.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/train/generate.h"

using namespace cleave;
using Catch::Contains;
using nlohmann::json;

namespace {

Device& cpu() {
  static std::unique_ptr<Device> d = [] {
    DeviceOptions o;
    o.threads = 1;
    return open_device("cpu", o);
  }();
  return *d;
}

std::map<int, int> draw(const std::vector<float>& logits, const SamplingOptions& o, int n, uint64_t seed) {
  Rng rng(seed);
  std::map<int, int> counts;
  for (int i = 0; i < n; ++i) ++counts[sample_token(logits, o, rng)];
  return counts;
}

ModelSpec micro_gpt() {
  return ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/tests/fixtures/gpt-micro.json");
}

}  // namespace

TEST_CASE("sample_token follows softmax(logits / temperature)", "[train][generate]") {
  // Probabilities 0.1, 0.2, 0.3, 0.4 at temperature 1; squared (then renormalised) at 0.5.
  const std::vector<float> logits = {std::log(1.f), std::log(2.f), std::log(3.f), std::log(4.f)};
  const int n = 40000;
  for (double temperature : {1.0, 0.5}) {
    SamplingOptions o;
    o.temperature = temperature;
    const auto counts = draw(logits, o, n, 3);
    double z = 0;
    for (int i = 1; i <= 4; ++i) z += std::pow(i, 1.0 / temperature);
    for (int i = 0; i < 4; ++i) {
      const double p = std::pow(i + 1, 1.0 / temperature) / z;
      INFO("temperature " << temperature << ", token " << i);
      CHECK(counts.count(i) == 1);
      CHECK(static_cast<double>(counts.at(i)) / n == Approx(p).margin(0.01));
    }
  }
}

TEST_CASE("sample_token: top-k keeps the k most likely and top-k 1 is greedy", "[train][generate]") {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.0f, 2.9f};
  SamplingOptions top2;
  top2.top_k = 2;
  const auto counts = draw(logits, top2, 5000, 1);
  CHECK(counts.size() == 2);
  CHECK(counts.count(1) == 1);
  CHECK(counts.count(4) == 1);
  SamplingOptions greedy;
  greedy.temperature = 0;
  CHECK(draw(logits, greedy, 50, 2) == std::map<int, int>{{1, 50}});
  SamplingOptions top1;
  top1.top_k = 1;
  CHECK(draw(logits, top1, 50, 2) == std::map<int, int>{{1, 50}});
  SamplingOptions big_k;  // more than the vocabulary: every token may come
  big_k.top_k = 99;
  CHECK(draw(logits, big_k, 20000, 4).size() == 5);
  // The same seed draws the same tokens.
  Rng a(9), b(9);
  for (int i = 0; i < 100; ++i) CHECK(sample_token(logits, {}, a) == sample_token(logits, {}, b));
}

TEST_CASE("sample_token refuses a negative temperature or top-k and logits that are not finite", "[train][generate]") {
  Rng rng(1);
  const std::vector<float> logits = {1.f, 2.f};
  SamplingOptions o;
  o.temperature = -0.5;
  CHECK_THROWS_WITH(sample_token(logits, o, rng), Contains("temperature"));
  o = {};
  o.top_k = -1;
  CHECK_THROWS_WITH(sample_token(logits, o, rng), Contains("top-k"));
  CHECK_THROWS(sample_token({}, {}, rng));
  const std::vector<float> diverged = {1.f, std::nanf("")};
  CHECK_THROWS_WITH(sample_token(diverged, {}, rng), Contains("not finite"));
}

TEST_CASE("check_byte_language_model says why a model is not one", "[train][generate]") {
  CHECK_NOTHROW(check_byte_language_model(micro_gpt(), "gpt"));
  CHECK_NOTHROW(check_byte_language_model(ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/gpt-tiny.json"),
                                          "gpt-tiny"));
  const ModelSpec cnn = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json");
  CHECK_THROWS_WITH(check_byte_language_model(cnn, "cnn.ckpt"),
                    Contains("cnn.ckpt: not a byte-level language model") && Contains("input is not one sequence"));
  json small_vocab = micro_gpt().to_json();
  small_vocab["layers"][0]["num_embeddings"] = 128;
  small_vocab["layers"].back()["out_features"] = 128;
  CHECK_THROWS_WITH(check_byte_language_model(ModelSpec::parse(small_vocab, "v"), "v"),
                    Contains("128 tokens, not 256 bytes"));
  json no_embedding = {{"input", {16}}, {"loss", "mse"}, {"layers", {{{"type", "linear"}, {"out_features", 16}}}}};
  CHECK_THROWS_WITH(check_byte_language_model(ModelSpec::parse(no_embedding, "m"), "m"),
                    Contains("first layer is not an embedding"));
}

TEST_CASE("TextGenerator: seeded and a short context padding does not matter", "[train][generate]") {
  const ModelSpec spec = micro_gpt();
  Partition model(cpu(), spec, 0, spec.num_layers());
  model.init(5);
  TextGenerator g(model);
  REQUIRE(g.context() == 16);
  const std::string a = g.generate("the cat", 24, {}, 1);
  CHECK(a.size() == 24);
  CHECK(g.generate("the cat", 24, {}, 1) == a);
  CHECK(g.generate("the cat", 24, {}, 2) != a);
  std::string streamed;
  g.generate("the cat", 24, {}, 1, [&](char c) { streamed += c; });
  CHECK(streamed == a);
  // A prompt longer than the context: only its last 16 bytes count.
  const std::string tail = "0123456789abcdef";
  CHECK(g.generate("a long preamble " + tail, 10, {}, 3) == g.generate(tail, 10, {}, 3));
  CHECK_THROWS_WITH(g.generate("", 3, {}, 1), Contains("prompt is empty"));
}

TEST_CASE("TextGenerator: the greedy next byte is the model's argmax at the prompt's last position", "[train][generate]") {
  const ModelSpec spec = micro_gpt();
  Partition model(cpu(), spec, 0, spec.num_layers());
  model.init(8);
  TextGenerator g(model);
  SamplingOptions greedy;
  greedy.temperature = 0;
  const std::string prompt = "hello";
  // The model's own forward on the prompt padded with other bytes ('z'): causal,
  // so position 4's logits are the same.
  std::vector<float> ids(16, static_cast<float>('z'));
  for (size_t i = 0; i < prompt.size(); ++i) ids[i] = static_cast<float>(prompt[i]);
  Tensor x(cpu(), {1, 16});
  x.from_host(ids);
  const std::vector<float> logits = model.forward(x, 0, false).to_host();
  const auto first = logits.begin() + 4 * 256;
  const int best = static_cast<int>(std::max_element(first, first + 256) - first);
  CHECK(static_cast<unsigned char>(g.generate(prompt, 1, greedy, 1)[0]) == best);
}
