#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the main
# job — `cleave demo`: three encrypted cleaved daemons on loopback train the CNN
# on Fashion-MNIST as a pipeline, then accuracy and throughput are printed.
# Extra arguments go to `cleave demo` (e.g. --epochs 1 --json demo.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec "${BUILD_DIR:-build}/apps/cleave/cleave" demo "$@"
