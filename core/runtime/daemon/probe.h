// probe.h: a short compute probe a daemon runs at start-up, reported at
// registration (and used by the planner as the device's rate).
#pragma once

#include "device/device.h"

namespace cleave {

// Sustained SGEMM rate of `device` in GFLOP/s (median of a few 256^3 products).
// Leaves nothing behind: its tensors are freed and the device's cached memory
// released (Device::release_cached_memory), so an idle daemon holds none of it.
double measure_gflops(Device& device);

}  // namespace cleave
