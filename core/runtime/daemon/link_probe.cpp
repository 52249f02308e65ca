// link_probe.cpp: see link_probe.h.
#include "core/runtime/daemon/link_probe.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "core/util/stats.h"
#include "transport/log.h"

namespace cleave {

using namespace transport;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kBigFloats = 64 * 1024;  // 256 KiB per bandwidth message
constexpr int kBurst = 4;                   // back-to-back messages per direction

TensorMessage probe_tensor(int64_t replies, int32_t reply_floats, int64_t floats, float value = 0.5f) {
  return TensorMessage::from_vector(TensorKind::kActivation, replies, reply_floats, {floats},
                                    std::vector<float>(static_cast<size_t>(floats), value));
}

}  // namespace

ProbeEchoServer::ProbeEchoServer(const std::string& bind, const KeyPair& keys, const std::string& peer,
                                 const std::string& peer_key, double bandwidth_limit) {
  ServerOptions so;
  so.bind = bind;
  so.keys = keys;
  so.allow.add(peer, peer_key);
  so.label = "link probe for " + peer;
  server_ = std::make_unique<ServerEndpoint>(so);
  endpoint_ = server_->endpoint();
  link_ = serve_tensor_link(*server_, peer, Encoding::kF32);
  if (bandwidth_limit > 0) link_ = throttle_link(std::move(link_), bandwidth_limit);
  thread_ = std::thread([this] { serve(); });
}

ProbeEchoServer::~ProbeEchoServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ProbeEchoServer::serve() {
  Clock::time_point last = Clock::now();
  while (!stop_) {
    auto r = link_->receive(Millis(50));
    if (!r) continue;
    // Answers carry the seconds since the previous probe arrived: the prober
    // may be asleep in its own throttle while they arrive, so it cannot time
    // its outgoing messages itself.
    const auto now = Clock::now();
    const float gap = static_cast<float>(std::chrono::duration<double>(now - last).count());
    last = now;
    const TensorMessage& t = r.value();
    const int64_t replies = std::clamp<int64_t>(t.step, 0, kBurst);
    const int64_t floats = std::clamp<int64_t>(t.micro_batch, 1, kBigFloats);
    for (int64_t i = 0; i < replies && !stop_; ++i) {
      for (;;) {  // the prober said hello with its first probe; retry while it is not routable yet
        Status s = link_->send(probe_tensor(0, 0, floats, gap));
        if (s || !s.is(FailureKind::kUnreachable) || stop_) break;
        std::this_thread::sleep_for(Millis(5));
      }
    }
  }
}

LinkMeasurement probe_peer_link(const ClientOptions& options, double bandwidth_limit, Millis timeout) {
  auto link = dial_tensor_link(options, Encoding::kF32);
  if (bandwidth_limit > 0) link = throttle_link(std::move(link), bandwidth_limit);
  float reported_gap = 0;  // the echo server's seconds between the last two probes it received
  auto await = [&](const char* what) {
    auto r = link->receive(timeout);
    if (!r)
      throw std::runtime_error("link probe to " + options.connect + ": no answer to the " + what + " within " +
                               std::to_string(timeout.count()) + " ms (" + r.failure().message + ")");
    reported_gap = r.value().count ? r.value().data[0] : 0.f;
    return Clock::now();
  };
  auto send = [&](const TensorMessage& t) {
    Status s = link->send(t);
    if (!s) throw std::runtime_error("link probe to " + options.connect + ": " + s.failure().message);
  };
  LinkMeasurement out;
  // Latency: one-float round trips (the first also opens the connection).
  std::vector<double> rtts;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    send(probe_tensor(1, 1, 1));
    const auto t1 = await("latency probe");
    if (i > 0) rtts.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  out.latency_ms = median(rtts) / 2 * 1000;
  const double big_bits = static_cast<double>(kBigFloats) * sizeof(float) * 8;
  auto rate_from = [&](const std::vector<Clock::time_point>& arrivals) {
    std::vector<double> gaps;
    for (size_t i = 1; i < arrivals.size(); ++i)
      gaps.push_back(std::chrono::duration<double>(arrivals[i] - arrivals[i - 1]).count());
    return big_bits / std::max(1e-7, median(gaps)) / 1e6;
  };
  // Out: back-to-back big messages, each answered by one float holding the
  // gap since the previous one arrived there.
  // Each direction has two estimates that can only err high: the gaps (a
  // late first read makes the rest look instant on a fast link) and the
  // whole burst over its time less one round trip (a token bucket's first
  // message is free). The smaller is kept.
  const double rtt = median(rtts);
  auto rate_of_total = [&](Clock::time_point t0, Clock::time_point t1) {
    return kBurst * big_bits / std::max(1e-7, std::chrono::duration<double>(t1 - t0).count() - rtt) / 1e6;
  };
  auto t0 = Clock::now();
  for (int i = 0; i < kBurst; ++i) send(probe_tensor(1, 1, kBigFloats));
  std::vector<double> gaps;
  Clock::time_point last;
  for (int i = 0; i < kBurst; ++i) {
    last = await("bandwidth probe");
    if (i > 0) gaps.push_back(reported_gap);
  }
  out.mbps_out = std::min(big_bits / std::max(1e-7, median(gaps)) / 1e6, rate_of_total(t0, last));
  // In: one request, answered by back-to-back big messages.
  std::vector<Clock::time_point> arrivals;
  t0 = Clock::now();
  send(probe_tensor(kBurst, static_cast<int32_t>(kBigFloats), 1));
  for (int i = 0; i < kBurst; ++i) arrivals.push_back(await("bandwidth reply"));
  out.mbps_in = std::min(rate_from(arrivals), rate_of_total(t0, arrivals.back()));
  return out;
}

}  // namespace cleave
