// bench/daemon/resident_pages.h: a process's resident memory counted page by
// page from /proc/PID/pagemap over a set of address ranges: every mapping of
// a native process (which gives its VmRSS back, a check of the method), or
// only the guest's mappings of a program under qemu-user, whose own RSS is
// the guest's pages plus qemu's code, heap and translated-code cache.
//
// The guest's mappings come from the guest itself: bench/daemon/guest_maps.c,
// preloaded into it, copies /proc/self/maps as qemu shows it to the guest (at
// guest addresses) when sent SIGUSR2.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cleave::bench {

// One line of /proc/PID/maps.
struct MapRange {
  uint64_t start = 0, end = 0, offset = 0;
  std::string perms, path;
};

std::vector<MapRange> parse_maps(const std::string& text);

// Resident pages in KiB: all, anonymous (private pages, written or zero-filled)
// and file-backed (pages of a file or of shared memory).
struct Resident {
  double kib = 0, anon_kib = 0, file_kib = 0;
};

// The present pages of `pid` in `ranges`, each at its address plus `host_offset`.
Resident resident_pages(pid_t pid, const std::vector<MapRange>& ranges, int64_t host_offset = 0);

// qemu's guest_base: host address minus guest address, the shift that most of
// the guest's file mappings have to a host mapping of the same file, offset and
// length (0 when none has one: guest = host).
int64_t guest_base(const std::vector<MapRange>& guest, const std::vector<MapRange>& host);

// Sends SIGUSR2 to `pid` (a qemu-user process whose guest preloads guest_maps.so
// with $CLEAVE_GUEST_MAPS=`path`) and returns the maps it writes; throws after
// `timeout_s` without them.
std::string request_guest_maps(pid_t pid, const std::string& path, double timeout_s = 10);

// The guest's resident memory of `pid`: its maps (request_guest_maps) counted
// in the host process at guest_base.
Resident guest_resident(pid_t pid, const std::string& maps_path);

}  // namespace cleave::bench
