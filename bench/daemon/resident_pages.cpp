#include "bench/daemon/resident_pages.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "apps/common/processes.h"

namespace cleave::bench {

std::vector<MapRange> parse_maps(const std::string& text) {
  std::vector<MapRange> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string range, dev, inode;
    MapRange r;
    if (!(ls >> range >> r.perms >> std::hex >> r.offset >> dev >> inode)) continue;
    const size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    r.start = std::stoull(range.substr(0, dash), nullptr, 16);
    r.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    std::getline(ls >> std::ws, r.path);
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

constexpr uint64_t kPresent = 1ull << 63, kFileOrShared = 1ull << 61;

}  // namespace

Resident resident_pages(pid_t pid, const std::vector<MapRange>& ranges, int64_t host_offset) {
  const std::string path = "/proc/" + std::to_string(pid) + "/pagemap";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot read " + path + " (run as the daemon's user)");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<uint64_t> entries(1 << 16);
  uint64_t present = 0, file = 0;
  for (const MapRange& r : ranges) {
    if (r.path == "[vsyscall]") continue;  // outside the process's page tables
    for (uint64_t at = (r.start + host_offset) / page, end = (r.end + host_offset) / page; at < end;) {
      const uint64_t n = std::min<uint64_t>(entries.size(), end - at);
      const ssize_t got = pread(fd, entries.data(), n * sizeof(uint64_t), static_cast<off_t>(at * sizeof(uint64_t)));
      if (got <= 0) break;  // the mapping went away while we read
      for (ssize_t i = 0; i < got / static_cast<ssize_t>(sizeof(uint64_t)); ++i)
        if (entries[i] & kPresent) {
          ++present;
          file += (entries[i] & kFileOrShared) != 0;
        }
      at += static_cast<uint64_t>(got) / sizeof(uint64_t);
    }
  }
  close(fd);
  const double kib = static_cast<double>(page) / 1024.0;
  return {present * kib, (present - file) * kib, file * kib};
}

int64_t guest_base(const std::vector<MapRange>& guest, const std::vector<MapRange>& host) {
  // Each file mapping of the guest votes for the shift to every host mapping of
  // the same file, offset and length (one file can have several of those).
  std::map<int64_t, int> votes;
  for (const MapRange& g : guest) {
    if (g.path.empty() || g.path[0] != '/') continue;
    for (const MapRange& h : host)
      if (h.path == g.path && h.offset == g.offset && h.end - h.start == g.end - g.start)
        ++votes[static_cast<int64_t>(h.start) - static_cast<int64_t>(g.start)];
  }
  if (votes.empty()) return 0;
  const auto best = std::max_element(votes.begin(), votes.end(),
                                     [](const auto& x, const auto& y) { return x.second < y.second; });
  return best->first;
}

std::string request_guest_maps(pid_t pid, const std::string& path, double timeout_s) {
  std::filesystem::remove(path);
  if (kill(pid, SIGUSR2) != 0) throw std::runtime_error("the emulated daemon is gone");
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > end)
      throw std::runtime_error("the guest never wrote its maps to " + path +
                               " (is guest_maps.so preloaded, built for the guest's architecture?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return read_text(path);
}

Resident guest_resident(pid_t pid, const std::string& maps_path) {
  const std::vector<MapRange> guest = parse_maps(request_guest_maps(pid, maps_path));
  if (guest.empty()) throw std::runtime_error("the guest's maps are empty");
  const std::vector<MapRange> host = parse_maps(read_text("/proc/" + std::to_string(pid) + "/maps"));
  return resident_pages(pid, guest, guest_base(guest, host));
}

}  // namespace cleave::bench
