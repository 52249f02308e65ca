// host_info.cpp: see host_info.h.
#include "core/runtime/daemon/host_info.h"

#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <fstream>
#include <thread>

namespace cleave {

std::string host_identity() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
  std::string id(name);
  std::ifstream f("/etc/machine-id");
  std::string machine;
  if (f && std::getline(f, machine) && !machine.empty()) {
    id += '/';
    id.append(machine, 0, 12);
  }
  return id.empty() ? "unknown-host" : id;
}

std::string host_architecture() {
  utsname u{};
  return uname(&u) == 0 && u.machine[0] != '\0' ? std::string(u.machine) : "unknown";
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

}  // namespace cleave
