#!/usr/bin/env bash
# scripts/package.sh [amd64|arm64] [CMAKE_ARGS...]: cleave's Debian packages
# (docs/deploy.md, "Packages"; cmake/Packaging.cmake says what goes where).
# Configures a Release build with the prefix /usr into
# ${BUILD_DIR:-build-package} (build-package-arm64 for arm64), builds it, runs
# `cpack -G DEB` and lists the .debs (in BUILD_DIR/packages).
#
# The build is for any CPU of the architecture (CLEAVE_NATIVE=OFF), hardened
# like Debian's own builds (dpkg-buildflags, without its -g -O2: Release's -O3
# stays), without tests and benchmarks. OpenCL is in where OpenCL and CLBlast
# are installed (a cleave-opencl package); CUDA is off (CLEAVE_CUDA=ON to try:
# the CUDA libraries of NVIDIA's installer belong to no Debian package, so
# cleave-cuda's Depends would not name them). Libraries go to /usr/lib, not the
# multiarch directory: `cleave` finds the backend modules in ../lib/cleave.
#
# arm64 is a cross build (aarch64-linux-gnu, cmake/toolchains/): it needs
# Debian's cross compiler and the arm64 -dev packages of the dependencies,
# which scripts/cross-build.sh installs as root (or names, exiting 1).
# JOBS=N limits the build's parallel jobs.
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(dpkg --print-architecture)
arch=$host
if [[ $# -gt 0 && $1 != -* ]]; then
  arch=$1
  shift
fi
case $arch in
  amd64 | arm64) ;;
  *) echo "package.sh: architecture '$arch': amd64 or arm64" >&2; exit 2 ;;
esac
build=${BUILD_DIR:-build-package}
if [[ $arch != "$host" && -z ${BUILD_DIR:-} ]]; then build=build-package-$arch; fi

for tool in cmake cpack ninja dpkg-shlibdeps file; do
  command -v $tool >/dev/null || { echo "package.sh: $tool is missing (scripts/install-deps.sh; dpkg-shlibdeps: apt-get install dpkg-dev)" >&2; exit 1; }
done

cross=()
if [[ $arch != "$host" ]]; then
  [[ $arch == arm64 ]] || { echo "package.sh: cross builds are for arm64 only" >&2; exit 2; }
  # The cross compiler and the arm64 -dev packages: scripts/cross-build.sh
  # installs them as root, or names them and exits 1.
  bash scripts/cross-build.sh aarch64 --deps-only
  cross=("-DCMAKE_TOOLCHAIN_FILE=$PWD/cmake/toolchains/aarch64-linux-gnu.cmake" -DCLEAVE_CUDA=OFF)
  # dpkg-shlibdeps (run by CPack) reads the arm64 binaries with the host's view of arm64.
  export DEB_HOST_ARCH=arm64
fi

# Debian's hardening flags for the target architecture, less -g and -O2.
flags() { DEB_HOST_ARCH=$arch DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get "$1" | sed 's/ *-g\b//; s/ *-O2\b//'; }
cppflags=$(flags CPPFLAGS)

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_LIBDIR=lib \
  -DCLEAVE_NATIVE=OFF -DCLEAVE_BUILD_TESTS=OFF -DCLEAVE_BUILD_BENCH=OFF -DCLEAVE_CUDA="${CLEAVE_CUDA:-OFF}" \
  -DCMAKE_C_FLAGS="$cppflags $(flags CFLAGS)" -DCMAKE_CXX_FLAGS="$cppflags $(flags CXXFLAGS)" \
  -DCMAKE_EXE_LINKER_FLAGS="$(flags LDFLAGS)" -DCMAKE_SHARED_LINKER_FLAGS="$(flags LDFLAGS)" \
  -DCMAKE_MODULE_LINKER_FLAGS="$(flags LDFLAGS)" "${cross[@]}" "$@"
cmake --build "$build" -j "${JOBS:-$(nproc)}"
rm -rf "$build/packages"
(cd "$build" && cpack -G DEB -B "$PWD/packages")
ls -l "$build"/packages/*.deb
for deb in "$build"/packages/*.deb; do
  echo "$(dpkg-deb --field "$deb" Package): $(dpkg-deb --field "$deb" Depends)"
done
