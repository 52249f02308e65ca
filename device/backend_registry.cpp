// backend_registry.cpp: the backends this build has, open_device over them, and
// the per-backend workspace bounds of the memory model (device.h).
//
// The GPU backends are reached through their modules (backend_modules.cpp). A
// build that links them in instead (scripts/cuda-emulate.sh) defines
// CLEAVE_STATIC_BACKENDS=1 and calls their factories directly.
#include <stdexcept>

#include "device/backends.h"
#include "device/cpu/cpu_device.h"
#include "device/device.h"

namespace cleave {

size_t conv2d_workspace_bytes(Backend backend, const Window2d& g, int64_t oc) {
  return backend == Backend::cpu ? CpuDevice::conv2d_workspace_bytes(g, oc) : lowered_conv2d_workspace_bytes(g, oc);
}

size_t bias_grad_rows_workspace_bytes(Backend backend, int64_t rows, int64_t features) {
  return backend == Backend::cpu ? CpuDevice::bias_grad_rows_workspace_bytes(rows, features) : 0;
}

size_t layernorm_backward_workspace_bytes(Backend backend, int64_t rows, int64_t cols) {
  return backend == Backend::cpu ? CpuDevice::layernorm_backward_workspace_bytes(rows, cols) : 0;
}

std::vector<Backend> compiled_backends() {
  std::vector<Backend> out;
#if CLEAVE_HAVE_CUDA
  out.push_back(Backend::cuda);
#endif
#if CLEAVE_HAVE_OPENCL
  out.push_back(Backend::opencl);
#endif
  out.push_back(Backend::cpu);
  return out;
}

namespace {

std::string compiled_list() {
  std::string s;
  for (Backend b : compiled_backends()) {
    if (!s.empty()) s += ", ";
    s += backend_name(b);
  }
  return s;
}

bool compiled(Backend b) {
  for (Backend c : compiled_backends())
    if (c == b) return true;
  return false;
}

// A GPU backend's device, from its module (or, in a static build, its factory).
std::unique_ptr<Device> open_gpu(Backend b, const DeviceOptions& opts, bool require_gpu) {
#if CLEAVE_STATIC_BACKENDS
#if CLEAVE_HAVE_CUDA
  if (b == Backend::cuda) return make_cuda_device(opts);
#endif
#if CLEAVE_HAVE_OPENCL
  if (b == Backend::opencl) return make_opencl_device(opts, require_gpu);
#endif
  throw std::logic_error("open_gpu: backend not linked in");
#else
  return open_backend_module(b, opts, require_gpu);
#endif
}

}  // namespace

std::unique_ptr<Device> open_device(const std::string& name, const DeviceOptions& opts) {
  const std::string n = ascii_lower(name);
  if (n == "cpu") return make_cpu_device(opts);
  if (n == "auto") {
    // Each GPU backend in turn; one that has no usable GPU (or whose module or
    // libraries are missing) gives way to the next, and the CPU always works.
    for (Backend b : compiled_backends()) {
      if (b == Backend::cpu) break;
      try {
        return open_gpu(b, opts, /*require_gpu=*/true);
      } catch (const std::exception&) {
        // no usable device of this backend: fall through
      }
    }
    return make_cpu_device(opts);
  }
  const std::optional<Backend> b = backend_named(n);
  if (!b) throw std::runtime_error("unknown device '" + name + "' (this build has: auto, " + compiled_list() + ")");
  if (!compiled(*b))
    throw std::runtime_error("device '" + n + "' is not compiled into this build (available: auto, " +
                             compiled_list() + ")");
  return open_gpu(*b, opts, /*require_gpu=*/false);
}

}  // namespace cleave
