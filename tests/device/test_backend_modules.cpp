// test_backend_modules.cpp: the GPU backends are modules loaded on first use
// (device/backends.h). A program that only opens the CPU maps no CUDA or
// OpenCL library; a missing or broken module is a clear error that says what
// to do, and `auto` then falls back to the CPU; an asked-for backend loads its
// module. The cases that depend on a module not being loaded yet skip when an
// earlier case in the same process loaded it (CTest runs one case per process).
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "device/backends.h"
#include "device/device.h"
#include "device/tensor.h"
#include "scratch_dir.h"
#include "skip.h"

using namespace cleave;

namespace {

std::string self_maps() {
  std::ifstream in("/proc/self/maps");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Libraries only the GPU backends need.
const std::vector<std::string> kGpuLibraries = {"libcuda", "libcublas", "libOpenCL", "libclblast",
                                                "libpocl", "libcleave-backend-"};

std::vector<Backend> gpu_backends() {
  std::vector<Backend> out;
  for (Backend b : compiled_backends())
    if (b != Backend::cpu) out.push_back(b);
  return out;
}

bool any_module_loaded() { return self_maps().find("libcleave-backend-") != std::string::npos; }

// What open_device(b) throws ("" and a failure when it opens a device).
std::string open_error(Backend b) {
  try {
    open_device(backend_name(b));
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL_CHECK("opened " << backend_name(b) << " although its module should not load");
  return "";
}

// Sets CLEAVE_BACKEND_DIR for the scope of one test.
struct BackendDirOverride {
  explicit BackendDirOverride(const std::string& dir) { setenv("CLEAVE_BACKEND_DIR", dir.c_str(), 1); }
  ~BackendDirOverride() { unsetenv("CLEAVE_BACKEND_DIR"); }
  BackendDirOverride(const BackendDirOverride&) = delete;
  BackendDirOverride& operator=(const BackendDirOverride&) = delete;
};

}  // namespace

TEST_CASE("a program that opens only the CPU maps no CUDA or OpenCL library", "[device][modules]") {
  if (any_module_loaded()) CLEAVE_SKIP("a GPU module was loaded by an earlier case in this process");
  auto cpu = open_device("cpu");
  Tensor a(*cpu, {64, 64}), c(*cpu, {64, 64});
  cpu->fill(a, 1.f);
  cpu->gemm(false, false, 64, 64, 64, 1.f, a, 64, a, 64, 0.f, c, 64);
  CHECK(c.to_host()[0] == 64.f);
  const std::string maps = self_maps();
  for (const std::string& lib : kGpuLibraries) {
    INFO(lib << " is mapped:\n" << maps);
    CHECK(maps.find(lib) == std::string::npos);
  }
}

TEST_CASE("modules are looked for in CLEAVE_BACKEND_DIR alone, else next to the program and in the build tree",
          "[device][modules]") {
  unsetenv("CLEAVE_BACKEND_DIR");
  const std::vector<std::string> dirs = backend_module_dirs();
  REQUIRE(dirs.size() >= 2);
  CHECK(dirs.back() == CLEAVE_BINARY_DIR "/backends");
  CHECK(std::find(dirs.begin(), dirs.end(), CLEAVE_BINARY_DIR "/tests/device") != dirs.end());
  {
    BackendDirOverride over("/opt/cleave-modules");
    CHECK(backend_module_dirs() == std::vector<std::string>{"/opt/cleave-modules"});
  }
  CHECK(backend_module_file(Backend::cuda) == "libcleave-backend-cuda.so");
  CHECK(backend_module_file(Backend::opencl) == "libcleave-backend-opencl.so");
  CHECK_THROWS_AS(backend_module_file(Backend::cpu), std::invalid_argument);
}

TEST_CASE("a missing backend module is a clear error and auto falls back to the CPU", "[device][modules]") {
  if (gpu_backends().empty()) CLEAVE_SKIP("this build has no GPU backend");
  if (any_module_loaded()) CLEAVE_SKIP("a GPU module was loaded by an earlier case in this process");
  test::TempDir empty;
  BackendDirOverride over(empty.str());
  for (Backend b : gpu_backends()) {
    const std::string msg = open_error(b);
    INFO(msg);
    CHECK(msg.find(backend_module_file(b) + " was not found") != std::string::npos);
    CHECK(msg.find(empty.str()) != std::string::npos);  // where it looked
    CHECK(msg.find("CLEAVE_BACKEND_DIR") != std::string::npos);
    CHECK(msg.find("--backend cpu") != std::string::npos);
  }
  CHECK(open_device("auto")->backend() == Backend::cpu);
  CHECK(self_maps().find("libcleave-backend-") == std::string::npos);
}

TEST_CASE("a backend module that does not load is a clear error", "[device][modules]") {
  if (gpu_backends().empty()) CLEAVE_SKIP("this build has no GPU backend");
  if (any_module_loaded()) CLEAVE_SKIP("a GPU module was loaded by an earlier case in this process");
  test::TempDir dir;
  BackendDirOverride over(dir.str());
  for (Backend b : gpu_backends()) {
    const std::string path = dir.file(backend_module_file(b));
    std::ofstream(path) << "not a shared library\n";
    const std::string msg = open_error(b);
    INFO(msg);
    CHECK(msg.find(path + " failed to load: ") != std::string::npos);
    CHECK(msg.find("--backend cpu") != std::string::npos);
  }
  CHECK(open_device("auto")->backend() == Backend::cpu);
}

TEST_CASE("auto does not load the CUDA module where there is no CUDA driver", "[device][modules]") {
  const auto built = gpu_backends();
  if (std::find(built.begin(), built.end(), Backend::cuda) == built.end()) CLEAVE_SKIP("no CUDA backend in this build");
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    dlclose(driver);
    CLEAVE_SKIP("this machine has a CUDA driver");
  }
  if (self_maps().find("libcleave-backend-cuda") != std::string::npos)
    CLEAVE_SKIP("the CUDA module was loaded by an earlier case in this process");
  auto dev = open_device("auto");
  CHECK(dev->backend() != Backend::cuda);
  const std::string maps = self_maps();
  CHECK(maps.find("libcleave-backend-cuda") == std::string::npos);
  CHECK(maps.find("libcublas") == std::string::npos);
}

TEST_CASE("opening a GPU backend loads its module on first use", "[device][modules]") {
  if (gpu_backends().empty()) CLEAVE_SKIP("this build has no GPU backend");
  const Backend b = gpu_backends().back();  // OpenCL where built (PoCL runs it here), else CUDA
  const std::string file = backend_module_file(b);
  std::string why;
  try {
    auto dev = open_device(backend_name(b));
    CHECK(dev->backend() == b);
  } catch (const std::runtime_error& e) {
    why = e.what();  // the module loaded but found no device: still mapped
  }
  INFO("open_device: " << why);
  CHECK(why.find("module") == std::string::npos);
  CHECK(self_maps().find(file) != std::string::npos);
}
