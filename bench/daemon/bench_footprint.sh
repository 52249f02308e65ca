#!/usr/bin/env bash
# bench/daemon/bench_footprint.sh: what a device pays to run cleaved (issue 19):
# the stripped size of the daemon (cleaved + libcleave.so.0, the SDK it is a
# program over; with OpenCL also the backend module it loads on demand), its
# resident memory idle after registration, and its peak in a real job, for
# x86-64 and for arm64 under qemu-user. Prints a table and writes JSON.
#
#   bench/daemon/bench_footprint.sh [--x86-build build] [--arm64-build build-aarch64-release]
#                                   [--runs 3] [--job-rounds 1] [--job-limit-train 960]
#                                   [--json bench-footprint.json]
#
# The x86-64 build must have bench_idle_rss (ninja -C build bench_idle_rss),
# which measures both architectures' memory: setups registered-1t and
# fed-job-1t, the same federated job of the MLP for both (--job-rounds rounds
# over --job-limit-train samples; needs Fashion-MNIST). The arm64 build is made when
# missing, as a plain Release cross build of cleaved and the OpenCL module
# (scripts/cross-build.sh; a UBSan build is refused: its size says nothing).
# Targets: stripped daemon at most 8 MB without CUDA, idle RSS at most 16 MiB.
#
# Under qemu-user an arm64 process's RSS is qemu's: the guest's pages and
# libraries plus qemu's own code, heap and translated-code cache. The arm64
# figures are therefore the guest's own resident pages: guest_maps.c, built
# here for arm64 and preloaded into the emulated daemon, hands over the
# guest's maps (as qemu shows them to the guest), and bench_idle_rss counts
# their present pages in the qemu process's page map (resident_pages.h). The
# same count over a native daemon's maps is printed beside its VmRSS as a check
# of the method. qemu's whole RSS, and qemu running an arm64 pause() program,
# are kept in the JSON for comparison.
set -euo pipefail
cd "$(dirname "$0")/../.."
x86=build
arm=build-aarch64-release
runs=3
job_rounds=1
job_limit=960
json=bench-footprint.json
while (($#)); do
  case $1 in
    --x86-build) x86=$2; shift 2 ;;
    --arm64-build) arm=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --job-rounds) job_rounds=$2; shift 2 ;;
    --job-limit-train) job_limit=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
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

echo "== resident memory (bench_idle_rss, $runs runs each; job: $job_rounds round(s) of $job_limit samples)"
job=(--job-rounds "$job_rounds" --job-limit-train "$job_limit")
"$idle_rss" --setups registered-1t,fed-job-1t --runs "$runs" "${job[@]}" --json "$tmp/rss-x86_64.json"
aarch64-linux-gnu-gcc -O2 -shared -fPIC -o "$tmp/guest_maps.so" bench/daemon/guest_maps.c
"$idle_rss" --cleaved "$arm/apps/cleaved/cleaved" --emulator "$qemu" --guest-maps "$tmp/guest_maps.so" \
  --setups registered-1t,fed-job-1t --runs "$runs" --settle 3 "${job[@]}" --json "$tmp/rss-aarch64.json"

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
import json, statistics, sys
tmp, out, cores, load = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
MB, MiB = 1e6, 1024 * 1024
base = statistics.median(json.load(open(f"{tmp}/qemu.json"))["qemu_baseline_kib"]) * 1024
rows = []
for arch in ("x86_64", "aarch64"):
    size = json.load(open(f"{tmp}/size-{arch}.json"))
    rss = {s["setup"]: s for s in json.load(open(f"{tmp}/rss-{arch}.json"))["setups"]}
    def kib(setup, key):
        s = rss.get(setup, {})
        return s["median_kib"][key] * 1024 if key in s.get("median_kib", {}) else None
    cpu = size["cleaved"] + size["libcleave"]
    emulated = arch == "aarch64"
    # Natively the daemon's memory is its VmRSS; emulated, the guest's own pages.
    key = "Pages" if emulated else "VmRSS"
    idle, job = kib("registered-1t", key), kib("fed-job-1t", key)
    rows.append({"arch": arch, "stripped_bytes": size, "daemon_cpu_bytes": cpu,
                 "daemon_cpu_opencl_bytes": cpu + size["opencl_module"],
                 "emulated": emulated, "measured_as": "guest pages under qemu-user" if emulated else "VmRSS",
                 "idle_registered_bytes": idle, "job_peak_bytes": job,
                 "idle_pages_bytes": kib("registered-1t", "Pages"), "job_peak_pages_bytes": kib("fed-job-1t", "Pages"),
                 "idle_process_rss_bytes": kib("registered-1t", "VmRSS"),
                 "job_peak_process_rss_bytes": kib("fed-job-1t", "VmRSS"),
                 "qemu_pause_rss_bytes": base if emulated else None,
                 "meets_size_target": cpu + size["opencl_module"] <= 8 * MB,
                 "meets_idle_target": idle is not None and idle <= 16 * MiB})
mib = lambda v: "-" if v is None else f"{v / MiB:.1f}"
fmt = "{:<8} {:>8} {:>14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}"
print(fmt.format("arch", "CPU MB", "CPU+OpenCL MB", "idle MiB", "pages MiB", "job MiB", "pages MiB", "size <= 8",
                 "idle <= 16"))
for r in rows:
    star = "*" if r["emulated"] else ""
    print(fmt.format(r["arch"], f"{r['daemon_cpu_bytes'] / MB:.2f}", f"{r['daemon_cpu_opencl_bytes'] / MB:.2f}",
                     mib(r["idle_registered_bytes"]) + star, mib(r["idle_pages_bytes"]),
                     mib(r["job_peak_bytes"]) + star, mib(r["job_peak_pages_bytes"]),
                     "met" if r["meets_size_target"] else "MISSED", "met" if r["meets_idle_target"] else "MISSED"))
arm = rows[1]
print("x86_64: VmRSS; 'pages' beside it counts its present pages in the page map (a check of the method)")
print(f"* aarch64 under qemu-user: the guest's own present pages; qemu's whole process held "
      f"{mib(arm['idle_process_rss_bytes'])} MiB idle and {mib(arm['job_peak_process_rss_bytes'])} MiB in the job, "
      f"qemu running pause() {base / MiB:.1f} MiB")
print(f"load {load} on {cores} cores; JSON: {out}")
json.dump({"benchmark": "footprint", "machine": {"cores": cores, "load_average_end": load}, "rows": rows,
           "raw": {arch: json.load(open(f"{tmp}/rss-{arch}.json")) for arch in ("x86_64", "aarch64")}},
          open(out, "w"), indent=2)
EOF
