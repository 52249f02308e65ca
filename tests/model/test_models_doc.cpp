// test_models_doc.cpp: docs/models.md stays true to the code. Every layer type
// the registry knows has its section, every JSON example in it is a valid
// model, and what it states about the shipped models (parameter counts, the
// shape after each layer of models/cnn.json) is what ModelSpec computes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/nn/layer.h"
#include "device/device.h"

using namespace cleave;

namespace {

std::string read_doc() {
  std::ifstream in(CLEAVE_SOURCE_DIR "/docs/models.md");
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// "1,234,567" -> 1234567
int64_t digits(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  return std::stoll(s);
}

int64_t param_count(const ModelSpec& spec) {
  auto cpu = open_device("cpu", DeviceOptions{});
  return Partition(*cpu, spec, 0, spec.num_layers()).param_count();
}

}  // namespace

TEST_CASE("docs/models.md has a section for every registered layer type", "[model][docs]") {
  const std::string doc = read_doc();
  const auto types = layer_types();
  REQUIRE(types.size() >= 10);
  for (const std::string& type : types) {
    INFO(type);
    // A heading such as "### `linear`" or "### `relu`, `gelu`, `tanh`".
    const std::regex heading("\\n### [^\\n]*`" + type + "`");
    CHECK(std::regex_search(doc, heading));
  }
}

TEST_CASE("every JSON example in docs/models.md is a valid model", "[model][docs]") {
  const std::string doc = read_doc();
  const std::regex block("```json\\n([\\s\\S]*?)```");
  int examples = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), block); it != std::sregex_iterator(); ++it) {
    ++examples;
    const std::string text = (*it)[1];
    INFO(text);
    CHECK_NOTHROW(ModelSpec::parse(nlohmann::json::parse(text), "docs/models.md example"));
  }
  CHECK(examples >= 1);
}

TEST_CASE("docs/models.md states the shipped models' parameters and shapes", "[model][docs]") {
  const std::string doc = read_doc();
  for (const char* name : {"cnn", "mlp"}) {
    INFO(name);
    const ModelSpec spec = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/" + name + ".json");
    std::smatch m;
    const std::regex stated("`models/" + std::string(name) + "\\.json` \\(([0-9,]+) parameters\\)");
    REQUIRE(std::regex_search(doc, m, stated));
    CHECK(digits(m[1]) == param_count(spec));
  }
  // The cnn table: "| i | layer | (shape) | ..." gives the output of layer i.
  const ModelSpec cnn = ModelSpec::load(CLEAVE_SOURCE_DIR "/models/cnn.json");
  const std::regex row("\\n\\| ([0-9]+) \\| [^|]+ \\| (\\([0-9, ]+\\)) \\|");
  int rows = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), row); it != std::sregex_iterator(); ++it) {
    const int i = std::stoi((*it)[1]);
    REQUIRE(i < cnn.num_layers());
    INFO("layer " << i);
    CHECK((*it)[2].str() == shape_str(cnn.shapes[static_cast<size_t>(i) + 1]));
    ++rows;
  }
  CHECK(rows == cnn.num_layers());
}
