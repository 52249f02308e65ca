# Packaging.cmake: Debian packages of the install tree (cmake/Install.cmake),
# built with `cpack -G DEB` (scripts/package.sh; docs/deploy.md, "Packages").
# One package per install component, so a device installs only what it runs:
#   libcleave0     runtime  lib/libcleave.so.0*: the SDK, which cleaved is built on
#   cleaved        daemon   bin/cleaved, lib/systemd/system/cleaved.service,
#                           /etc/cleave/cleaved.conf (a conffile), the example
#   cleave         cli      bin/cleave (self-contained: no libcleave0), share/cleave/models
#   libcleave-dev  dev      headers, libcleave.so, libcleave.a, CMake package, cleave.pc, examples
#   cleave-opencl  opencl   lib/cleave/libcleave-backend-opencl.so (only where it was built)
#   cleave-cuda    cuda     lib/cleave/libcleave-backend-cuda.so (only where it was built;
#                           scripts/package.sh builds with CLEAVE_CUDA=OFF)
# Dependencies on Debian's libraries come from dpkg-shlibdeps; those between
# cleave's own packages are exact versions. A package is native (version =
# the project's version, no Debian revision): it is built from this tree.
# Files only a package needs (its copyright and changelog, the conffile) are
# EXCLUDE_FROM_ALL: CPack installs each component on its own and gets them,
# a plain `cmake --install` does not (`--component daemon` does, and writes the
# conffile to $DESTDIR/etc/cleave: for packaging only).

set(CLEAVE_PACKAGE_MAINTAINER "cleave maintainers <maintainers@users.noreply.a-seed-7e734e51.example>"
    CACHE STRING "The packages' Maintainer field")
set(CLEAVE_PACKAGE_HOMEPAGE "" CACHE STRING "The packages' Homepage field (left out when empty)")

# The packages' names, by install component.
set(_cleave_deb_runtime libcleave0)
set(_cleave_deb_daemon cleaved)
set(_cleave_deb_cli cleave)
set(_cleave_deb_dev libcleave-dev)
set(_cleave_deb_opencl cleave-opencl)
set(_cleave_deb_cuda cleave-cuda)
set(_cleave_deb_components runtime daemon cli dev)
foreach(backend opencl cuda)
  if(TARGET cleave-backend-${backend})
    list(APPEND _cleave_deb_components ${backend})
  endif()
endforeach()

# /usr/share/doc/PACKAGE/{copyright,changelog.gz} for each package (Debian
# policy 12.5 and 12.7; lintian's no-copyright-file and no-changelog errors).
string(TIMESTAMP _cleave_deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)  # honours SOURCE_DATE_EPOCH
string(TIMESTAMP CLEAVE_COPYRIGHT_YEAR "%Y" UTC)
find_program(CLEAVE_GZIP gzip REQUIRED)
set(_cleave_deb_doc ${PROJECT_BINARY_DIR}/packaging/doc)
foreach(component IN LISTS _cleave_deb_components)
  set(package ${_cleave_deb_${component}})
  set(dir ${_cleave_deb_doc}/${package})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/deb/copyright.in ${dir}/copyright @ONLY)
  file(WRITE ${dir}/changelog
       "${package} (${PROJECT_VERSION}) unstable; urgency=medium\n\n"
       "  * Built by CPack from the cleave source tree (cmake/Packaging.cmake);\n"
       "    the project's history is its git log.\n\n"
       " -- ${CLEAVE_PACKAGE_MAINTAINER}  ${_cleave_deb_date}\n")
  execute_process(COMMAND ${CLEAVE_GZIP} -9nf ${dir}/changelog COMMAND_ERROR_IS_FATAL ANY)
  install(FILES ${dir}/copyright ${dir}/changelog.gz DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${package}
          COMPONENT ${component} EXCLUDE_FROM_ALL)
endforeach()

# The daemon's configuration as a conffile: dpkg keeps the admin's edits on
# upgrade. It is the example; the unit refuses to start until it names a
# real coordinator and keys (ExecStartPre: --check-config).
install(FILES ${PROJECT_SOURCE_DIR}/apps/cleaved/cleaved.conf.example DESTINATION /etc/cleave RENAME cleaved.conf
        COMPONENT daemon EXCLUDE_FROM_ALL)

# --- CPack ------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME cleave)
set(CPACK_PACKAGE_VENDOR "cleave")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${CLEAVE_PACKAGE_MAINTAINER}")
if(CLEAVE_PACKAGE_HOMEPAGE)
  set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${CLEAVE_PACKAGE_HOMEPAGE}")
endif()
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_COMPONENTS_ALL ${_cleave_deb_components})
set(CPACK_DEB_COMPONENT_INSTALL ON)

set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CLEAVE_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # NAME_VERSION_ARCH.deb
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# cleaved needs libcleave.so.0, which lies in another package's staging tree:
# dpkg-shlibdeps finds it in the build tree (and names no package for it; the
# exact libcleave0 dependency below does).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/sdk)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
# A cross build's packages are for its target, not for the building machine.
if(CMAKE_CROSSCOMPILING)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
    set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
  elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64)$")
    set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE amd64)
  else()
    message(FATAL_ERROR "cleave: no Debian architecture known for CMAKE_SYSTEM_PROCESSOR=${CMAKE_SYSTEM_PROCESSOR}")
  endif()
endif()

foreach(component IN LISTS _cleave_deb_components)
  string(TOUPPER ${component} C)
  set(CPACK_DEBIAN_${C}_PACKAGE_NAME ${_cleave_deb_${component}})
endforeach()

# cleave_deb_description(COMPONENT SUMMARY LINE...): the package's Description,
# the summary, what cleave is, then the lines about the package (CPack indents
# them as the control file wants).
function(cleave_deb_description component summary)
  string(TOUPPER ${component} C)
  string(JOIN "\n" body ${ARGN})
  string(CONCAT text "${summary}\n"
         "cleave plans a model's layers across devices (boards, phones, GPUs), trains\n"
         "it as a pipeline over CURVE-encrypted ZeroMQ links, and runs federated and\n"
         "split learning where the data stays on the device.\n\n${body}")
  set(CPACK_DEBIAN_${C}_DESCRIPTION "${text}" PARENT_SCOPE)
endfunction()

# libcleave0's shlibs (what dpkg-shlibdeps gives a program linking
# libcleave.so.0) and the ldconfig trigger (Debian policy 8.6, 8.1.1). CPack's
# own CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS is one switch for every package
# and would try the backend modules too, which have no SONAME.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
file(WRITE ${PROJECT_BINARY_DIR}/packaging/runtime/shlibs
     "libcleave ${PROJECT_VERSION_MAJOR} libcleave0 (>= ${PROJECT_VERSION})\n")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/packaging/runtime/shlibs
    ${PROJECT_SOURCE_DIR}/cmake/deb/triggers)
cleave_deb_description(runtime "cleave embedding SDK (shared library)"
  "This package holds libcleave.so.0: the library cleaved is built on, and that"
  "an app links to join cleave's runs as a client (the C API cleave.h).")

set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION science)
set(CPACK_COMPONENT_DAEMON_DEPENDS runtime)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SUGGESTS "cleave-opencl")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/cmake/deb/conffiles ${PROJECT_SOURCE_DIR}/cmake/deb/postinst
    ${PROJECT_SOURCE_DIR}/cmake/deb/prerm ${PROJECT_SOURCE_DIR}/cmake/deb/postrm)
cleave_deb_description(daemon "cleave device daemon"
  "cleaved runs on each device: it hosts a stage of a model and trains it with"
  "its neighbours, or joins federated and split learning with its own data."
  "The systemd unit cleaved.service (DynamicUser, keys in /var/lib/cleave) is"
  "installed but neither enabled nor started: edit /etc/cleave/cleaved.conf"
  "first.")

set(CPACK_DEBIAN_CLI_PACKAGE_SECTION science)
set(CPACK_DEBIAN_CLI_PACKAGE_SUGGESTS "cleave-opencl")
cleave_deb_description(cli "coordinator of cleave's training runs (command line)"
  "cleave plans a model across the cleaved daemons that register with it and"
  "trains it (pipelined, federated or split); it also profiles devices and"
  "links, trains locally, exports checkpoints and makes keys. Its example"
  "models are in /usr/share/cleave/models.")

set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DEPENDS runtime)
# For the static archive: the libraries cleave.pc's Libs.private names.
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "libzmq3-dev, libsodium-dev, libopenblas-dev, zlib1g-dev")
cleave_deb_description(dev "cleave embedding SDK (development files)"
  "The headers cleave.h (C99) and cleave.hpp (C++17), libcleave.so, the"
  "self-contained static archive libcleave.a, the CMake package"
  "(cleave::cleave), cleave.pc, and the examples' sources in"
  "/usr/share/cleave/examples.")

# A backend module is loaded by cleaved (through libcleave0) or by cleave, of
# the same version (the module ABI is checked at load).
foreach(backend opencl cuda)
  string(TOUPPER ${backend} C)
  set(CPACK_DEBIAN_${C}_PACKAGE_SECTION science)
  set(CPACK_DEBIAN_${C}_PACKAGE_DEPENDS "cleaved (= ${PROJECT_VERSION}) | cleave (= ${PROJECT_VERSION})")
  set(CPACK_DEBIAN_${C}_PACKAGE_ENHANCES "cleaved, cleave")
endforeach()
set(CPACK_DEBIAN_OPENCL_PACKAGE_RECOMMENDS "opencl-icd")
cleave_deb_description(opencl "cleave OpenCL backend (module)"
  "The OpenCL backend (GEMM by CLBlast), loaded on demand by cleaved and"
  "cleave for --backend opencl or auto. A CPU-only device does not need it.")
cleave_deb_description(cuda "cleave CUDA backend (module)"
  "The CUDA backend (GEMM by cuBLAS), loaded on demand by cleaved and cleave"
  "for --backend cuda or auto. A device without an NVIDIA GPU does not need"
  "it.")

include(CPack)
