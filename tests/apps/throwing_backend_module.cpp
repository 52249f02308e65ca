// throwing_backend_module.cpp: a backend module (device/backends.h) that has
// no device and says so by throwing, as the CUDA module does on a machine
// without a driver. Built as libcleave-backend-opencl.so in its own directory
// for test_backend_module_errors.cpp, which points CLEAVE_BACKEND_DIR at it.
#include <memory>
#include <stdexcept>

#include "device/backends.h"

namespace {

std::unique_ptr<cleave::Device> no_device(const cleave::DeviceOptions&, bool) {
  throw std::runtime_error("the throwing test module has no device (tests/apps/throwing_backend_module.cpp)");
}

}  // namespace

CLEAVE_BACKEND_MODULE(no_device)
