// test_layer_profile.cpp: the daemon's per-layer profile (core/runtime/daemon/
// layer_profile.h) times every layer, with each backward whole or, as a zb1
// stage runs it, split into its input gradient B and weight gradient W, and
// with several micro-batches kept for backward, as a gpipe stage keeps them.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "core/model/model_spec.h"
#include "core/runtime/daemon/layer_profile.h"
#include "device/device.h"

using namespace cleave;

namespace {

void require_timed(const std::vector<double>& secs, const ModelSpec& spec) {
  REQUIRE(static_cast<int>(secs.size()) == spec.num_layers());
  for (size_t i = 0; i < secs.size(); ++i) {
    INFO("layer " << i);
    CHECK(std::isfinite(secs[i]));
    CHECK(secs[i] > 0);
  }
}

}  // namespace

TEST_CASE("every layer is timed with its backward whole and split into B and W", "[runtime][profile]") {
  auto cpu = open_device("cpu", DeviceOptions{1, 0, 0, ""});
  // The CNN's convolutions and linears split their backward; gpt-tiny's
  // embeddings, blocks and head too, its layer norm and position embedding not.
  // The MLP starts with a flatten, timed without backward, as the first stage
  // runs it, and a linear timed without its input gradient.
  for (const std::string model : {"cnn", "gpt-tiny", "mlp"}) {
    INFO(model);
    const ModelSpec spec = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/" + model + ".json");
    // Several repetitions on the same micro-batch: a B left without its W would
    // leave the micro-batch in flight and the next forward of it would throw.
    require_timed(profile_layers(*cpu, spec, 4, /*split_backward=*/false, /*in_flight=*/1, 3), spec);
    require_timed(profile_layers(*cpu, spec, 4, /*split_backward=*/true, /*in_flight=*/1, 3), spec);
  }
}

// gpipe keeps every micro-batch of the batch for backward: the profile does the
// same with in_flight > 1, each micro-batch through forward before any
// backward (a micro-batch index reused before its backward would throw).
TEST_CASE("the layers are timed with several micro-batches kept for backward, as gpipe keeps them",
          "[runtime][profile]") {
  auto cpu = open_device("cpu", DeviceOptions{1, 0, 0, ""});
  for (const std::string model : {"cnn", "gpt-tiny", "mlp"}) {
    INFO(model);
    const ModelSpec spec = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/" + model + ".json");
    require_timed(profile_layers(*cpu, spec, 2, /*split_backward=*/false, /*in_flight=*/4, 3), spec);
    require_timed(profile_layers(*cpu, spec, 2, /*split_backward=*/true, /*in_flight=*/4, 3), spec);
  }
  const ModelSpec mlp = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json");
  CHECK_THROWS_WITH(profile_layers(*cpu, mlp, 2, false, 0), Catch::Contains("in_flight 0 is outside 1..1024"));
  // Where the micro-batches kept do not fit, one at a time still times every
  // layer: gpt-tiny keeps ~2.6 MB per sample of a micro-batch, so 1024
  // micro-batches of 2 do not fit in 64 MiB, and the model with one does.
  const ModelSpec gpt = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/gpt-tiny.json");
  auto small = open_device("cpu", DeviceOptions{1, size_t{64} << 20, 0, ""});
  require_timed(profile_layers(*small, gpt, 2, /*split_backward=*/false, /*in_flight=*/1024, 3), gpt);
}
