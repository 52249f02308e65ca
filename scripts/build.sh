#!/usr/bin/env bash
# Configures and builds cleave into ${BUILD_DIR:-build} (Release, Ninja).
# Extra arguments go to cmake, e.g. scripts/build.sh -DCLEAVE_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@"
cmake --build "$build" -j "$(nproc)"
