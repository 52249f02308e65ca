// test_layer_profile.cpp: the daemon's per-layer profile (core/runtime/daemon/
// layer_profile.h) times every layer, with each backward whole or, as a zb1
// stage runs it, split into its input gradient B and weight gradient W.
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
  for (const std::string model : {"cnn", "gpt-tiny"}) {
    INFO(model);
    const ModelSpec spec = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/models/" + model + ".json");
    // Several repetitions on the same micro-batch: a B left without its W would
    // leave the micro-batch in flight and the next forward of it would throw.
    require_timed(profile_layers(*cpu, spec, 4, /*split_backward=*/false, 3), spec);
    require_timed(profile_layers(*cpu, spec, 4, /*split_backward=*/true, 3), spec);
  }
}
