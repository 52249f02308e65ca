// cublas_v2.h: emulated for scripts/cuda-emulate.sh (see emu.h).
#pragma once
#include "emu.h"
