// test_weight_tying.cpp: a linear layer whose weight is an earlier embedding's
// table ("tied_to"): one parameter tensor, exact gradients (finite differences
// through a whole tied GPT, and the tied gradient equal to the sum of the two
// untied gradients), the model-file checks, and the refusal of a partition that
// holds the projection without the embedding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "core/io/state_dict.h"
#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "nn/nn_test_util.h"

using namespace cleave;
using namespace cleave::test;
using nlohmann::json;

namespace {

// vocabulary 13, width 8, context 4; layer 5 is the projection.
json micro_gpt(bool tied) {
  json proj = {{"type", "linear"}, {"out_features", 13}};
  if (tied) proj["tied_to"] = 0;
  return {{"name", "gpt-tied"},
          {"input", {4}},
          {"loss", "cross_entropy"},
          {"layers",
           {{{"type", "embedding"}, {"num_embeddings", 13}, {"embedding_dim", 8}},
            {{"type", "position_embedding"}},
            {{"type", "transformer_block"}, {"heads", 2}},
            {{"type", "layernorm"}},
            {{"type", "gelu"}},
            proj}}};
}

std::vector<float> token_ids(Rng& rng, int64_t n, int64_t vocab) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& t : v) t = static_cast<float>(rng.below(static_cast<uint64_t>(vocab)));
  return v;
}

// sum_i r_i * logits_i in double, for the partition's current parameters.
double projected_output(Partition& p, const Tensor& x, const std::vector<float>& r) {
  const std::vector<float> y = p.forward(x, 0, false).to_host();
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(r[i]) * y[i];
  return s;
}

// The parameter gradient of sum(r * logits) by backward.
std::vector<float> analytical_grads(Partition& p, const Tensor& x, const std::vector<float>& r) {
  p.zero_grad();
  const Tensor y = p.forward(x, 0, true);
  p.backward(upload(cpu(), y.shape(), r), 0, false);
  return p.grads().to_host();
}

std::string expect_parse_error(const json& doc) {
  try {
    ModelSpec::parse(doc, "tied.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("the model file was accepted");
  return "";
}

}  // namespace

TEST_CASE("a tied projection owns only its bias and exports one table", "[nn][gpt][tying]") {
  const ModelSpec tied = ModelSpec::parse(micro_gpt(true), "tied.json");
  const ModelSpec untied = ModelSpec::parse(micro_gpt(false), "untied.json");
  Partition pt(cpu(), tied, 0, tied.num_layers());
  Partition pu(cpu(), untied, 0, untied.num_layers());
  CHECK(pu.param_count() - pt.param_count() == 13 * 8);
  CHECK(tied.layers.back().at("tied_to") == 0);  // the normalised form keeps the field
  CHECK_FALSE(untied.layers.back().contains("tied_to"));
  // Reparsing the normalised form gives the same model.
  CHECK(ModelSpec::parse(tied.to_json(), "again").layers == tied.layers);

  std::vector<std::string> keys;
  for (const auto& s : param_slots(tied)) keys.push_back(s.key);
  CHECK(std::count(keys.begin(), keys.end(), "0.weight") == 1);
  CHECK(std::count(keys.begin(), keys.end(), "5.weight") == 0);
  CHECK(std::count(keys.begin(), keys.end(), "5.bias") == 1);
}

TEST_CASE("gradcheck: a GPT whose projection is tied to its embedding", "[nn][gradcheck][gpt][tying]") {
  const ModelSpec spec = ModelSpec::parse(micro_gpt(true), "tied.json");
  Partition p(cpu(), spec, 0, spec.num_layers());
  Rng rng(11);
  // Values of order 0.5 everywhere (as the layer gradchecks use): at GPT-2's
  // N(0, 0.02) a step of 1e-2 would be half the spread LayerNorm divides by.
  p.params().from_host(random_normal(rng, p.param_count(), 0.5f));
  const int64_t batch = 2;
  const Tensor x = upload(cpu(), {batch, 4}, token_ids(rng, batch * 4, 13));
  const std::vector<float> r = random_normal(rng, batch * 4 * 13);
  const std::vector<float> ana = analytical_grads(p, x, r);

  std::vector<float> values = p.params().to_host();
  const double eps = 1e-2;
  int64_t failures = 0;
  double max_err = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const float orig = values[i];
    values[i] = orig + static_cast<float>(eps);
    p.params().from_host(values);
    const double plus = projected_output(p, x, r);
    values[i] = orig - static_cast<float>(eps);
    p.params().from_host(values);
    const double minus = projected_output(p, x, r);
    values[i] = orig;
    const double h = double(orig + static_cast<float>(eps)) - double(orig - static_cast<float>(eps));
    const double num = (plus - minus) / h;
    const double err = std::fabs(num - ana[i]);
    max_err = std::max(max_err, err);
    if (err > 3e-3 + 3e-3 * std::max(std::fabs(num), std::fabs(static_cast<double>(ana[i])))) {
      if (failures < 8) UNSCOPED_INFO("parameter " << i << ": numerical " << num << ", analytical " << ana[i]);
      ++failures;
    }
  }
  p.params().from_host(values);
  INFO(values.size() << " parameters checked, max abs err " << max_err);
  CHECK(failures == 0);
}

TEST_CASE("the tied gradient is the sum of the embedding's and the projection's", "[nn][gpt][tying]") {
  const ModelSpec tied = ModelSpec::parse(micro_gpt(true), "tied.json");
  const ModelSpec untied = ModelSpec::parse(micro_gpt(false), "untied.json");
  Partition pt(cpu(), tied, 0, tied.num_layers());
  Partition pu(cpu(), untied, 0, untied.num_layers());
  pt.init(9);
  // The untied model with the same values: its projection weight is a copy of the table.
  const std::vector<float> tv = pt.params().to_host();
  std::vector<float> uv;
  const int64_t proj_bias_at = pt.param_offset(5);
  uv.insert(uv.end(), tv.begin(), tv.begin() + proj_bias_at);
  uv.insert(uv.end(), tv.begin(), tv.begin() + 13 * 8);  // 5.weight = 0.weight
  uv.insert(uv.end(), tv.begin() + proj_bias_at, tv.end());
  REQUIRE(static_cast<int64_t>(uv.size()) == pu.param_count());
  pu.params().from_host(uv);

  Rng rng(4);
  const Tensor x = upload(cpu(), {3, 4}, token_ids(rng, 12, 13));
  const std::vector<float> r = random_normal(rng, 3 * 4 * 13);
  CHECK(pt.forward(x, 0, false).to_host() == pu.forward(x, 0, false).to_host());
  const std::vector<float> gt = analytical_grads(pt, x, r);
  const std::vector<float> gu = analytical_grads(pu, x, r);
  const int64_t proj_w_at = pu.param_offset(5);
  for (int64_t i = 0; i < 13 * 8; ++i) {
    INFO("table element " << i);
    CHECK(gt[static_cast<size_t>(i)] == Approx(gu[static_cast<size_t>(i)] + gu[static_cast<size_t>(proj_w_at + i)])
                                            .epsilon(1e-5)
                                            .margin(1e-6));
  }
  // Every other gradient is the untied model's.
  for (int64_t i = 13 * 8; i < proj_bias_at; ++i) CHECK(gt[static_cast<size_t>(i)] == gu[static_cast<size_t>(i)]);
}

TEST_CASE("a stage holding the tied projection without the embedding is refused", "[nn][gpt][tying]") {
  const ModelSpec spec = ModelSpec::parse(micro_gpt(true), "tied.json");
  CHECK_NOTHROW(Partition(cpu(), spec, 0, spec.num_layers()));
  CHECK_NOTHROW(Partition(cpu(), spec, 0, 3));  // the embedding's stage alone is fine
  try {
    Partition(cpu(), spec, 3, spec.num_layers());
    FAIL("the cut was accepted");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("layer 5 (linear) shares layer 0's weight") != std::string::npos);
    CHECK(m.find("--local") != std::string::npos);
  }
}

TEST_CASE("a bad tied_to is refused when the model file is read", "[nn][gpt][tying]") {
  json later = micro_gpt(false);
  later["layers"][0] = {{"type", "linear"}, {"out_features", 4}, {"tied_to", 3}};
  later["input"] = {4};
  CHECK(expect_parse_error(later).find("not an earlier layer") != std::string::npos);

  json to_norm = micro_gpt(true);
  to_norm["layers"][5]["tied_to"] = 3;  // layernorm: weight (8), not (13, 8)
  const std::string m = expect_parse_error(to_norm);
  CHECK(m.find("layer 5 (linear)") != std::string::npos);
  CHECK(m.find("layer 3 (layernorm)'s weight is (8), this layer needs (13, 8)") != std::string::npos);

  json to_block = micro_gpt(true);
  to_block["layers"][5]["tied_to"] = 2;
  CHECK(expect_parse_error(to_block).find("has no parameter 'weight'") != std::string::npos);

  json wrong_vocab = micro_gpt(true);
  wrong_vocab["layers"][5]["out_features"] = 12;
  CHECK(expect_parse_error(wrong_vocab).find("needs (12, 8)") != std::string::npos);

  json negative = micro_gpt(true);
  negative["layers"][5]["tied_to"] = -1;
  CHECK(expect_parse_error(negative).find("tied_to") != std::string::npos);
}
