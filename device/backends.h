// backends.h: factory functions of the compiled-in backends (used by open_device).
//
// Each factory throws std::runtime_error with a clear message when its platform,
// GPU or driver is not present. Only backends compiled into this build are declared.
#pragma once

#include <memory>

#include "device/device.h"

namespace cleave {

// The CPU backend (OpenBLAS + OpenMP). Never fails for lack of hardware.
std::unique_ptr<Device> make_cpu_device(const DeviceOptions& opts);

#if CLEAVE_HAVE_OPENCL
// OpenCL (CLBlast). require_gpu: refuse CPU OpenCL devices (PoCL on the host).
std::unique_ptr<Device> make_opencl_device(const DeviceOptions& opts, bool require_gpu);
#endif

#if CLEAVE_HAVE_CUDA
// CUDA (cuBLAS), GPU number opts.ordinal.
std::unique_ptr<Device> make_cuda_device(const DeviceOptions& opts);
#endif

}  // namespace cleave
