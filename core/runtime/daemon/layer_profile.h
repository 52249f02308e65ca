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
// the input gradient B, then the weight gradient W. With `in_flight` > 1 (a
// gpipe run: every micro-batch of the batch) each repetition runs that many
// micro-batches forward, keeping each for backward, then their backwards, as a
// gpipe stage does: the activations kept then leave the caches, which one
// micro-batch at a time does not show (on a 2-core Xeon VM with 4 MiB of L2,
// gpt-tiny's gpipe stages computed 1.2-1.3x what that profile said, and a
// one-stage gpipe run was 1.17x slower than 1f1b's). Where that many do not
// fit, the profile falls back to one. The layers up to the model's first one
// with parameters are timed as the first stage, the only one that can start
// with them, runs them: that layer without its input gradient, those before it
// without backward. Timed with it, the MLP's first stage (layers 0-3,
// micro-batches of 16, 8 in flight, one EPYC core) came out 3.7-3.9 ms per
// micro-batch against 2.7 ms running them as a stage does; now 2.8-2.9 ms. A
// plan that starts a later stage inside those layers gets that stage's first
// layer without the input gradient it does compute.
// Throws std::invalid_argument for an `in_flight` outside 1..kMaxProfileInFlight.
inline constexpr int kMaxProfileInFlight = 1024;
std::vector<double> profile_layers(Device& device, const ModelSpec& spec, int64_t samples, bool split_backward = false,
                                   int in_flight = 1, int repetitions = 7);

// Seconds per parameter of one step of `optimizer` followed by zero_grad (what
// a stage does once per batch), timed on `device` over a block of `params`
// parameters (capped by free memory), median of a few repetitions.
double profile_update(Device& device, const OptimizerConfig& optimizer, int64_t params = 1 << 20, int repetitions = 5);

}  // namespace cleave
