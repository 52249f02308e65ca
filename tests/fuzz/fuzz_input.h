// fuzz_input.h: how the message-decoder fuzz target splits one byte string
// into a header frame and payload frames, and the inverse (for seeds).
//   [u16 header length, LE][header bytes][u32 frame length, LE][frame]...
// Lengths running past the end are clamped, so every input is usable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "transport/message.h"

namespace cleave::transport::fuzz {

struct Frames {
  std::span<const std::byte> header;
  std::vector<Payload> payloads;
};

inline Frames split_input(const uint8_t* data, size_t size) {
  Frames f;
  const auto* p = reinterpret_cast<const std::byte*>(data);
  size_t pos = 0;
  uint16_t hlen = 0;
  if (size >= 2) {
    std::memcpy(&hlen, data, 2);
    pos = 2;
  }
  const size_t h = std::min<size_t>(hlen, size - pos);
  f.header = std::span<const std::byte>(p + pos, h);
  pos += h;
  while (pos + 4 <= size && f.payloads.size() < 8) {
    uint32_t len;
    std::memcpy(&len, data + pos, 4);
    pos += 4;
    const size_t n = std::min<size_t>(len, size - pos);
    // Borrowed without an owner: the input outlives the decode call.
    f.payloads.push_back(Payload::borrow_unowned(p + pos, n));
    pos += n;
  }
  return f;
}

inline std::vector<uint8_t> join_input(std::span<const std::byte> header,
                                       const std::vector<Payload>& payloads) {
  std::vector<uint8_t> out(2);
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  std::memcpy(out.data(), &hlen, 2);
  for (std::byte b : header) out.push_back(static_cast<uint8_t>(b));
  for (const auto& p : payloads) {
    const uint32_t len = static_cast<uint32_t>(p.size());
    const size_t at = out.size();
    out.resize(at + 4);
    std::memcpy(out.data() + at, &len, 4);
    for (std::byte b : p.bytes()) out.push_back(static_cast<uint8_t>(b));
  }
  return out;
}

}  // namespace cleave::transport::fuzz
