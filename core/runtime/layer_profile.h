// layer_profile.h: measured per-layer training time on this device, for the
// planner (issue 5: "optionally a measured per-layer time").
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/model_spec.h"
#include "device/device.h"

namespace cleave {

// Seconds per sample of forward + backward (input gradient included) of each
// layer of `spec`, timed on `device` with micro-batches of `samples` samples:
// each layer alone, median of a few repetitions. A layer that does not fit the
// device's memory gets -1 (the planner then treats the device as unable to host it).
std::vector<double> profile_layers(Device& device, const ModelSpec& spec, int64_t samples, int repetitions = 3);

}  // namespace cleave
