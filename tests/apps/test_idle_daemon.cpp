// test_idle_daemon.cpp: a real `cleaved --backend cpu`, started and idle (not
// connected to any coordinator), maps no CUDA or OpenCL library: the GPU
// backends are modules loaded only when asked for (device/backends.h). Its
// resident memory is measured by bench/daemon/bench_idle_rss, not here.
#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/processes.h"
#include "cli_util.h"

using namespace cleave;
using namespace cleave::cli_test;

namespace {

// Waits up to `seconds` for `needle` in the file at `path`.
bool wait_for_text(const std::string& path, const std::string& needle, int seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (read_text(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

TEST_CASE("an idle cleaved --backend cpu maps no CUDA or OpenCL library", "[cli][footprint]") {
  TempDir dir;
  const std::string log = dir.file("idle.log");
  // Port 9 (discard) on loopback: nothing answers, so the daemon stays idle, dialling.
  const pid_t pid = spawn({kCleaved, "--coordinator", "tcp://127.0.0.1:9", "--insecure", "--name", "idle",
                           "--backend", "cpu", "--threads", "1"},
                          log);
  // After the start-up probe the daemon has opened its device and only dials.
  const bool started = wait_for_text(log, "GFLOP/s measured", 60);
  const std::string maps = read_text("/proc/" + std::to_string(pid) + "/maps");
  terminate(pid);
  INFO("cleaved log:\n" << read_text(log));
  REQUIRE(started);
  REQUIRE(!maps.empty());
  for (const std::string lib : {"libcuda", "libcublas", "libOpenCL", "libclblast", "libpocl", "libcleave-backend-"}) {
    INFO(lib << " is mapped in the idle daemon:\n" << maps);
    CHECK(maps.find(lib) == std::string::npos);
  }
}
