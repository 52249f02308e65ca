#!/usr/bin/env bash
# cuda-check.sh: one command for a machine with an NVIDIA GPU. Builds cleave with
# the CUDA backend into build-cuda, runs the CUDA parity suite (every op, forward
# and backward, against the CPU backend) and the device benchmarks on CUDA, and
# prints a short table. Logs, the full parity list and bench JSON go to
# build-cuda/cuda-check/; summary.md there is ready to paste into docs/backends.md.
#
# usage: scripts/cuda-check.sh            (as root it first installs missing Debian build deps)
# env:   BUILD_DIR (default <repo>/build-cuda), JOBS (default: all cores),
#        CUDA_ARCHS (default "native": the GPUs of this machine), SKIP_BENCH=1
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-cuda}"
jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
archs="${CUDA_ARCHS:-native}"
logs="$build/cuda-check"
say() { printf 'cuda-check: %s\n' "$*"; }
die() { printf 'cuda-check: error: %s\n' "$*" >&2; exit 1; }

# --- 1. build dependencies (Debian / Ubuntu) -----------------------------------------------
deps=(build-essential cmake ninja-build pkg-config libzmq3-dev cppzmq-dev libsodium-dev
      libflatbuffers-dev flatbuffers-compiler libclblast-dev ocl-icd-opencl-dev opencl-headers
      libopenblas-dev zlib1g-dev nlohmann-json3-dev libcli11-dev catch2 python3)
if command -v dpkg-query >/dev/null; then
  missing=()
  for p in "${deps[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
      say "installing missing packages: ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
      say "warning: packages not installed: ${missing[*]} (run as root to install them; continuing)"
    fi
  fi
fi

# --- 2. CUDA toolkit and GPU -------------------------------------------------------------------
nvcc="$(command -v nvcc || true)"
[[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n "$nvcc" ]] || die "nvcc not found: install the CUDA toolkit (or put its bin/ on PATH)"
say "nvcc: $("$nvcc" --version | tail -n 2 | head -n 1)"
if command -v nvidia-smi >/dev/null; then
  gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 || true)"
  [[ -n "$gpu" ]] && say "GPU: $gpu" || say "warning: nvidia-smi sees no GPU; the [cuda] tests will skip"
else
  gpu=""
  say "warning: nvidia-smi not found; the [cuda] tests will skip if no GPU is usable"
fi

# --- 3. configure and build --------------------------------------------------------------------
mkdir -p "$logs"
say "configuring $build (CLEAVE_CUDA=ON, CUDA architectures: $archs)"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCLEAVE_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$archs" >"$logs/configure.log" 2>&1 ||
  { tail -n 30 "$logs/configure.log" >&2; die "cmake configure failed (full log: $logs/configure.log)"; }
benches=()
if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
  mapfile -t benches < <(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's/^\(bench_[A-Za-z0-9_]*\): .*/\1/p' | sort -u)
fi
say "building test_cuda_parity ${benches[*]} with $jobs jobs"
ninja -C "$build" -j "$jobs" test_cuda_parity "${benches[@]}" >"$logs/build.log" 2>&1 ||
  { tail -n 40 "$logs/build.log" >&2; die "build failed (full log: $logs/build.log)"; }

# --- 4. parity suite ----------------------------------------------------------------------------
test_bin="$(find "$build" -type f -name test_cuda_parity -perm -u+x | head -n 1)"
[[ -n "$test_bin" ]] || die "test_cuda_parity was not built"
say "running $test_bin"
status=0
timeout 1200 "$test_bin" --use-colour no >"$logs/parity.log" 2>&1 || status=$?
grep '^PARITY ' "$logs/parity.log" >"$logs/parity.txt" || true
# A [cuda] case without a GPU prints "SKIP: <case>: no CUDA device: <why>" and the
# binary exits 77 (tests/skip.h).
if [[ "$status" == 77 ]] || grep -q '^SKIP: ' "$logs/parity.log"; then
  grep -m1 '^SKIP: ' "$logs/parity.log" >&2
  die "no usable CUDA GPU: the parity tests skipped (log: $logs/parity.log)"
fi
[[ -s "$logs/parity.txt" ]] || { tail -n 30 "$logs/parity.log" >&2; die "the parity test printed no results"; }

# One row per op (sizes folded together): cases, worst error, tolerance, pass.
table="$(awk '
  /^PARITY / {
    key = ""; err = ""; tol = ""; ok = ""
    for (i = 2; i <= NF; i++) {
      if ($i == "max_err") { err = $(i + 1); tol = $(i + 3); ok = $(i + 4); break }
      if (stop == 0 && $i !~ /^[0-9]/ && $i !~ /=/) key = key (key == "" ? "" : " ") $i; else stop = 1
    }
    stop = 0
    if (!(key in n)) { order[++k] = key; worst[key] = 0; allok[key] = 1 }
    n[key]++; t[key] = tol
    if (err + 0 > worst[key] + 0 || err == "inf") worst[key] = err
    if (ok != "pass") allok[key] = 0
  }
  END {
    printf "| %-34s | %5s | %-9s | %-5s | %-4s |\n", "op", "cases", "max error", "tol", "pass"
    printf "|%s|%s|%s|%s|%s|\n", "------------------------------------", "-------", "-----------", "-------", "------"
    for (j = 1; j <= k; j++) { o = order[j]
      printf "| %-34s | %5d | %-9s | %-5s | %-4s |\n", o, n[o], worst[o], t[o], allok[o] ? "yes" : "NO" }
  }' "$logs/parity.txt")"
fails="$(grep -c ' FAIL$' "$logs/parity.txt" || true)"
total="$(wc -l <"$logs/parity.txt")"
echo
echo "$table"
echo
say "parity: $((total - fails)) of $total comparisons within tolerance; Catch2 exit status $status"
tail -n 3 "$logs/parity.log" | sed 's/^/  /'

# --- 5. benchmarks on CUDA ------------------------------------------------------------------------
bench_rows=""
for b in "${benches[@]}"; do
  bin="$(find "$build" -type f -name "$b" -perm -u+x | head -n 1)"
  [[ -n "$bin" ]] || continue
  help="$("$bin" --help 2>&1 || true)"
  args=()
  if grep -q -- '--backend' <<<"$help"; then args+=(--backend cuda)
  elif grep -q -- '--device' <<<"$help"; then args+=(--device cuda)
  else say "skipping $b (it has no --backend/--device option)"; continue; fi
  grep -q -- '--json' <<<"$help" && args+=(--json "$logs/$b.json")
  say "running $b ${args[*]}"
  if timeout 600 "$bin" "${args[@]}" >"$logs/$b.log" 2>&1; then
    sed 's/^/  /' "$logs/$b.log" | tail -n 25
    bench_rows+="- $b: ok (log $logs/$b.log)"$'\n'
  else
    say "warning: $b failed (log: $logs/$b.log)"; tail -n 10 "$logs/$b.log" | sed 's/^/  /'
    bench_rows+="- $b: FAILED (log $logs/$b.log)"$'\n'
    status=1
  fi
done

# --- 6. summary for docs/backends.md -----------------------------------------------------------
{
  echo "### CUDA check, $(date -u +%Y-%m-%d) on ${gpu:-unknown GPU}"
  echo
  echo "nvcc: $("$nvcc" --version | tail -n 2 | head -n 1); architectures: $archs;" \
       "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "$table"
  echo
  echo "Parity: $((total - fails)) of $total comparisons within tolerance."
  [[ -n "$bench_rows" ]] && { echo; echo "$bench_rows"; }
} >"$logs/summary.md"
say "summary for docs/backends.md: $logs/summary.md"
if [[ "$fails" -gt 0 || "$status" -ne 0 ]]; then die "CUDA check FAILED ($fails parity failures, status $status)"; fi
say "CUDA check passed"
