// test_state_dict.cpp: PyTorch-compatible parameter names and shapes, round-trips
// through safetensors, and a forward pass of weights saved by PyTorch
// (tests/fixtures/make_tiny_fixture.py) checked against PyTorch's output.
#include <catch2/catch.hpp>

#include <cmath>
#include <utility>

#include "core/io/safetensors.h"
#include "core/io/state_dict.h"
#include "core/model/partition.h"
#include "device/device.h"
#include "io/io_test_util.h"

using namespace cleave;
using cleave::test::ScratchDir;

namespace {

const std::string kRoot = CLEAVE_SOURCE_DIR;

std::unique_ptr<Device> cpu() {
  DeviceOptions o;
  o.threads = 1;
  return open_device("cpu", o);
}

std::vector<std::pair<std::string, Shape>> keys_and_shapes(const std::vector<NamedTensor>& sd) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& t : sd) out.emplace_back(t.name, t.shape);
  return out;
}

const NamedTensor& find(const std::vector<NamedTensor>& v, const std::string& name) {
  for (const auto& t : v)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("state_dict keys and shapes match torch.nn.Sequential", "[io][state_dict]") {
  // Printed by PyTorch for nn.Sequential of the same layers (state_dict().items()).
  SECTION("models/cnn.json") {
    const ModelSpec spec = ModelSpec::load(kRoot + "/models/cnn.json");
    const auto slots = param_slots(spec);
    std::vector<std::pair<std::string, Shape>> got;
    for (const auto& s : slots) got.emplace_back(s.key, s.shape);
    const std::vector<std::pair<std::string, Shape>> torch_keys = {
        {"0.weight", {32, 1, 3, 3}}, {"0.bias", {32}},  {"3.weight", {64, 32, 3, 3}}, {"3.bias", {64}},
        {"7.weight", {128, 3136}},   {"7.bias", {128}}, {"9.weight", {10, 128}},      {"9.bias", {10}}};
    CHECK(got == torch_keys);
  }
  SECTION("models/mlp.json") {
    const ModelSpec spec = ModelSpec::load(kRoot + "/models/mlp.json");
    std::vector<std::pair<std::string, Shape>> got;
    for (const auto& s : param_slots(spec)) got.emplace_back(s.key, s.shape);
    const std::vector<std::pair<std::string, Shape>> torch_keys = {
        {"1.weight", {1024, 784}},  {"1.bias", {1024}}, {"3.weight", {1024, 1024}}, {"3.bias", {1024}},
        {"5.weight", {1024, 1024}}, {"5.bias", {1024}}, {"7.weight", {10, 1024}},   {"7.bias", {10}}};
    CHECK(got == torch_keys);
  }
}

TEST_CASE("state_dict slots agree with Partition's parameter block", "[io][state_dict]") {
  const ModelSpec spec = ModelSpec::load(kRoot + "/models/cnn.json");
  auto dev = cpu();
  Partition whole(*dev, spec, 0, spec.num_layers());
  const auto slots = param_slots(spec);
  int64_t total = 0;
  for (const auto& s : slots) {
    const auto info = whole.layer(s.layer).param_info();
    int64_t in_layer = -1;
    for (const auto& p : info)
      if (std::to_string(s.layer) + "." + p.name == s.key) in_layer = p.offset;
    CHECK(s.offset == whole.param_offset(s.layer) + in_layer);
    total += numel(s.shape);
  }
  CHECK(total == whole.param_count());
  // A stage's offsets are relative to its own block.
  Partition stage(*dev, spec, 3, spec.num_layers());
  const auto stage_slots = param_slots(spec, 3);
  REQUIRE(stage_slots.front().key == "3.weight");
  CHECK(stage_slots.front().offset == 0);
  CHECK(stage_slots.back().offset + numel(stage_slots.back().shape) == stage.param_count());
}

TEST_CASE("state_dict round-trips through safetensors", "[io][state_dict]") {
  const ModelSpec spec = ModelSpec::load(kRoot + "/models/cnn.json");
  auto dev = cpu();
  Partition p(*dev, spec, 0, spec.num_layers());
  p.init(1234);
  const std::vector<float> params = p.params().to_host();
  const auto sd = state_dict(spec, params);
  // Each tensor is the right slice of the block.
  const auto& w7 = find(sd, "7.weight");
  const auto off7 = static_cast<size_t>(p.param_offset(7));
  CHECK(w7.data == std::vector<float>(params.begin() + static_cast<std::ptrdiff_t>(off7),
                                      params.begin() + static_cast<std::ptrdiff_t>(off7 + 128 * 3136)));
  ScratchDir dir("sd");
  write_safetensors(dir.file("cnn.safetensors"), sd, {{"format", "pt"}});
  const auto back = read_safetensors(dir.file("cnn.safetensors"));
  CHECK(keys_and_shapes(back) == keys_and_shapes(sd));
  CHECK(load_state_dict(spec, back) == params);

  // A stage loads its slice from the whole-model file; its own state dict has global keys.
  const std::vector<float> tail = load_state_dict(spec, back, 7, spec.num_layers());
  CHECK(tail == std::vector<float>(params.begin() + static_cast<std::ptrdiff_t>(off7), params.end()));
  const auto tail_sd = state_dict(spec, tail, 7);
  REQUIRE(tail_sd.size() == 4);
  CHECK(tail_sd[0].name == "7.weight");
  CHECK(tail_sd[0].data == w7.data);
}

TEST_CASE("load_state_dict names every mismatch", "[io][state_dict]") {
  const ModelSpec spec = ModelSpec::load(kRoot + "/models/cnn.json");
  const auto slots = param_slots(spec);
  std::vector<NamedTensor> sd;
  for (const auto& s : slots) sd.push_back({s.key, s.shape, std::vector<float>(static_cast<size_t>(numel(s.shape)))});
  REQUIRE_NOTHROW(load_state_dict(spec, sd));

  auto missing = sd;
  missing.erase(missing.begin() + 1);  // 0.bias
  CHECK_THROWS_WITH(load_state_dict(spec, missing),
                    Catch::Contains("model 'cnn'") && Catch::Contains("missing keys: 0.bias (32)"));

  auto extra = sd;
  extra.push_back({"fc.weight", {2}, {1.f, 2.f}});
  extra.push_back({"5.weight", {1}, {1.f}});
  CHECK_THROWS_WITH(load_state_dict(spec, extra), Catch::Contains("unexpected keys: fc.weight, 5.weight"));

  auto wrong = sd;
  wrong[4].shape = {128, 1500};
  wrong[4].data.resize(128 * 1500);
  CHECK_THROWS_WITH(load_state_dict(spec, wrong),
                    Catch::Contains("size mismatch for 7.weight: the file has shape (128, 1500), the model "
                                    "expects (128, 3136)"));

  auto dup = sd;
  dup.push_back(sd[0]);
  CHECK_THROWS_WITH(load_state_dict(spec, dup), Catch::Contains("duplicate keys: 0.weight"));

  CHECK_THROWS_WITH(state_dict(spec, std::vector<float>(10)),
                    Catch::Contains("has 421642 parameters in these layers, the block has 10"));
  CHECK_THROWS_WITH(param_slots(spec, 5, 3), Catch::Contains("layer range [5, 3) is empty or outside [0, 10)"));
}

TEST_CASE("weights saved by PyTorch give PyTorch's output", "[io][state_dict][fixture]") {
  // tests/fixtures/make_tiny_fixture.py: Conv2d(1,2,3) -> ReLU -> MaxPool2d(2) -> Flatten -> Linear(8,3).
  const ModelSpec spec = ModelSpec::load(kRoot + "/tests/fixtures/tiny_model.json");
  const auto weights = read_safetensors(kRoot + "/tests/fixtures/tiny.safetensors");
  CHECK(read_safetensors_metadata(kRoot + "/tests/fixtures/tiny.safetensors").at("format") == "pt");
  const auto io = read_safetensors(kRoot + "/tests/fixtures/tiny_io.safetensors");
  const auto& x = find(io, "input");
  const auto& y = find(io, "output");
  REQUIRE(x.shape == Shape{2, 1, 6, 6});
  REQUIRE(y.shape == Shape{2, 3});

  auto dev = cpu();
  Partition p(*dev, spec, 0, spec.num_layers());
  const std::vector<float> block = load_state_dict(spec, weights);
  REQUIRE(static_cast<int64_t>(block.size()) == p.param_count());
  p.params().from_host(block);
  Tensor xt(*dev, x.shape);
  xt.from_host(x.data);
  const std::vector<float> out = p.forward(xt, 0, false).to_host();
  REQUIRE(out.size() == y.data.size());
  for (size_t i = 0; i < out.size(); ++i) {
    INFO("output " << i);
    CHECK(out[i] == Approx(y.data[i]).margin(1e-5));
  }
  // And back: our state dict of those weights is what PyTorch saved.
  const auto sd = state_dict(spec, block);
  REQUIRE(sd.size() == weights.size());
  for (const auto& t : weights) {
    CHECK(find(sd, t.name).shape == t.shape);
    CHECK(find(sd, t.name).data == t.data);
  }
}

TEST_CASE("F16 / BF16 / F64 tensors saved by safetensors decode like PyTorch", "[io][safetensors][fixture]") {
  const auto t = read_safetensors(kRoot + "/tests/fixtures/dtypes.safetensors");
  CHECK(find(t, "f16").data == find(t, "f16_as_f32").data);
  CHECK(find(t, "bf16").data == find(t, "bf16_as_f32").data);
  CHECK(find(t, "f64").data == find(t, "f64_as_f32").data);
  CHECK(find(t, "f32").data == find(t, "f64_as_f32").data);
  CHECK(find(t, "f16").shape == Shape{2, 4});
  CHECK(find(t, "f16").data[0] == 1.f);
  CHECK(find(t, "bf16").data[1] == -2.f);
}
