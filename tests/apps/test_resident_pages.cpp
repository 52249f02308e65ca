// test_resident_pages.cpp: the method behind bench_footprint.sh's arm64
// memory (bench/daemon/resident_pages.h). Counting a process's present pages
// in its page map gives its VmRSS back and sees memory it touches; qemu's
// guest base is found from the maps; and, where qemu-aarch64 and the arm64
// cross compiler are installed, an emulated program's guest pages grow by
// what it touches and leave out qemu's own memory (skipped without them).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/processes.h"
#include "bench/daemon/resident_pages.h"
#include "skip.h"

namespace fs = std::filesystem;
using namespace cleave::bench;
using cleave::read_text;

namespace {

// A field of /proc/PID/status, in KiB.
double status_kib(pid_t pid, const std::string& key) {
  const std::string text = read_text("/proc/" + std::to_string(pid) + "/status");
  const size_t at = text.find(key + ":");
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + key.size() + 1);
}

double own_pages_kib() { return resident_pages(getpid(), parse_maps(read_text("/proc/self/maps"))).kib; }

// An arm64 program that touches argv[1] MiB, says "ready" and waits.
const char* kTouch =
    "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <unistd.h>\n"
    "int main(int argc, char** argv) { size_t n = (size_t)atoi(argv[1]) << 20; char* p = malloc(n + 1);\n"
    "  memset(p, 1, n + 1); printf(\"ready %d\\n\", p[n]); fflush(stdout); for (;;) pause(); }\n";

}  // namespace

TEST_CASE("present pages in the page map give a process's VmRSS back, and grow by what it touches",
          "[bench][footprint]") {
  const double rss = status_kib(getpid(), "VmRSS"), pages = own_pages_kib();
  INFO("VmRSS " << rss << " KiB, present pages " << pages << " KiB");
  CHECK(std::abs(pages - rss) <= 0.05 * rss + 1024);
  const size_t n = size_t{32} << 20;
  std::vector<char> block(n);
  std::memset(block.data(), 1, n);
  const double after = own_pages_kib();
  INFO("after touching 32 MiB: " << after << " KiB");
  CHECK(after - pages >= 31 * 1024);
  CHECK(after - pages <= 34 * 1024);
  CHECK(block[n / 2] == 1);
}

TEST_CASE("qemu's guest base is the shift most of the guest's file mappings agree on", "[bench][footprint]") {
  // libc's relro: two mappings of one offset, told apart by their lengths.
  const std::string guest =
      "5500000000-5500001000 r-xp 00000000 fe:00 1 /opt/prog\n"
      "55028b0000-5502a3c000 r-xp 00000000 fe:00 2 /lib/libc.so.6\n"
      "5502a3c000-5502a4c000 ---p 0018c000 fe:00 2 /lib/libc.so.6\n"
      "5502a4c000-5502a50000 r--p 0018c000 fe:00 2 /lib/libc.so.6\n"
      "5502a52000-5502a5f000 rw-p 00000000 00:00 0 \n";
  std::string host;
  for (const MapRange& r : parse_maps(guest)) {
    char line[200];
    std::snprintf(line, sizeof line, "%lx-%lx r--p %08lx fe:00 1 %s\n", static_cast<unsigned long>(r.start + 0x1000000),
                  static_cast<unsigned long>(r.end + 0x1000000), static_cast<unsigned long>(r.offset), r.path.c_str());
    host += line;
  }
  host += "7f79e1800000-7f79e1a28000 r--p 00000000 fe:00 9 /usr/bin/qemu-aarch64-static\n";
  const auto g = parse_maps(guest);
  REQUIRE(g.size() == 5);
  CHECK(g[2].offset == 0x18c000);
  CHECK(g[2].perms == "---p");
  CHECK(g[4].path.empty());
  CHECK(guest_base(g, parse_maps(host)) == 0x1000000);
  CHECK(guest_base(g, parse_maps(guest)) == 0);
  CHECK(guest_base(g, {}) == 0);
}

TEST_CASE("an emulated program's guest pages grow by what it touches and leave qemu's memory out",
          "[bench][footprint]") {
  const std::string qemu = cleave::find_on_path({"qemu-aarch64-static", "qemu-aarch64"});
  const std::string cc = cleave::find_on_path({"aarch64-linux-gnu-gcc"});
  if (qemu.empty() || cc.empty())
    CLEAVE_SKIP("needs qemu-aarch64 and aarch64-linux-gnu-gcc (scripts/cross-build.sh aarch64 --deps-only installs them)");
  const fs::path dir = fs::temp_directory_path() / ("cleave-guest-pages-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "touch.c") << kTouch;
  const std::string build = cc + " -O2 -o " + (dir / "touch").string() + " " + (dir / "touch.c").string() + " && " + cc +
                            " -O2 -shared -fPIC -o " + (dir / "guest_maps.so").string() + " " CLEAVE_SOURCE_DIR
                            "/bench/daemon/guest_maps.c";
  REQUIRE(std::system(build.c_str()) == 0);
  auto guest_kib = [&](int mib, double* qemu_rss) {
    const std::string out = (dir / "out.txt").string();
    fs::remove(out);
    const pid_t pid = fork();
    if (pid == 0) {
      freopen(out.c_str(), "w", stdout);
      const std::string preload = "LD_PRELOAD=" + (dir / "guest_maps.so").string();
      const std::string maps = "CLEAVE_GUEST_MAPS=" + (dir / "maps").string();
      const std::string touch = (dir / "touch").string(), n = std::to_string(mib);
      execl(qemu.c_str(), qemu.c_str(), "-E", preload.c_str(), "-E", maps.c_str(), touch.c_str(), n.c_str(), nullptr);
      _exit(127);
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (read_text(out).find("ready") == std::string::npos && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    double kib = -1;
    if (read_text(out).find("ready") != std::string::npos) {
      kib = guest_resident(pid, (dir / "maps").string()).kib;
      *qemu_rss = status_kib(pid, "VmRSS");
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return kib;
  };
  double qemu_idle = 0, qemu_big = 0;
  const double idle = guest_kib(0, &qemu_idle), big = guest_kib(24, &qemu_big);
  fs::remove_all(dir);
  INFO("guest pages " << idle << " KiB idle, " << big << " KiB after touching 24 MiB; qemu's VmRSS " << qemu_idle
                      << " / " << qemu_big << " KiB");
  REQUIRE(idle > 0);
  CHECK(big - idle >= 23 * 1024);
  CHECK(big - idle <= 26 * 1024);
  // qemu itself (its code, heap and translation cache) holds megabytes the guest does not.
  CHECK(qemu_idle - idle >= 4 * 1024);
}
