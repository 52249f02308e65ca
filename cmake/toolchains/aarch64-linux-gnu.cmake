# Toolchain file: cross-compile cleave for arm64 (aarch64-linux-gnu) on a Debian
# host with crossbuild-essential-arm64 and the arm64 multiarch -dev packages of
# every dependency (scripts/cross-build.sh installs them). Libraries come from
# /usr/lib/aarch64-linux-gnu, headers from /usr/include (Debian's multiarch
# layout), host tools (flatc, the generators) from the host's PATH. Executables
# built here run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), which CTest
# and Catch2's test discovery use, so the arm64 tests run on the x86-64 host.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

find_program(CLEAVE_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(CLEAVE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${CLEAVE_QEMU_AARCH64})
endif()

# pkg-config must read the arm64 .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
