// host_pool.cpp: see host_pool.h.
#include "device/cpu/host_pool.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>

#include "device/device.h"

namespace cleave {

HostPool::~HostPool() {
  std::lock_guard<std::mutex> lock(mu_);
  drop_cache();
}

void HostPool::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  drop_cache();
}

size_t HostPool::peak_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_in_use_;
}

void HostPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_in_use_ = in_use_.load();
}

size_t HostPool::cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

void HostPool::drop_cache() {
  for (const Cached& c : order_) std::free(c.block);
  order_.clear();
  by_size_.clear();
  cached_ = 0;
}

void HostPool::evict_oldest() {
  const Cached oldest = order_.front();
  auto [first, last] = by_size_.equal_range(oldest.size);
  for (auto it = first; it != last; ++it)
    if (it->second == order_.begin()) {
      by_size_.erase(it);
      break;
    }
  order_.pop_front();
  cached_ -= oldest.size;
  std::free(oldest.block);
}

void* HostPool::allocate(size_t bytes) {
  const size_t size = rounded(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t used = in_use_.load();
  if (limit_ > 0 && (bytes > limit_ || used > limit_ - bytes))
    throw OutOfMemory("cpu: cannot allocate " + mib_text(bytes) + " MiB: " + mib_text(used) + " MiB in use of the " +
                      mib_text(limit_) + " MiB limit (--memory-limit)");
  void* block = nullptr;
  if (auto it = by_size_.find(size); it != by_size_.end()) {
    block = it->second->block;
    order_.erase(it->second);
    by_size_.erase(it);
    cached_ -= size;
  } else {
    while (limit_ > 0 && !order_.empty() && used + cached_ + size > limit_) evict_oldest();  // held <= limit
    block = std::aligned_alloc(kAlignment, size);
    if (block == nullptr && cached_ > 0) {
      drop_cache();
      block = std::aligned_alloc(kAlignment, size);
    }
    if (block == nullptr)
      throw OutOfMemory("cpu: cannot allocate " + mib_text(bytes) + " MiB: the system is out of memory (" + mib_text(used) +
                        " MiB in use by this device)");
  }
  in_use_.store(used + bytes);
  peak_in_use_ = std::max(peak_in_use_, used + bytes);
  held_ += size;
  peak_ = std::max(peak_, held_);
  return block;
}

void HostPool::release(void* block, size_t bytes) {
  if (block == nullptr) return;
  const size_t size = rounded(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t used = in_use_.load() - bytes;
  in_use_.store(used);
  held_ -= size;
  size_t cap = peak_;
  if (limit_ > 0) cap = std::min(cap, limit_ - used);
  if (size > cap) {
    std::free(block);
    return;
  }
  while (cached_ + size > cap) evict_oldest();
  order_.push_back({size, block});
  by_size_.emplace(size, std::prev(order_.end()));
  cached_ += size;
}

}  // namespace cleave
