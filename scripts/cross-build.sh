#!/usr/bin/env bash
# scripts/cross-build.sh aarch64 [--target T ...] [CMAKE_ARGS...]: cleave for
# arm64 (aarch64-linux-gnu: Jetson boards, Raspberry Pi class boards, phone
# SoCs) on an x86-64 Debian host, into ${BUILD_DIR:-build-aarch64}.
#
# Builds cleaved, cleave, the SDK and the test programs (not the benchmarks)
# with Debian's crossbuild-essential-arm64 and the arm64 multiarch -dev
# packages of every dependency; as root it installs what is missing (adding
# the arm64 architecture to dpkg first), as the other scripts do. The build's
# executables run on this host under qemu-user (qemu-user-static): CTest and
# Catch2's test discovery use it (cmake/toolchains/aarch64-linux-gnu.cmake).
#
# Backends: CPU and OpenCL (where the arm64 OpenCL and CLBlast packages are
# in). CUDA is off unless a Jetson (aarch64) CUDA toolchain is present
# (/usr/local/cuda/targets/aarch64-linux); the host's x86-64 nvcc is never used.
# CPU loops: ARMv8-A with NEON (Advanced SIMD is part of every ARMv8-A core, so
# the portable build already has it); CLEAVE_NATIVE means nothing for a
# cross build and is off; CLEAVE_TARGET_CPU=cortex-a78ae (Jetson Orin),
# cortex-a72 (Raspberry Pi 4) or cortex-a76 (Raspberry Pi 5) tunes for one core.
#
# --target T (repeatable) builds only those targets (the test command builds
# the ones it runs). --deps-only installs (or names) the packages and stops
# (scripts/package.sh arm64 uses it). SANITIZE=undefined builds with UBSan (alignment checks on
# received frames among them). JOBS=N limits parallel jobs.
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:-}
case $arch in
  aarch64 | arm64) shift ;;
  *) echo "cross-build.sh: usage: scripts/cross-build.sh aarch64 [--target T ...] [CMAKE_ARGS...]" >&2; exit 2 ;;
esac
targets=()
cmake_args=()
deps_only=0
while (($#)); do
  case $1 in
    --deps-only) deps_only=1; shift ;;
    --target) targets+=("$2"); shift 2 ;;
    --target=*) targets+=("${1#--target=}"); shift ;;
    *) cmake_args+=("$1"); shift ;;
  esac
done

# What an arm64 build needs: the cross compiler, qemu to run its programs, the
# host's code generator and header-only libraries, and each linked library's
# arm64 -dev package (multiarch: beside the host's, in /usr/lib/aarch64-linux-gnu).
host_pkgs=(crossbuild-essential-arm64 qemu-user-static cmake ninja-build pkg-config flatbuffers-compiler
           cppzmq-dev nlohmann-json3-dev libcli11-dev catch2 opencl-headers)
# libgomp1, libubsan1: the runtimes the cross compiler links against, where
# qemu's arm64 loader finds them (the cross toolchain's own copies are not).
arm64_pkgs=(libzmq3-dev libsodium-dev libopenblas-dev zlib1g-dev libflatbuffers-dev ocl-icd-opencl-dev
            libclblast-dev libgomp1 libubsan1)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${host_pkgs[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${arm64_pkgs[@]}"; do installed "$p:arm64" || missing+=("$p:arm64"); done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "cross-build.sh: missing packages: ${missing[*]}" >&2
    dpkg --print-foreign-architectures | grep -qx arm64 ||
      echo "cross-build.sh: first (as root): dpkg --add-architecture arm64 && apt-get update" >&2
    echo "cross-build.sh: then (as root): apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "cross-build.sh: installing ${missing[*]}"
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

((deps_only)) && exit 0

cuda=OFF
[[ -d /usr/local/cuda/targets/aarch64-linux ]] && cuda=AUTO
sanitize=${SANITIZE:-}
build=${BUILD_DIR:-build-aarch64}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchains/aarch64-linux-gnu.cmake" \
  -DCLEAVE_NATIVE=OFF -DCLEAVE_TARGET_CPU="${CLEAVE_TARGET_CPU:-}" -DCLEAVE_CUDA="$cuda" \
  -DCLEAVE_BUILD_BENCH=OFF -DCLEAVE_SANITIZE="$sanitize" "${launcher[@]}" "${cmake_args[@]}"
target_args=()
for t in "${targets[@]}"; do target_args+=(--target "$t"); done
cmake --build "$build" -j "${JOBS:-$(nproc)}" "${target_args[@]}"
file "$build/apps/cleaved/cleaved" 2>/dev/null || true
