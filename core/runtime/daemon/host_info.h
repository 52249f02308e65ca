// host_info.h: which machine a daemon runs on, its architecture and how many cores it may use,
// so that the planner knows which devices share a machine's cores.
#pragma once

#include <string>

namespace cleave {

// "HOSTNAME/MACHINE-ID-PREFIX": the host name plus the first 12 characters of
// /etc/machine-id when readable, so that two machines with the same host name
// differ; the host name alone otherwise.
std::string host_identity();

// The CPU architecture this process runs as, as uname -m says it ("x86_64",
// "aarch64"; under qemu-user, the emulated one), so that a coordinator's
// result says which kind of machine hosted each stage.
std::string host_architecture();

// Cores this process may run on (its CPU affinity), at least 1.
int usable_cores();

}  // namespace cleave
