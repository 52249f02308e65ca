// module.cpp: the entry point of libcleave-backend-opencl.so (backends.h).
#include "device/backends.h"

CLEAVE_BACKEND_MODULE(cleave::make_opencl_device)
