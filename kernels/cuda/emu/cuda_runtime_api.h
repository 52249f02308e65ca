// cuda_runtime_api.h: emulated for scripts/cuda-emulate.sh (see emu.h).
#pragma once
#include "emu.h"
