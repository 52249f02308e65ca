#!/usr/bin/env bash
# Installs cleave's build and run dependencies from Debian 12 packages (as root).
# Skips apt entirely when everything is already installed.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git ca-certificates
      libzmq3-dev cppzmq-dev libsodium-dev libflatbuffers-dev flatbuffers-compiler
      libclblast-dev ocl-icd-opencl-dev opencl-headers pocl-opencl-icd
      libopenblas-dev zlib1g-dev nlohmann-json3-dev libcli11-dev catch2
      dataset-fashion-mnist fortunes clang libclang-rt-14-dev python3
      file)  # file: CPack's DEB generator (tests/packaging; dpkg-dev comes with build-essential)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "cleave: missing packages: ${missing[*]}" >&2
    echo "cleave: run as root (or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "cleave: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
