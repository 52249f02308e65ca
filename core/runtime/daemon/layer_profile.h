// layer_profile.h: measured per-layer training time on this device, for the
// planner (issue 5: "optionally a measured per-layer time").
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"
#include "device/device.h"

namespace cleave {

// Seconds per sample of forward + backward (input gradient included) of each
// layer of `spec`, timed on `device` with micro-batches of `samples` samples,
// median of a few repetitions. Where the whole model fits, the layers are timed
// where training runs them: one micro-batch forward through all of them, then
// backward in reverse, so that a layer's backward finds its activations as far
// out of cache as in training (timed alone, forward then at once backward, the
// layers of gpt-tiny came out 9-13% faster than one-process training runs
// them). Otherwise each layer alone; one that does not fit the device's memory
// then gets -1 (the planner treats the device as unable to host it). With
// `split_backward` (a zb1 run) each backward is timed as the schedule runs it:
// the input gradient B, then the weight gradient W.
std::vector<double> profile_layers(Device& device, const ModelSpec& spec, int64_t samples, bool split_backward = false,
                                   int repetitions = 7);

// Seconds per parameter of one step of `optimizer` followed by zero_grad (what
// a stage does once per batch), timed on `device` over a block of `params`
// parameters (capped by free memory), median of a few repetitions.
double profile_update(Device& device, const OptimizerConfig& optimizer, int64_t params = 1 << 20, int repetitions = 5);

}  // namespace cleave
