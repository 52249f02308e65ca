// backend_modules.cpp: finding and loading the GPU backends' modules on first
// use (backends.h). Like ggml's dynamically loaded backends: a process that
// never opens an OpenCL or CUDA device never maps OpenCL, CLBlast, cudart or
// cuBLAS (cuBLAS alone is about 150 MB resident once loaded).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <system_error>

#include "device/backends.h"

#ifndef CLEAVE_BACKEND_BUILD_DIR
#define CLEAVE_BACKEND_BUILD_DIR ""
#endif

namespace cleave {
namespace {

namespace fs = std::filesystem;

const char* display_name(Backend b) { return b == Backend::cuda ? "CUDA" : "OpenCL"; }

// What the module needs besides itself, for the message when it does not load.
const char* module_needs(Backend b) {
  return b == Backend::cuda ? "the CUDA runtime and cuBLAS it was built against (libcudart, libcublas)"
                            : "an OpenCL ICD loader and CLBlast (apt-get install ocl-icd-libopencl1 libclblast1)";
}

const char* cmake_option(Backend b) { return b == Backend::cuda ? "-DCLEAVE_CUDA=ON" : "-DCLEAVE_OPENCL=ON"; }

fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// The directory of the binary this code is linked into: libcleave.so for an
// app that loads the SDK, else the executable itself.
fs::path own_binary_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_binary_dir), &info) == 0 || !info.dli_fname) return {};
  std::error_code ec;
  const fs::path file = fs::canonical(info.dli_fname, ec);
  return ec ? fs::path() : file.parent_path();
}

std::string joined(const std::vector<std::string>& dirs) {
  std::string s;
  for (const std::string& d : dirs) s += (s.empty() ? "" : ", ") + d;
  return s;
}

// dlopen()s the module of `b` and returns its cleave_backend_open; throws with
// what to do when it is missing or does not load.
BackendOpenFn load_module(Backend b) {
  const std::string file = backend_module_file(b);
  const std::vector<std::string> dirs = backend_module_dirs();
  fs::path path;
  for (const std::string& d : dirs) {
    std::error_code ec;
    if (fs::is_regular_file(fs::path(d) / file, ec)) {
      path = fs::path(d) / file;
      break;
    }
  }
  const std::string what = std::string("the ") + display_name(b) + " backend module ";
  if (path.empty())
    throw std::runtime_error(what + file + " was not found (looked in: " + joined(dirs) + "): build it (configure with " +
                             cmake_option(b) + " and build target cleave-backend-" + backend_name(b) +
                             "), set CLEAVE_BACKEND_DIR to the directory that holds it, or use --backend cpu");
  // RTLD_LOCAL: the module's own copy of the device code stays its own.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    throw std::runtime_error(what + path.string() + " failed to load: " + (err ? err : "unknown error") +
                             "; install " + module_needs(b) + ", rebuild with " + cmake_option(b) +
                             ", or use --backend cpu");
  }
  void* sym = dlsym(handle, "cleave_backend_open");
  if (!sym)
    throw std::runtime_error(what + path.string() + " failed to load: it has no cleave_backend_open (not a cleave " +
                             "backend module?); rebuild it, or use --backend cpu");
  return reinterpret_cast<BackendOpenFn>(sym);
}

// Whether the dynamic loader finds `soname` (loaded and let go again).
bool library_loadable(const char* soname) {
  void* h = dlopen(soname, RTLD_LAZY | RTLD_LOCAL);
  if (h) dlclose(h);
  return h != nullptr;
}

}  // namespace

std::string backend_module_file(Backend backend) {
  if (backend == Backend::cpu) throw std::invalid_argument("the CPU backend has no module");
  return std::string("libcleave-backend-") + backend_name(backend) + ".so";
}

std::vector<std::string> backend_module_dirs() {
  if (const char* env = std::getenv("CLEAVE_BACKEND_DIR"); env && *env) return {env};
  std::vector<std::string> dirs;
  // Installed, the modules sit in lib/cleave/ beside libcleave.so (wherever the app itself lives).
  const fs::path own = own_binary_dir();
  if (!own.empty() && own != executable_dir()) dirs.push_back((own / "cleave").string());
  const fs::path exe = executable_dir();
  if (!exe.empty()) {
    dirs.push_back(exe.string());
    dirs.push_back((exe.parent_path() / "lib" / "cleave").lexically_normal().string());
  }
  if (*CLEAVE_BACKEND_BUILD_DIR) dirs.push_back(CLEAVE_BACKEND_BUILD_DIR);
  return dirs;
}

std::unique_ptr<Device> open_backend_module(Backend backend, const DeviceOptions& opts, bool require_gpu) {
  // `auto` (require_gpu) passes over CUDA without loading its module (cudart
  // and cuBLAS: about 150 MB resident) where the driver every CUDA GPU needs
  // is missing; asked for by name, the module says what is wrong itself.
  if (require_gpu && backend == Backend::cuda && !library_loadable("libcuda.so.1"))
    throw std::runtime_error("no CUDA driver (libcuda.so.1) on this machine");
  static std::mutex mu;
  static std::map<Backend, BackendOpenFn> loaded;  // modules are never unloaded
  BackendOpenFn open = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = loaded.find(backend);
    if (it == loaded.end()) it = loaded.emplace(backend, load_module(backend)).first;
    open = it->second;
  }
  return std::unique_ptr<Device>(open(kBackendModuleAbi, &opts, require_gpu ? 1 : 0));
}

}  // namespace cleave
