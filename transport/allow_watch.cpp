// allow_watch.cpp: fingerprints of an allow-list path and the reload request counter.
#include "transport/allow_watch.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

#include "transport/log.h"

namespace cleave::transport {
namespace {

namespace fs = std::filesystem;

std::atomic<uint64_t> g_reload_generation{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "request_allow_list_reload must be signal-safe");

std::string entry_fingerprint(const fs::path& p) {
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  const auto size_text = ec ? std::string("?") : std::to_string(size);
  const auto time = fs::last_write_time(p, ec);
  const auto time_text = ec ? std::string("?") : std::to_string(time.time_since_epoch().count());
  return p.filename().string() + ' ' + size_text + ' ' + time_text + '\n';
}

// Every entry's name, size and time (sorted), or the file's own; "missing" when absent.
std::string fingerprint(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "missing";
  if (!fs::is_directory(path, ec)) return entry_fingerprint(path);
  std::vector<std::string> entries;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    entries.push_back(entry_fingerprint(it->path()));
  std::sort(entries.begin(), entries.end());
  std::string out;
  for (const auto& e : entries) out += e;
  return out;
}

bool holds_no_pub_files(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".pub") return false;
  return !ec;
}

}  // namespace

void request_allow_list_reload() { g_reload_generation.fetch_add(1, std::memory_order_relaxed); }

AllowListWatcher::AllowListWatcher(fs::path path)
    : path_(std::move(path)), fingerprint_(fingerprint(path_)), generation_(g_reload_generation.load()) {}

bool AllowListWatcher::reload_requested() const { return g_reload_generation.load() != generation_; }

std::optional<AllowList> AllowListWatcher::poll(const std::string& label) {
  const uint64_t generation = g_reload_generation.load();
  std::string now = fingerprint(path_);
  const bool requested = generation != generation_;
  if (!requested && now == fingerprint_) return std::nullopt;
  generation_ = generation;
  fingerprint_ = std::move(now);
  log(LogLevel::kInfo, label + ": re-reading the allow-list " + path_.string() +
                           (requested ? " (reload requested)" : " (it changed)"));
  if (holds_no_pub_files(path_)) return AllowList{};
  try {
    return AllowList::load(path_);
  } catch (const std::exception& e) {
    log(LogLevel::kError, label + ": cannot re-read the allow-list: " + std::string(e.what()) +
                              "; the previous list stays in force until the path changes again");
    return std::nullopt;
  }
}

}  // namespace cleave::transport
