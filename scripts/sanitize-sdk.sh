#!/usr/bin/env bash
# sanitize-sdk.sh: the SDK's misuse and live tests (tests/sdk, test_sdk) under
# AddressSanitizer + UndefinedBehaviorSanitizer (issue 14). Builds into
# ${SAN_BUILD_DIR:-build-asan} with CLEAVE_SANITIZE="address;undefined" only
# what test_sdk needs (libcleave.so, cleave, cleaved, the examples), then runs
# every [sdk] case; any ASan or UBSan report fails the run (halt_on_error).
# Leak checking is on. Exits non-zero on any failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SAN_BUILD_DIR:-$root/build-asan}"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCLEAVE_SANITIZE=address;undefined" \
  -DCLEAVE_BUILD_BENCH=OFF -DCLEAVE_NATIVE=OFF "${launcher[@]}" >/dev/null
ninja -C "$build" -j "${JOBS:-2}" test_sdk
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMP_WAIT_POLICY=passive  # no re-exec of cleaved under the sanitizers
"$build/tests/sdk/test_sdk" "[sdk]" --durations yes
echo "sanitize-sdk.sh: the SDK's tests are clean under ASan + UBSan"
