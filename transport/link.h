// link.h: tensor links between pipeline stages (DESIGN-NOTES idea 3).
//
// A TensorLink moves float tensors (activations, gradients, inputs, labels)
// between two stages. It has two homes with one contract:
//   - an in-process queue pair (tests, single-process simulation), and
//   - ZeroMQ + CURVE: stage i dials stage i+1's peer ServerEndpoint with a
//     DEALER (ClientEndpoint); stage i+1 answers through its ROUTER. So each
//     daemon binds one ROUTER for its previous neighbour and dials one DEALER
//     to its next: activations flow down the dialled connection, gradients
//     come back on it. ROUTER/DEALER (not PAIR) survive reconnects.
// and two decorators' worth of options: an encoding per link (f32 / f16 /
// int8, applied on send to every kind but labels, which always travel as f32;
// the receiver decodes whatever the header says), and a
// bandwidth throttle (token bucket) for `cleaved --bandwidth-limit`.
//
// Ownership: a TensorMessage views float memory kept alive by `owner`. Links
// may hand that memory to another thread or to ZeroMQ's I/O thread without
// copying, so it must stay alive and unmodified while the owner is shared
// (a fresh activation tensor that is only read afterwards satisfies this).
// Without an owner, the link copies before send() returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "transport/codec.h"
#include "transport/endpoint.h"
#include "transport/message.h"
#include "transport/result.h"

namespace cleave::transport {

// A float32 tensor travelling between stages.
struct TensorMessage {
  TensorKind kind = TensorKind::kActivation;
  int64_t step = 0;
  int32_t micro_batch = 0;
  std::vector<int64_t> shape;  // e.g. (batch, features) or (batch, channels, height, width)
  const float* data = nullptr;  // numel(shape) values, row-major
  size_t count = 0;
  std::shared_ptr<const void> owner;  // keeps `data` alive; may be null (then links copy)

  // Owns `values` (moved into a shared vector).
  static TensorMessage from_vector(TensorKind kind, int64_t step, int32_t micro_batch,
                                   std::vector<int64_t> shape, std::vector<float> values);
  // Views `count` floats at `data` kept alive by `owner` (zero-copy).
  static TensorMessage borrow(TensorKind kind, int64_t step, int32_t micro_batch,
                              std::vector<int64_t> shape, const float* data, size_t count,
                              std::shared_ptr<const void> owner);
  std::span<const float> values() const { return {data, count}; }
  // Copies the values.
  std::vector<float> to_vector() const { return {data, data + count}; }
};

struct LinkStats {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t payload_bytes_sent = 0;  // encoded bytes (what crosses the wire)
  uint64_t payload_bytes_received = 0;
  uint64_t values_sent = 0;         // float32 elements before encoding
  uint64_t rejected = 0;            // invalid input received (logged)
};

class TensorLink {
 public:
  virtual ~TensorLink() = default;
  // Sends one tensor. Throws std::invalid_argument when count != numel(shape).
  virtual Status send(const TensorMessage& tensor) = 0;
  // Next tensor within `timeout`: kTimeout, kRejected (bad input, counted), kClosed.
  virtual Result<TensorMessage> receive(Millis timeout) = 0;
  // Encoded payload bytes `tensor` occupies on this link.
  virtual size_t wire_bytes(const TensorMessage& tensor) const = 0;
  virtual LinkStats stats() const = 0;
  // e.g. "zmq tcp://127.0.0.1:4000 f16", for logs.
  virtual std::string describe() const = 0;  // A descriptor that becomes readable when receive() may find a tensor
  // (ZeroMQ's, edge-triggered: wait on it only after a receive with a zero
  // timeout found nothing, and ask again before each wait), or -1 when the
  // link has none (in-process; a ZeroMQ dialler backing off).
  virtual int poll_fd() const { return -1; }
};

// Two connected in-process ends (a -> b and b -> a queues). `encoding` is
// applied on send (f16/int8 values are quantized exactly as on the wire).
std::pair<std::unique_ptr<TensorLink>, std::unique_ptr<TensorLink>> make_in_process_link_pair(
    Encoding encoding = Encoding::kF32);

// The dialling side: owns a ClientEndpoint to the next stage's server and
// sends a heartbeat at once so the server learns its routing identity.
std::unique_ptr<TensorLink> dial_tensor_link(ClientOptions options, Encoding encoding);
// The serving side: talks to `peer` (an allow-list name) through `server`,
// which must outlive the link and should serve only this link. Messages from
// other peers are rejected; heartbeats are consumed silently. send() fails
// with kUnreachable until the peer has sent something.
std::unique_ptr<TensorLink> serve_tensor_link(ServerEndpoint& server, std::string peer,
                                              Encoding encoding);

// Wraps `inner` in a token bucket of `bytes_per_second` (burst: 10 ms of
// traffic or one message, whichever is larger); send() sleeps as needed.
std::unique_ptr<TensorLink> throttle_link(std::unique_ptr<TensorLink> inner, double bytes_per_second);

// Parses a bandwidth such as "100mbit", "1gbit", "1.5Gbit/s", "10MB/s",
// "512KiB/s", "800kbps", "12500000" (bytes/s) into bytes per second.
// Decimal prefixes are powers of 1000, binary (Ki, Mi, Gi) of 1024; "bit",
// "bps" and "bit/s" are bits, "B" and "B/s" bytes. Throws std::invalid_argument
// with the offending text when unparsable or not positive.
double parse_bandwidth(std::string_view text);

}  // namespace cleave::transport
