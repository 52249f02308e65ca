#!/usr/bin/env bash
# bench/daemon/bench_footprint.sh: what a device pays to run cleaved (issue 19):
# the stripped size of the daemon (cleaved + libcleave.so.0, the SDK it is a
# program over; with OpenCL also the backend module it loads on demand), its
# resident memory idle after registration, and its peak in a real job, for
# x86-64 and for arm64 under qemu-user. Prints a table and writes JSON.
#
#   bench/daemon/bench_footprint.sh [--x86-build build] [--arm64-build build-aarch64-release]
#                                   [--runs 3] [--arm64-job] [--json bench-footprint.json]
#
# The x86-64 build must have bench_idle_rss (ninja -C build bench_idle_rss),
# which measures both architectures' memory (setups registered-1t and
# fed-job-1t; the job needs Fashion-MNIST; for arm64 the job only with
# --arm64-job: under qemu its 3 rounds take well over 10 minutes). The arm64 build is made when
# missing, as a plain Release cross build of cleaved and the OpenCL module
# (scripts/cross-build.sh; a UBSan build is refused: its size says nothing).
# Targets: stripped daemon at most 8 MB without CUDA, idle RSS at most 16 MiB.
#
# Under qemu-user an arm64 process's memory is qemu's: the guest's pages and
# libraries plus qemu's own code, heap and translated-code cache. The bench
# therefore also measures qemu running a minimal arm64 program (pause()) and
# reports the daemon's RSS minus that as the estimate for the board; the
# translated-code cache (which grows with the code the daemon has run) stays
# in it, so the estimate is high rather than low.
set -euo pipefail
cd "$(dirname "$0")/../.."
x86=build
arm=build-aarch64-release
runs=3
arm_setups=registered-1t
json=bench-footprint.json
while (($#)); do
  case $1 in
    --x86-build) x86=$2; shift 2 ;;
    --arm64-build) arm=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --arm64-job) arm_setups=registered-1t,fed-job-1t; shift ;;
    --json) json=$2; shift 2 ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "bench_footprint.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
idle_rss=$x86/bench/daemon/bench_idle_rss
[[ -x $idle_rss ]] || { echo "bench_footprint.sh: no $idle_rss: ninja -C $x86 bench_idle_rss cleaved cleave" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [[ ! -x $arm/apps/cleaved/cleaved ]]; then
  BUILD_DIR=$arm bash scripts/cross-build.sh aarch64 --target cleaved --target cleave-backend-opencl
fi
if grep -q '^CLEAVE_SANITIZE:STRING=.*undefined' "$arm/CMakeCache.txt"; then
  echo "bench_footprint.sh: $arm is a UBSan build; give --arm64-build a plain one (the default makes it)" >&2
  exit 1
fi
qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
[[ -n $qemu ]] || { echo "bench_footprint.sh: no qemu-aarch64: apt-get install qemu-user-static" >&2; exit 1; }

# stripped_bytes STRIP FILE: the size of FILE once stripped of symbols and debug info.
stripped_bytes() { "$1" --strip-unneeded -o "$tmp/s" "$2" && stat -c %s "$tmp/s"; }
sizes() {  # sizes ARCH BUILD STRIP: one JSON object of stripped sizes
  local cleaved lib ocl
  cleaved=$(stripped_bytes "$3" "$2/apps/cleaved/cleaved")
  lib=$(stripped_bytes "$3" "$(readlink -f "$2/sdk/libcleave.so.0")")
  ocl=0
  [[ -f $2/backends/libcleave-backend-opencl.so ]] && ocl=$(stripped_bytes "$3" "$2/backends/libcleave-backend-opencl.so")
  echo "{\"arch\": \"$1\", \"cleaved\": $cleaved, \"libcleave\": $lib, \"opencl_module\": $ocl}"
}
echo "== stripped sizes"
sizes x86_64 "$x86" strip >"$tmp/size-x86_64.json"
sizes aarch64 "$arm" aarch64-linux-gnu-strip >"$tmp/size-aarch64.json"
cat "$tmp"/size-*.json

echo "== resident memory (bench_idle_rss, $runs runs each)"
"$idle_rss" --setups registered-1t,fed-job-1t --runs "$runs" --json "$tmp/rss-x86_64.json"
"$idle_rss" --cleaved "$arm/apps/cleaved/cleaved" --emulator "$qemu" --setups "$arm_setups" \
  --runs "$runs" --settle 3 --json "$tmp/rss-aarch64.json"

# qemu's own memory: qemu running an arm64 program that only waits.
printf '#include <unistd.h>\nint main(void) { pause(); return 0; }\n' >"$tmp/pause.c"
aarch64-linux-gnu-gcc -O2 -o "$tmp/pause" "$tmp/pause.c"
base=()
for _ in $(seq "$runs"); do
  "$qemu" "$tmp/pause" & pid=$!
  sleep 1
  base+=("$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")")
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
echo "{\"qemu_baseline_kib\": [$(IFS=,; echo "${base[*]}")]}" >"$tmp/qemu.json"

python3 - "$tmp" "$json" "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)" <<'EOF'
import json, statistics, sys, os
tmp, out, cores, load = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
MB, MiB = 1e6, 1024 * 1024
base = statistics.median(json.load(open(f"{tmp}/qemu.json"))["qemu_baseline_kib"]) * 1024
rows = []
for arch in ("x86_64", "aarch64"):
    size = json.load(open(f"{tmp}/size-{arch}.json"))
    rss = {s["setup"]: s for s in json.load(open(f"{tmp}/rss-{arch}.json"))["setups"]}
    def kib(setup, key):
        s = rss.get(setup, {})
        return s["median_kib"][key] * 1024 if "median_kib" in s else None
    cpu = size["cleaved"] + size["libcleave"]
    idle, job = kib("registered-1t", "VmRSS"), kib("fed-job-1t", "VmRSS")
    emulated = arch == "aarch64"
    idle_board = idle - base if emulated and idle is not None else idle
    rows.append({"arch": arch, "stripped_bytes": size, "daemon_cpu_bytes": cpu,
                 "daemon_cpu_opencl_bytes": cpu + size["opencl_module"],
                 "idle_registered_rss_bytes": idle, "job_peak_rss_bytes": job,
                 "emulated": emulated, "qemu_baseline_rss_bytes": base if emulated else None,
                 "idle_rss_estimate_bytes": idle_board,
                 "job_peak_rss_estimate_bytes": job - base if emulated and job is not None else job,
                 "meets_size_target": cpu + size["opencl_module"] <= 8 * MB,
                 "meets_idle_target": idle_board is not None and idle_board <= 16 * MiB})
fmt = "{:<8} {:>14} {:>16} {:>14} {:>14} {:>12} {:>12}"
print(fmt.format("arch", "CPU MB", "CPU+OpenCL MB", "idle MiB", "job MiB", "size <= 8 MB", "idle <= 16"))
for r in rows:
    mib = lambda v: "-" if v is None else f"{v / MiB:.1f}"
    idle = mib(r["idle_rss_estimate_bytes"]) + ("*" if r["emulated"] else "")
    job = mib(r["job_peak_rss_estimate_bytes"]) + ("*" if r["emulated"] else "")
    print(fmt.format(r["arch"], f"{r['daemon_cpu_bytes'] / MB:.2f}", f"{r['daemon_cpu_opencl_bytes'] / MB:.2f}",
                     idle, job, "met" if r["meets_size_target"] else "MISSED", "met" if r["meets_idle_target"] else "MISSED"))
print(f"* under qemu-user: qemu's RSS minus qemu running pause() ({base / MiB:.1f} MiB); "
      f"load {load} on {cores} cores; JSON: {out}")
json.dump({"benchmark": "footprint", "machine": {"cores": cores, "load_average_end": load}, "rows": rows,
           "raw": {arch: json.load(open(f"{tmp}/rss-{arch}.json")) for arch in ("x86_64", "aarch64")}},
          open(out, "w"), indent=2)
EOF
