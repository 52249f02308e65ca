#!/usr/bin/env bash
# cuda-emulate.sh: runs the CUDA backend's parity test on a machine WITHOUT a GPU,
# with the CUDA runtime, cuBLAS and kernel launches emulated on the host
# (kernels/cuda/emu/emu.h). It checks CudaDevice's argument handling, the cuBLAS
# row-major mapping and every kernel's indexing and block/warp reductions against
# the CPU backend. It does not replace scripts/cuda-check.sh on a real GPU.
#
# usage: scripts/cuda-emulate.sh [build-dir] [-- catch2 arguments]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/build-cuda-emu"
if [[ $# -gt 0 && "$1" != "--" ]]; then out="$1"; shift; fi
[[ $# -gt 0 && "$1" == "--" ]] && shift
CXX="${CXX:-g++}"
jobs="${JOBS:-2}"
mkdir -p "$out/src" "$out/obj"

command -v python3 >/dev/null || { echo "cuda-emulate: python3 is needed" >&2; exit 1; }
pkg-config --exists openblas || { echo "cuda-emulate: openblas (pkg-config) is needed" >&2; exit 1; }

sources=(
  "$root/device/cuda/cuda_device.cpp" "$root/device/cpu/cpu_device.cpp" "$root/device/cpu/cpu_conv.cpp" "$root/device/tensor.cpp"
  "$root/device/device.cpp" "$root/device/backend_registry.cpp" "$root/device/op_checks.cpp" "$root/device/conv2d_lowering.cpp"
  "$root/device/cpu/host_pool.cpp" "$root/tests/device/test_cuda_parity.cpp" "$root/tests/catch_main.cpp")
for cu in "$root"/kernels/cuda/*.cu; do
  gen="$out/src/$(basename "$cu" .cu).cpp"
  python3 "$root/kernels/cuda/emu/launch_rewrite.py" "$cu" "$gen.tmp"
  if ! cmp -s "$gen.tmp" "$gen" 2>/dev/null; then mv "$gen.tmp" "$gen"; else rm "$gen.tmp"; fi
  sources+=("$gen")
done

# CLEAVE_STATIC_BACKENDS: open_device calls the linked-in CudaDevice instead of loading its module.
flags=(-std=c++20 -O1 -g -fopenmp -DCLEAVE_HAVE_CUDA=1 -DCLEAVE_STATIC_BACKENDS=1 -I"$root/kernels/cuda/emu" -I"$root" -I"$root/tests"
       $(pkg-config --cflags openblas))
export CXX out
compile() {  # src -> obj, rebuilt when the source or any header changed
  local src="$1" obj="$out/obj/$(basename "$1").o"
  if [[ -f "$obj" ]] && [[ -z "$(find "$src" "$root/device" "$root/kernels/cuda" -newer "$obj" \( -name '*.h' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.cu' \) -print -quit)" ]]; then
    return 0
  fi
  echo "cuda-emulate: compiling $(basename "$src")"
  "$CXX" "${flags[@]}" -c "$src" -o "$obj"
}
export -f compile
export root
flags_str="${flags[*]}"
printf '%s\n' "${sources[@]}" | xargs -P "$jobs" -I{} bash -c "flags=($flags_str); $(declare -f compile); compile {}"
objs=()
for s in "${sources[@]}"; do objs+=("$out/obj/$(basename "$s").o"); done
"$CXX" -fopenmp -o "$out/test_cuda_parity_emu" "${objs[@]}" $(pkg-config --libs openblas)
echo "cuda-emulate: running $out/test_cuda_parity_emu $*"
"$out/test_cuda_parity_emu" "$@"
