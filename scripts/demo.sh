#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the main
# job — `cleave demo`: three encrypted cleaved daemons on loopback train the CNN
# on Fashion-MNIST as a pipeline, then accuracy and throughput are printed.
# Extra arguments go to `cleave demo` (e.g. --epochs 1 --json demo.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bin=${BUILD_DIR:-build}/apps/cleave/cleave
if "$bin" demo --help >/dev/null 2>&1; then
  exec "$bin" demo "$@"
else
  echo "cleave: 'cleave demo' is not in this build yet; running single-process training instead" >&2
  exec "$bin" train --local --model models/cnn.json --dataset fashion-mnist --epochs 2 --batch 64 \
    --optimizer adam --lr 0.001 --seed 1 "$@"
fi
