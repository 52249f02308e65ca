# Install.cmake: what `cmake --install build [--prefix DIR]` puts where
# (docs/sdk.md, "Installing"). Every path is relative to the prefix, so an
# installed tree can be moved (the CMake package and cleave.pc find their
# prefix from their own location).
#   bin/                      cleave, cleaved
#   lib/                      libcleave.so.MAJOR.MINOR.PATCH, its SONAME and
#                             dev symlinks, libcleave.a (self-contained, see sdk/)
#   lib/cleave/               the GPU backend modules that were built
#   include/cleave/           cleave.h, cleave.hpp, version.h
#   lib/cmake/cleave/         find_package(cleave CONFIG): target cleave::cleave
#   lib/pkgconfig/cleave.pc   pkg-config --cflags --libs cleave
#   share/cleave/examples/    the examples' sources and a standalone CMakeLists.txt
#   share/cleave/models/      the model files (models/*.json)
#   lib/systemd/system/       cleaved.service (ExecStart: the installed cleaved)
#   share/cleave/cleaved.conf.example  an example of /etc/cleave/cleaved.conf
# Each rule names its component, which is a Debian package (cmake/Packaging.cmake):
# runtime (libcleave.so.0), daemon, cli, dev, and one per backend module.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# cleaved is a program over libcleave.so: installed, it finds the library in ../lib.
set_target_properties(cleaved PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
install(TARGETS cleave RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
install(TARGETS cleaved RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)

set_target_properties(cleave_shared PROPERTIES EXPORT_NAME cleave)
install(TARGETS cleave_shared EXPORT cleaveTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(FILES ${PROJECT_BINARY_DIR}/sdk/bundle/libcleave.a DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(FILES include/cleave/cleave.h include/cleave/cleave.hpp ${PROJECT_BINARY_DIR}/include/cleave/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cleave COMPONENT dev)
foreach(backend opencl cuda)
  if(TARGET cleave-backend-${backend})
    install(TARGETS cleave-backend-${backend} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/cleave COMPONENT ${backend})
  endif()
endforeach()

# The CMake package.
set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/cleave)
install(EXPORT cleaveTargets NAMESPACE cleave:: DESTINATION ${_cmake_dir} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/sdk/cleaveConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/sdk/cleaveConfig.cmake INSTALL_DESTINATION ${_cmake_dir}
                              PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sdk/cleaveConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sdk/cleaveConfig.cmake ${PROJECT_BINARY_DIR}/sdk/cleaveConfigVersion.cmake
        DESTINATION ${_cmake_dir} COMPONENT dev)

# The pkg-config file; its prefix is found from its own directory (${pcfiledir}).
string(REGEX REPLACE "[^/]+" ".." CLEAVE_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
configure_file(${PROJECT_SOURCE_DIR}/sdk/cleave.pc.in ${PROJECT_BINARY_DIR}/sdk/cleave.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/sdk/cleave.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# The examples as sources, and the models they train.
install(FILES apps/examples/fed_client.c apps/examples/split_client.cpp DESTINATION ${CMAKE_INSTALL_DATADIR}/cleave/examples
        COMPONENT dev)
install(FILES apps/examples/CMakeLists.standalone.txt DESTINATION ${CMAKE_INSTALL_DATADIR}/cleave/examples
        RENAME CMakeLists.txt COMPONENT dev)
install(DIRECTORY models/ DESTINATION ${CMAKE_INSTALL_DATADIR}/cleave/models COMPONENT cli
        FILES_MATCHING PATTERN "*.json")

# cleaved as a systemd service: the unit, its ExecStart the installed cleaved
# (worked out at install time, so `--prefix` is honoured; CPack's DEB generator
# installs with DESTDIR and the prefix /usr, so a package's is /usr/bin/cleaved),
# and an example of /etc/cleave/cleaved.conf.
install(FILES apps/cleaved/cleaved.conf.example DESTINATION ${CMAKE_INSTALL_DATADIR}/cleave COMPONENT daemon)
install(CODE "
  set(CLEAVED \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/cleaved\")
  configure_file(\"${PROJECT_SOURCE_DIR}/apps/cleaved/cleaved.service.in\"
                 \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/cleaved.service\" @ONLY)
  message(STATUS \"Installing: \$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/cleaved.service\")
" COMPONENT daemon)
