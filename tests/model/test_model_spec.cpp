// test_model_spec.cpp: the shipped model files, and the messages of malformed ones
// (file, 0-based layer index and type, field).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "core/model/model_spec.h"

using namespace cleave;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using nlohmann::json;

namespace {

const std::string kModels = std::string(CLEAVE_SOURCE_DIR) + "/models/";

// Writes `text` to a fresh file in the temp directory and returns its path.
std::string write_temp(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "cleave_test_model_spec";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

std::string load_error(const std::string& path) {
  try {
    ModelSpec::load(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("models/mlp.json and models/cnn.json load with the expected shapes", "[model]") {
  const ModelSpec mlp = ModelSpec::load(kModels + "mlp.json");
  CHECK(mlp.name == "mlp");
  CHECK(mlp.input == Shape{1, 28, 28});
  CHECK(mlp.loss == LossKind::cross_entropy);
  REQUIRE(mlp.num_layers() == 8);
  CHECK(mlp.shapes.size() == 9);
  CHECK(mlp.shapes[1] == Shape{784});
  CHECK(mlp.shapes[2] == Shape{1024});
  CHECK(mlp.output() == Shape{10});
  CHECK(mlp.layers[1]["in_features"] == 784);

  const ModelSpec cnn = ModelSpec::load(kModels + "cnn.json");
  CHECK(cnn.name == "cnn");
  REQUIRE(cnn.num_layers() == 10);
  CHECK(cnn.shapes[1] == Shape{32, 28, 28});
  CHECK(cnn.shapes[3] == Shape{32, 14, 14});
  CHECK(cnn.shapes[4] == Shape{64, 14, 14});
  CHECK(cnn.shapes[6] == Shape{64, 7, 7});
  CHECK(cnn.shapes[7] == Shape{3136});
  CHECK(cnn.output() == Shape{10});
}

TEST_CASE("ModelSpec round-trips through to_json", "[model]") {
  const ModelSpec cnn = ModelSpec::load(kModels + "cnn.json");
  const json doc = cnn.to_json();
  CHECK(doc["loss"] == "cross_entropy");
  const ModelSpec again = ModelSpec::parse(doc, "roundtrip");
  CHECK(again.to_json() == doc);
  CHECK(again.shapes == cnn.shapes);
  CHECK(again.source == "roundtrip");
  CHECK(std::string(loss_name(LossKind::mse)) == "mse");

  const ModelSpec reg = ModelSpec::parse(
      json::parse(R"({"input": [3], "loss": "mse", "layers": [{"type": "linear", "out_features": 2}]})"),
      "dir/regression.json");
  CHECK(reg.name == "regression");  // defaults to the file stem
  CHECK(reg.loss == LossKind::mse);
  CHECK(reg.output() == Shape{2});
}

TEST_CASE("model files: missing, unreadable and invalid JSON", "[model][errors]") {
  const std::string missing = "/nonexistent/dir/model.json";
  CHECK_THAT(load_error(missing), StartsWith(missing + ": cannot open model file (") &&
                                      Contains("No such file"));
  const std::string dir = std::filesystem::temp_directory_path().string();
  CHECK_THAT(load_error(dir), StartsWith(dir + ": cannot open model file"));
  const std::string bad = write_temp("bad_json.json", "{\"input\": [1, 28, 28], \"layers\": [\n  {\"type\": \"relu\",}\n]}");
  CHECK_THAT(load_error(bad), StartsWith(bad + ": invalid JSON") && Contains("line 2"));
  const std::string empty = write_temp("empty.json", "");
  CHECK_THAT(load_error(empty), StartsWith(empty + ": invalid JSON"));
}

TEST_CASE("model files: malformed layers name the file, layer index, type and field", "[model][errors]") {
  struct Case {
    const char* file;
    const char* text;
    std::vector<std::string> pieces;  // all must appear after "PATH: "
  };
  const std::vector<Case> cases = {
      {"kernel.json",
       R"({"input": [1, 8, 8], "layers": [{"type": "conv2d", "out_channels": 4, "kernel": 3},
           {"type": "maxpool2d", "kernel": 2}, {"type": "relu"},
           {"type": "conv2d", "out_channels": 4, "kernel": 5}, {"type": "flatten"},
           {"type": "linear", "out_features": 10}]})",
       {"layer 3 (conv2d): field 'kernel': kernel 5 larger than padded input 3x3"}},
      {"unknown_type.json", R"({"input": [4], "layers": [{"type": "relu"}, {"type": "softmax"}]})",
       {"layer 1 (softmax): field 'type': unknown layer type 'softmax'", "linear", "maxpool2d"}},
      {"missing_field.json", R"({"input": [4], "layers": [{"type": "linear"}]})",
       {"layer 0 (linear): field 'out_features': missing"}},
      {"negative.json", R"({"input": [4], "layers": [{"type": "linear", "out_features": -2}]})",
       {"layer 0 (linear): field 'out_features': expected a positive integer, got -2"}},
      {"float.json", R"({"input": [1, 6, 6], "layers": [{"type": "conv2d", "out_channels": 2, "kernel": 1.5}]})",
       {"layer 0 (conv2d): field 'kernel'", "1.5"}},
      {"unknown_field.json",
       R"({"input": [1, 6, 6], "layers": [{"type": "maxpool2d", "kernel": 2, "strides": 2}]})",
       {"layer 0 (maxpool2d): unknown field 'strides'", "known fields: kernel, padding, stride"}},
      {"no_flatten.json",
       R"({"input": [1, 6, 6], "layers": [{"type": "relu"}, {"type": "linear", "out_features": 3}]})",
       {"layer 1 (linear)", "add a flatten layer before it"}},
      {"not_object.json", R"({"input": [4], "layers": [{"type": "relu"}, 7]})", {"layer 1 (?)", "JSON object"}},
      {"ce_rank.json", R"({"input": [2, 4, 4], "loss": "cross_entropy", "layers": [{"type": "relu"}]})",
       {"loss cross_entropy needs a per-sample output of rank 1", "(2, 4, 4)"}},
      {"bad_loss.json", R"({"input": [4], "loss": "hinge", "layers": [{"type": "relu"}]})",
       {"field 'loss': unknown loss \"hinge\"", "cross_entropy, mse"}},
      {"bad_input.json", R"({"input": [1, 0, 28], "layers": [{"type": "relu"}]})", {"field 'input'"}},
      {"no_input.json", R"({"layers": [{"type": "relu"}]})", {"field 'input': missing"}},
      {"no_layers.json", R"({"input": [4], "layers": []})", {"field 'layers'"}},
      {"top_field.json", R"({"input": [4], "layer": [], "layers": [{"type": "relu"}]})", {"unknown field 'layer'"}},
      {"array.json", R"([1, 2])", {"a model must be a JSON object"}},
  };
  for (const auto& c : cases) {
    const std::string path = write_temp(c.file, c.text);
    const std::string msg = load_error(path);
    INFO(c.file << ": " << msg);
    CHECK_THAT(msg, StartsWith(path + ": "));
    for (const auto& piece : c.pieces) CHECK_THAT(msg, Contains(piece));
    // parse() reports the same problem as std::invalid_argument, naming its source
    CHECK_THROWS_AS(ModelSpec::parse(json::parse(c.text), "src"), std::invalid_argument);
  }
}
