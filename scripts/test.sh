#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs the whole
# test suite (CTest), then a short libFuzzer run of the message decoder under
# ASan + UBSan. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j 2 --timeout 900
if [[ -x scripts/run-fuzz.sh ]]; then
  bash scripts/run-fuzz.sh "${FUZZ_SECONDS:-30}"
fi
