// test_arm64_daemon.cpp: issue 19's cross-architecture check. An arm64
// cleaved (scripts/cross-build.sh aarch64, built with UBSan) runs under
// qemu-user beside an x86-64 cleaved in this x86-64 coordinator's CURVE
// pipeline, and the run's losses match the all-x86-64 run's. Every frame the
// arm64 stage reads (the x86-64 stage's activations, the labels, the
// coordinator's FlatBuffers headers) goes through UBSan's alignment and
// overflow checks, which halt the daemon on the first report; byte order and
// the size of long and size_t are then checked by the losses themselves.
//
// Skips, saying what to do, without an arm64 build (CLEAVE_ARM64_BUILD_DIR,
// default build-aarch64 in the source tree), without qemu-aarch64, or when
// that build has no UBSan: the test's claim includes the alignment checks.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "apps/common/processes.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"
#include "integration/daemon_cluster.h"
#include "integration/test_run.h"
#include "skip.h"

using namespace cleave;
using cleave::testing::DaemonCluster;
namespace fs = std::filesystem;

namespace {

std::string arm64_build_dir() {
  const char* env = std::getenv("CLEAVE_ARM64_BUILD_DIR");
  return env && *env ? env : std::string(CLEAVE_SOURCE_DIR) + "/build-aarch64";
}

// The ELF header's class, byte order and machine: 64-bit, little-endian, AArch64.
bool is_aarch64_elf(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char h[20] = {};
  if (!f.read(reinterpret_cast<char*>(h), sizeof h)) return false;
  const bool elf = h[0] == 0x7f && h[1] == 'E' && h[2] == 'L' && h[3] == 'F';
  const int machine = h[18] | (h[19] << 8);  // e_machine, little-endian
  return elf && h[4] == 2 /* ELFCLASS64 */ && h[5] == 1 /* ELFDATA2LSB */ && machine == 183 /* EM_AARCH64 */;
}

// CLEAVE_SANITIZE from the arm64 build's CMake cache.
std::string cached_sanitizers(const std::string& build) {
  std::ifstream f(build + "/CMakeCache.txt");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("CLEAVE_SANITIZE:", 0) == 0) return line.substr(line.find('=') + 1);
  return {};
}

TrainConfig mlp_config() {
  TrainConfig c = cleave::testing::test_run("models/mlp.json", 32, 11);
  c.epochs = 1;
  c.limit_train = 320;
  c.limit_test = 200;
  c.microbatches = 2;
  return c;
}

// A 2-stage pipeline run over CURVE; dev2 is started from `dev2_program`.
nlohmann::json two_stage_run(const TrainConfig& cfg, const std::vector<std::string>& dev2_program,
                             std::string* dev2_log) {
  DaemonCluster cluster(2);
  ClusterOptions cl = cluster.options(2);
  cl.schedule = "1f1b";
  cl.shutdown_daemons = true;
  // qemu runs an arm64 daemon (with UBSan) 10-30x slower than native: it
  // starts in seconds, and sending its share of the end-of-epoch checkpoint
  // (12 MB over CURVE, libsodium emulated) takes longer than the default
  // --peer-timeout of 5 s. Any loss fails the run at once instead of recovering.
  cl.register_timeout_ms = 60000;
  cl.peer_timeout_ms = 60000;
  cl.max_recoveries = 0;
  cl.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep);
    if (dev2_program.empty())
      cluster.start(2, ep);
    else
      cluster.start_program(dev2_program, 2, ep);
  };
  nlohmann::json result = train_pipeline(cfg, cl);
  cluster.stop();
  if (dev2_log) *dev2_log = cluster.log(2);
  return result;
}

const nlohmann::json& device_named(const nlohmann::json& result, const std::string& name) {
  for (const auto& d : result["devices"])
    if (d["name"] == name) return d;
  FAIL("no device " << name << " in the result");
  return result;
}

}  // namespace

TEST_CASE("an arm64 cleaved under qemu joins an x86-64 pipeline and trains with the all-x86-64 losses",
          "[integration][pipeline][arm64]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const std::string build = arm64_build_dir();
  const std::string cleaved = build + "/apps/cleaved/cleaved";
  if (!fs::exists(cleaved))
    CLEAVE_SKIP("no arm64 cleaved at " << cleaved << ": build it with SANITIZE=undefined scripts/cross-build.sh aarch64");
  const std::string qemu = find_on_path({"qemu-aarch64-static", "qemu-aarch64"});
  if (qemu.empty()) CLEAVE_SKIP("no qemu-aarch64 on PATH: apt-get install qemu-user-static");
  if (cached_sanitizers(build).find("undefined") == std::string::npos)
    CLEAVE_SKIP(build << " was built without UBSan, whose alignment checks this test relies on: "
                         "SANITIZE=undefined scripts/cross-build.sh aarch64");
  REQUIRE(is_aarch64_elf(cleaved));
  // UBSan in the arm64 daemon stops it at the first report (it inherits this).
  setenv("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1", 1);

  const TrainConfig cfg = mlp_config();
  const nlohmann::json x86 = two_stage_run(cfg, {}, nullptr);
  std::string arm_log;
  const nlohmann::json mixed = two_stage_run(cfg, {qemu, cleaved}, &arm_log);
  INFO("arm64 daemon log:\n" << arm_log);

  // The mixed run really had an arm64 stage: the daemon says so, and it hosted layers.
  CHECK(device_named(x86, "dev2")["details"]["arch"] == "x86_64");
  CHECK(device_named(mixed, "dev1")["details"]["arch"] == "x86_64");
  CHECK(device_named(mixed, "dev2")["details"]["arch"] == "aarch64");
  REQUIRE(mixed["plan"].size() == 2);
  std::set<std::string> hosts;
  for (const auto& stage : mixed["plan"]) hosts.insert(stage["device"].get<std::string>());
  CHECK(hosts == std::set<std::string>{"dev1", "dev2"});
  CHECK(arm_log.find("runtime error") == std::string::npos);

  const auto& a = x86["losses"];
  const auto& b = mixed["losses"];
  REQUIRE(a.size() == 10);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i].get<double>(), y = b[i].get<double>();
    INFO("step " << i << ": x86-64 " << x << ", with arm64 " << y);
    CHECK(std::abs(x - y) <= 1e-4 * std::abs(x));
  }
  CHECK(std::abs(x86["test_accuracy"].get<double>() - mixed["test_accuracy"].get<double>()) <= 0.01);
}
