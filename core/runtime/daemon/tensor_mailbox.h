// tensor_mailbox.h: tensors that arrived before their turn, until their turn
// comes — the one early-arrival mailbox of the daemon: the coordinator's inputs
// and labels (JobChannel), a pipeline stage's peer links (pipeline_job.cpp) and
// a split-learning link (split_link.h, whose sequence number is the step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "transport/link.h"

namespace cleave {

class TensorMailbox {
 public:
  // At most `capacity` tensors wait at once: a peer that runs further ahead is
  // an error (see put), not unbounded memory.
  explicit TensorMailbox(size_t capacity = std::numeric_limits<size_t>::max()) : capacity_(capacity) {}

  // Keeps `t` (the newest wins for one key); throws std::runtime_error naming
  // `from` when the mailbox is full.
  void put(transport::TensorMessage t, const std::string& from = "a peer") {
    const Key key{static_cast<int>(t.kind), t.step, t.micro_batch};
    if (box_.size() >= capacity_ && !box_.count(key))
      throw std::runtime_error(from + " sent more than " + std::to_string(capacity_) + " tensors ahead of their turn");
    box_.insert_or_assign(key, std::move(t));
  }
  // The tensor of (kind, step, micro-batch), if it arrived.
  std::optional<transport::TensorMessage> take(transport::TensorKind kind, int64_t step, int micro_batch = 0) {
    auto it = box_.find(Key{static_cast<int>(kind), step, micro_batch});
    if (it == box_.end()) return std::nullopt;
    transport::TensorMessage t = std::move(it->second);
    box_.erase(it);
    return t;
  }
  size_t size() const { return box_.size(); }
  void clear() { box_.clear(); }

 private:
  using Key = std::tuple<int, int64_t, int>;
  std::map<Key, transport::TensorMessage> box_;
  size_t capacity_;
};

}  // namespace cleave
