// module.cpp: the entry point of libcleave-backend-cuda.so (backends.h).
#include "device/backends.h"

CLEAVE_BACKEND_MODULE([](const cleave::DeviceOptions& o, bool) { return cleave::make_cuda_device(o); })
