// backends.h: how open_device reaches each backend (not for layers or callers
// of open_device, which see only device.h).
//
// The CPU backend is part of cleave_device. The OpenCL and CUDA backends are
// shared modules loaded on first use (libcleave-backend-opencl.so,
// libcleave-backend-cuda.so; backend_modules.cpp), so a process that never asks
// for them maps none of their libraries (OpenCL, CLBlast, cudart, cuBLAS). Each
// module exports one C function, cleave_backend_open (CLEAVE_BACKEND_MODULE
// below). The modules are found, in order, in $CLEAVE_BACKEND_DIR (when set,
// the only place looked in), in lib/cleave/ beside libcleave.so when the SDK is a shared library (the
// installed layout, wherever the app lives), next to the executable, in <executable>/../lib/cleave,
// and in the build tree's module directory.
//
// Every factory throws std::runtime_error with a clear message when its module,
// platform, GPU or driver is not present.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/device.h"

namespace cleave {

// The CPU backend (OpenBLAS + OpenMP). Never fails for lack of hardware.
std::unique_ptr<Device> make_cpu_device(const DeviceOptions& opts);

#if CLEAVE_HAVE_OPENCL
// OpenCL (CLBlast). require_gpu: refuse CPU OpenCL devices (PoCL on the host).
// Defined in the OpenCL backend's library (device/opencl), which the module
// and the tests that use OpenclDevice directly link.
std::unique_ptr<Device> make_opencl_device(const DeviceOptions& opts, bool require_gpu);
#endif

#if CLEAVE_HAVE_CUDA
// CUDA (cuBLAS), GPU number opts.ordinal. Defined in the CUDA backend's library.
std::unique_ptr<Device> make_cuda_device(const DeviceOptions& opts);
#endif

// --- backend modules ----------------------------------------------------------

// Bumped whenever device.h, tensor.h or DeviceOptions change shape: a module
// built against another version is refused instead of crashing.
inline constexpr int kBackendModuleAbi = 1;

// The function every module exports as cleave_backend_open: a device the
// caller owns (never null), or an exception saying why none could be opened.
using BackendOpenFn = Device* (*)(int abi, const DeviceOptions* opts, int require_gpu);

// "libcleave-backend-cuda.so" (the CPU backend has no module).
std::string backend_module_file(Backend backend);
// Where modules are looked for, in order (see the file comment).
std::vector<std::string> backend_module_dirs();
// Loads the module of `backend` once per process (never unloaded: devices and
// buffers may outlive their callers) and opens a device with it. Throws
// std::runtime_error naming the module and what to do when it is missing or
// does not load, and whatever the module throws when it has no device.
std::unique_ptr<Device> open_backend_module(Backend backend, const DeviceOptions& opts, bool require_gpu);

// The conv2d temporaries of the portable lowering (conv2d_lowering.cpp) that
// the GPU backends run, for conv2d_workspace_bytes.
size_t lowered_conv2d_workspace_bytes(const Window2d& g, int64_t oc);

// ASCII lower case, for names given on command lines ("CPU", "OpenCL").
std::string ascii_lower(std::string s);

}  // namespace cleave

// Defines a module's cleave_backend_open over `make(const DeviceOptions&, bool
// require_gpu)`; used once per module (device/opencl/module.cpp, device/cuda/module.cpp).
#define CLEAVE_BACKEND_MODULE(make)                                                                      \
  extern "C" __attribute__((visibility("default"))) cleave::Device* cleave_backend_open(                \
      int abi, const cleave::DeviceOptions* opts, int require_gpu) {                                     \
    if (abi != cleave::kBackendModuleAbi)                                                                \
      throw std::runtime_error("backend module built for interface version " +                          \
                               std::to_string(cleave::kBackendModuleAbi) + ", this program has version " + \
                               std::to_string(abi) + ": rebuild cleave and its modules together");      \
    return make(*opts, require_gpu != 0).release();                                                      \
  }
