#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs the whole
# test suite (CTest), then a short libFuzzer run of the message decoder under
# ASan + UBSan. Exits non-zero on any failure.
#
# On an x86-64 host it also cross-builds cleaved and the device, nn and
# transport tests for arm64 with UBSan (scripts/cross-build.sh, into
# ${ARM64_BUILD_DIR:-build-aarch64}) before the suite, so that the suite's
# test_arm64_daemon runs that daemon under qemu in an x86-64 pipeline, and
# after the suite runs those arm64 tests under qemu. CLEAVE_ARM64=0 leaves
# arm64 out (test_arm64_daemon then skips, saying so).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

arm64=0
if [[ ${CLEAVE_ARM64:-1} != 0 && $(uname -m) == x86_64 ]]; then arm64=1; fi
arm64_tests=(test_cpu_device test_op_checks test_host_pool test_fast_math test_nn test_transport)
if ((arm64)); then
  export CLEAVE_ARM64_BUILD_DIR=${ARM64_BUILD_DIR:-$PWD/build-aarch64}
  targets=(cleaved "${arm64_tests[@]}")
  SANITIZE=undefined BUILD_DIR=$CLEAVE_ARM64_BUILD_DIR bash scripts/cross-build.sh aarch64 "${targets[@]/#/--target=}"
fi

ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j 2 --timeout 900
if ((arm64)); then
  labels=$(IFS='|'; echo "^(${arm64_tests[*]})\$")
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir "$CLEAVE_ARM64_BUILD_DIR" --output-on-failure -j 2 --timeout 900 -L "$labels"
fi
if [[ -x scripts/run-fuzz.sh ]]; then
  bash scripts/run-fuzz.sh "${FUZZ_SECONDS:-30}"
fi
