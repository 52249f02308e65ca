// test_probe.cpp: the daemon's start-up compute probe (core/runtime/daemon/
// probe.h) leaves nothing held by the device: an idle daemon keeps none of
// the probe's matrices, neither in use nor cached for reuse.
#include <catch2/catch.hpp>

#include "core/runtime/daemon/probe.h"
#include "device/cpu/cpu_device.h"

using namespace cleave;

TEST_CASE("the start-up compute probe gives back the memory it used", "[footprint]") {
  CpuDevice dev{DeviceOptions{}};
  const double gflops = measure_gflops(dev);
  CHECK(gflops > 0);
  CHECK(dev.peak_bytes_in_use() >= 3 * 256 * 256 * sizeof(float));  // it did hold its three matrices
  CHECK(dev.bytes_in_use() == 0);
  CHECK(dev.bytes_cached() == 0);
}
