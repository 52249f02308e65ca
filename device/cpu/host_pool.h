// host_pool.h: the CPU backend's memory — 64-byte aligned host blocks, counted
// against an optional limit, and kept for reuse once released.
//
// A training step allocates and frees the same tensor sizes every step. glibc
// serves large blocks straight from mmap and unmaps them on free, so every step
// used to touch fresh pages the kernel had to fault in and zero: ~260k page
// faults in a 5 s bench_train_step run of the CNN, a third of its step time. The
// pool keeps released blocks by size and hands them out again.
//
// Bounds: the cached bytes never exceed the peak bytes in use so far (counted in
// whole blocks), and under a
// limit the bytes in use plus cached stay within the limit (a request that would
// cross it frees cached blocks first). When a released block does not fit, the blocks
// released longest ago are freed to make room: sizes a loop no longer asks for
// age out, and the ones it does keep coming back. The limit counts what tensors hold, as before:
// bytes_in_use() is the sum of live allocations, not of cached blocks; peak_in_use() is its
// high-water mark (Device::peak_bytes_in_use).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <list>
#include <mutex>
#include <unordered_map>

namespace cleave {

class HostPool {
 public:
  static constexpr size_t kAlignment = 64;

  explicit HostPool(size_t limit) : limit_(limit) {}
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A block of at least `bytes` bytes, 64-byte aligned. Throws cleave::OutOfMemory
  // when the limit or the system's memory would be exceeded.
  void* allocate(size_t bytes);
  // Gives back a block from allocate(bytes) (same `bytes`).
  void release(void* block, size_t bytes);

  // Frees every cached block (what the pool holds beyond the blocks in use).
  void trim();

  size_t in_use() const { return in_use_.load(); }
  // The largest in_use() since construction or the last reset_peak().
  size_t peak_in_use() const;
  void reset_peak();
  size_t cached() const;
  size_t limit() const { return limit_; }

 private:
  static size_t rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment; }
  struct Cached {
    size_t size;
    void* block;
  };
  void drop_cache();         // frees every cached block; mu_ held
  void evict_oldest();       // frees the block released longest ago; mu_ held

  const size_t limit_;
  std::atomic<size_t> in_use_{0};
  mutable std::mutex mu_;
  size_t held_ = 0;    // bytes of the blocks in use (rounded sizes)
  size_t peak_ = 0;    // largest held_ so far (bounds the cache)
  size_t peak_in_use_ = 0;  // largest in_use_ since the last reset_peak()
  size_t cached_ = 0;      // bytes held in order_
  std::list<Cached> order_;  // released blocks, oldest first
  std::unordered_multimap<size_t, std::list<Cached>::iterator> by_size_;  // rounded size -> entry of order_
};

}  // namespace cleave
