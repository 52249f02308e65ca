// link_probe.h: measuring the link between two daemons over the same kind of
// encrypted, throttled tensor link their pipeline stages would use (issue 5:
// "bandwidth and latency measured between the daemons that could be
// neighbours").
//
// Daemon B runs a ProbeEchoServer admitting only daemon A's key; A dials it
// and calls probe_peer_link. Each probe tensor asks for replies: its `step`
// is how many, its `micro_batch` how many floats each. Latency is half the
// median round trip of one-float exchanges. Bandwidth in each direction is
// read from back-to-back messages: A sends four 256 KiB tensors (each answered
// by one float) and times the gaps between the answers; then one small request
// makes B send four 256 KiB tensors and A times the gaps between them. Gaps,
// not totals, so a token bucket's first free message and the round trip do not
// distort the rate. Both sides send through their --bandwidth-limit throttle.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "transport/endpoint.h"
#include "transport/keys.h"
#include "transport/link.h"

namespace cleave {

struct LinkMeasurement {
  double latency_ms = 0;  // one way
  double mbps_out = 0;    // prober -> echo server, Mbit/s
  double mbps_in = 0;     // echo server -> prober
};

class ProbeEchoServer {
 public:
  // Binds at `bind` admitting only `peer` (its Z85 key), and answers its probes
  // on a thread of its own, sending through a throttle of `bandwidth_limit`
  // bytes/s (0: none). Throws std::invalid_argument for bad keys.
  ProbeEchoServer(const std::string& bind, const transport::KeyPair& keys, const std::string& peer,
                  const std::string& peer_key, double bandwidth_limit);
  ~ProbeEchoServer();
  ProbeEchoServer(const ProbeEchoServer&) = delete;
  ProbeEchoServer& operator=(const ProbeEchoServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }

 private:
  void serve();
  std::unique_ptr<transport::ServerEndpoint> server_;
  std::unique_ptr<transport::TensorLink> link_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Dials the echo server described by `options`, sending through a throttle of
// `bandwidth_limit` bytes/s (0: none), and measures the link (see above).
// Throws std::runtime_error when an answer takes longer than `timeout`.
LinkMeasurement probe_peer_link(const transport::ClientOptions& options, double bandwidth_limit,
                                transport::Millis timeout = transport::Millis(30000));

}  // namespace cleave
