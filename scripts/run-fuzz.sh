#!/usr/bin/env bash
# run-fuzz.sh [SECONDS=30]: coverage-guided fuzzing of cleave's message decoder
# (transport/message.cpp + command_codec.cpp + codec.cpp) with libFuzzer, ASan and UBSan.
# Builds only the decoder sources and the flatc-generated header into
# build-fuzz/ (seconds, not a project build), seeds a working corpus from
# tests/fuzz/corpus, and exits non-zero on any crash, leak or UB report.
# Env: CXX (default clang++), FUZZ_BUILD_DIR (default <repo>/build-fuzz), JOBS (default 1).
set -euo pipefail

seconds="${1:-30}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: $0 [SECONDS]  (a positive integer, default 30)" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
cxx="${CXX:-clang++}"
command -v "$cxx" >/dev/null || { echo "run-fuzz.sh: $cxx not found (install clang)" >&2; exit 2; }
command -v flatc >/dev/null || { echo "run-fuzz.sh: flatc not found" >&2; exit 2; }

mkdir -p "$build/gen/transport/schema" "$build/corpus" "$build/artifacts"
flatc --cpp --scoped-enums -o "$build/gen/transport/schema" "$root/transport/schema/cleave.fbs"

bin="$build/fuzz_message_decoder"
sources=("$root/tests/fuzz/fuzz_message_decoder.cpp" "$root/transport/message.cpp" "$root/transport/codec.cpp"
         "$root/transport/command_codec.cpp")
needs_build=0
[ -x "$bin" ] || needs_build=1
for f in "${sources[@]}" "$root/transport/message.h" "$root/transport/codec.h" "$root/transport/result.h" \
         "$root/transport/command_codec.h" \
         "$root/tests/fuzz/fuzz_input.h" "$build/gen/transport/schema/cleave_generated.h"; do
  [ "$f" -nt "$bin" ] && needs_build=1
done
if [ "$needs_build" = 1 ]; then
  echo "run-fuzz.sh: building $bin"
  "$cxx" -std=c++20 -g -O1 -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root" -isystem "$build/gen" "${sources[@]}" -o "$bin"
fi

cp -n "$root"/tests/fuzz/corpus/* "$build/corpus/" 2>/dev/null || true
echo "run-fuzz.sh: fuzzing for ${seconds}s (corpus $build/corpus)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
parallel=()
jobs="${JOBS:-1}"
if [ "$jobs" -gt 1 ]; then parallel=(-jobs="$jobs" -workers="$jobs"); fi
cd "$build"  # libFuzzer writes fuzz-N.log files into the working directory with -jobs
"$bin" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  "${parallel[@]}" -print_final_stats=1 -artifact_prefix="$build/artifacts/" "$build/corpus"
echo "run-fuzz.sh: clean (no crash in ${seconds}s)"
