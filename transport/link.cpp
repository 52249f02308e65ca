// link.cpp: in-process, ZeroMQ and throttled TensorLinks; parse_bandwidth.
#include "transport/link.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "transport/log.h"

namespace cleave::transport {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t shape_numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("tensor shape has a negative dimension");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

void check_tensor(const TensorMessage& t) {
  if (shape_numel(t.shape) != t.count)
    throw std::invalid_argument("TensorLink::send: " + std::to_string(t.count) +
                                " values for a shape of " + std::to_string(shape_numel(t.shape)) +
                                " elements");
  if (t.count && !t.data) throw std::invalid_argument("TensorLink::send: null data");
}

// Labels are class indices (or regression targets): a lossy codec would change
// them, so they always travel as float32 whatever the link's encoding.
Encoding encoding_for(const TensorMessage& t, Encoding link_encoding) {
  return t.kind == TensorKind::kLabels ? Encoding::kF32 : link_encoding;
}

TensorMsg header_of(const TensorMessage& t, Encoding encoding) {
  TensorMsg h;
  h.kind = t.kind;
  h.step = t.step;
  h.micro_batch = t.micro_batch;
  h.shape = t.shape;
  h.encoding = encoding;
  return h;
}

// ---------------------------------------------------------------------------
// In-process

struct Channel {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<TensorMessage> queue;
  bool closed = false;
  void close() {
    {
      std::lock_guard lock(mutex);
      closed = true;
    }
    cv.notify_all();
  }
};

class InProcessLink final : public TensorLink {
 public:
  InProcessLink(std::shared_ptr<Channel> out, std::shared_ptr<Channel> in, Encoding encoding)
      : out_(std::move(out)), in_(std::move(in)), encoding_(encoding) {}
  ~InProcessLink() override {
    out_->close();
    in_->close();
  }

  Status send(const TensorMessage& tensor) override {
    check_tensor(tensor);
    TensorMessage copy = tensor;
    const Encoding encoding = encoding_for(tensor, encoding_);
    if (encoding != Encoding::kF32) {
      // Quantize exactly as the wire would.
      EncodedPayload enc = encode_payload(tensor.values(), encoding);
      copy = TensorMessage::from_vector(tensor.kind, tensor.step, tensor.micro_batch, tensor.shape,
                                        decode_payload(enc.bytes, encoding, enc.scale));
    } else if (!tensor.owner) {
      copy = TensorMessage::from_vector(tensor.kind, tensor.step, tensor.micro_batch, tensor.shape,
                                        tensor.to_vector());
    }
    {
      std::lock_guard lock(out_->mutex);
      if (out_->closed) return Failure{FailureKind::kClosed, "in-process link closed", {}};
      out_->queue.push_back(std::move(copy));
    }
    out_->cv.notify_one();
    ++stats_.messages_sent;
    stats_.values_sent += tensor.count;
    stats_.payload_bytes_sent += wire_bytes(tensor);
    return Done{};
  }

  Result<TensorMessage> receive(Millis timeout) override {
    std::unique_lock lock(in_->mutex);
    if (!in_->cv.wait_for(lock, timeout, [&] { return !in_->queue.empty() || in_->closed; }))
      return Failure{FailureKind::kTimeout, "in-process link: no tensor within " +
                                                std::to_string(timeout.count()) + " ms", {}};
    if (in_->queue.empty()) return Failure{FailureKind::kClosed, "in-process link closed", {}};
    TensorMessage t = std::move(in_->queue.front());
    in_->queue.pop_front();
    ++stats_.messages_received;
    stats_.payload_bytes_received += wire_bytes(t);
    return t;
  }

  size_t wire_bytes(const TensorMessage& t) const override {
    return t.count * encoded_element_size(encoding_for(t, encoding_));
  }
  LinkStats stats() const override { return stats_; }
  std::string describe() const override {
    return std::string("in-process ") + encoding_name(encoding_);
  }

 private:
  std::shared_ptr<Channel> out_, in_;
  Encoding encoding_;
  LinkStats stats_;
};

// ---------------------------------------------------------------------------
// ZeroMQ

// What a dialling stage sends first on each connection: a heartbeat.
Message hello_message() {
  Message hello;
  hello.body = HeartbeatMsg{0, std::chrono::duration_cast<Millis>(
                                   std::chrono::system_clock::now().time_since_epoch()).count()};
  return hello;
}

class ZmqLink final : public TensorLink {
 public:
  ZmqLink(std::unique_ptr<ClientEndpoint> client, ServerEndpoint* server, std::string peer,
          std::string where, Encoding encoding)
      : client_(std::move(client)), server_(server), peer_(std::move(peer)),
        where_(std::move(where)), encoding_(encoding) {}

  Status send(const TensorMessage& tensor) override {
    check_tensor(tensor);
    greet_after_reconnect();
    Message m = make_tensor_message(header_of(tensor, encoding_for(tensor, encoding_)), tensor.data, tensor.count, tensor.owner);
    const size_t bytes = m.payloads[0].size();
    Status s = client_ ? client_->send(m) : server_->send(peer_, m);
    if (s) {
      ++stats_.messages_sent;
      stats_.values_sent += tensor.count;
      stats_.payload_bytes_sent += bytes;
    }
    return s;
  }

  Result<TensorMessage> receive(Millis timeout) override {
    constexpr int kExtraLooks = 16;
    const auto deadline = Clock::now() + timeout;
    int heartbeats_after_deadline = 0;
    while (true) {
      const auto left = std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
      Message message;
      if (client_) {
        greet_after_reconnect();
        auto r = client_->receive(left);
        if (!r) return count_failure(r.failure());
        message = std::move(r).value();
      } else {
        auto r = server_->receive(left);
        if (!r) return count_failure(r.failure());
        if (r->peer != peer_) {
          ++stats_.rejected;
          const std::string why = describe() + ": message from " + r->peer + ", expected " + peer_;
          log(LogLevel::kWarning, why);
          return Failure{FailureKind::kRejected, why, r->peer};
        }
        message = std::move(r->message);
      }
      if (std::holds_alternative<HeartbeatMsg>(message.body)) {
        // A dialler's hello: skip it, and look again even when the timeout has
        // passed. A tensor queued right behind it would otherwise wait for the
        // caller's next receive, and a caller that sleeps on poll_fd() in
        // between sleeps on: the descriptor does not signal again for a
        // message ZeroMQ already holds (the first activation of every pipeline
        // run waited ~50 ms for the link pump's timeout). The endpoint's own
        // receive says kTimeout once nothing is queued; a peer that sends
        // nothing but heartbeats gets a bounded number of extra looks.
        if (Clock::now() >= deadline && ++heartbeats_after_deadline > kExtraLooks)
          return Failure{FailureKind::kTimeout, describe() + ": only heartbeats within the timeout", {}};
        continue;
      }
      const auto* t = std::get_if<TensorMsg>(&message.body);
      if (!t) {
        ++stats_.rejected;
        const std::string why = describe() + ": expected a tensor, got " + body_kind_name(message.body);
        log(LogLevel::kWarning, why);
        return Failure{FailureKind::kRejected, why, peer_};
      }
      ++stats_.messages_received;
      if (!message.payloads.empty()) stats_.payload_bytes_received += message.payloads[0].size();
      return TensorMessage::from_vector(t->kind, t->step, t->micro_batch, t->shape,
                                        tensor_values(message));
    }
  }

  size_t wire_bytes(const TensorMessage& t) const override {
    return t.count * encoded_element_size(encoding_for(t, encoding_));
  }
  LinkStats stats() const override { return stats_; }
  std::string describe() const override {
    return "zmq " + where_ + " " + encoding_name(encoding_);
  }
  int poll_fd() const override { return client_ ? client_->poll_fd() : server_->poll_fd(); }

 private:
  Failure count_failure(const Failure& f) {
    if (f.kind == FailureKind::kRejected) ++stats_.rejected;
    return f;
  }

  // The serving side learns a dialler's connection from its first message:
  // after the connection was reset and ZeroMQ dialled again, say hello again
  // so that the next stage can send its gradients down the new connection.
  void greet_after_reconnect() {
    if (!client_) return;
    const uint64_t made = client_->stats().handshakes_succeeded;
    if (made <= greeted_) return;
    if (greeted_ > 0) (void)client_->send(hello_message());
    greeted_ = made;
  }

  std::unique_ptr<ClientEndpoint> client_;
  uint64_t greeted_ = 0;  // connections said hello on (the first one's hello is sent by dial_tensor_link)
  ServerEndpoint* server_ = nullptr;
  std::string peer_;
  std::string where_;
  Encoding encoding_;
  LinkStats stats_;
};

// ---------------------------------------------------------------------------
// Throttle

class ThrottledLink final : public TensorLink {
 public:
  ThrottledLink(std::unique_ptr<TensorLink> inner, double rate)
      : inner_(std::move(inner)), rate_(rate), last_(Clock::now()) {}

  Status send(const TensorMessage& tensor) override {
    const double bytes = static_cast<double>(inner_->wire_bytes(tensor));
    const double burst = std::max(rate_ * 0.01, bytes);
    const auto now = Clock::now();
    tokens_ = std::min(burst, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
    last_ = now;
    tokens_ -= bytes;
    if (tokens_ < 0) std::this_thread::sleep_for(std::chrono::duration<double>(-tokens_ / rate_));
    return inner_->send(tensor);
  }
  Result<TensorMessage> receive(Millis timeout) override { return inner_->receive(timeout); }
  size_t wire_bytes(const TensorMessage& t) const override { return inner_->wire_bytes(t); }
  LinkStats stats() const override { return inner_->stats(); }
  int poll_fd() const override { return inner_->poll_fd(); }
  std::string describe() const override {
    return inner_->describe() + " throttled to " + std::to_string(static_cast<uint64_t>(rate_)) + " B/s";
  }

 private:
  std::unique_ptr<TensorLink> inner_;
  double rate_;
  double tokens_ = 0;
  Clock::time_point last_;
};

}  // namespace

TensorMessage TensorMessage::from_vector(TensorKind kind, int64_t step, int32_t micro_batch,
                                         std::vector<int64_t> shape, std::vector<float> values) {
  auto holder = std::make_shared<const std::vector<float>>(std::move(values));
  TensorMessage t;
  t.kind = kind;
  t.step = step;
  t.micro_batch = micro_batch;
  t.shape = std::move(shape);
  t.data = holder->data();
  t.count = holder->size();
  t.owner = std::move(holder);
  return t;
}

TensorMessage TensorMessage::borrow(TensorKind kind, int64_t step, int32_t micro_batch,
                                    std::vector<int64_t> shape, const float* data, size_t count,
                                    std::shared_ptr<const void> owner) {
  TensorMessage t;
  t.kind = kind;
  t.step = step;
  t.micro_batch = micro_batch;
  t.shape = std::move(shape);
  t.data = data;
  t.count = count;
  t.owner = std::move(owner);
  return t;
}

std::pair<std::unique_ptr<TensorLink>, std::unique_ptr<TensorLink>> make_in_process_link_pair(
    Encoding encoding) {
  auto ab = std::make_shared<Channel>();
  auto ba = std::make_shared<Channel>();
  return {std::make_unique<InProcessLink>(ab, ba, encoding),
          std::make_unique<InProcessLink>(ba, ab, encoding)};
}

std::unique_ptr<TensorLink> dial_tensor_link(ClientOptions options, Encoding encoding) {
  const std::string where = options.connect;
  auto client = std::make_unique<ClientEndpoint>(std::move(options));
  if (auto s = client->send(hello_message()); !s)
    throw std::runtime_error("dial_tensor_link: cannot queue the hello to " + where + ": " +
                             s.failure().message);
  return std::make_unique<ZmqLink>(std::move(client), nullptr, std::string(), where, encoding);
}

std::unique_ptr<TensorLink> serve_tensor_link(ServerEndpoint& server, std::string peer,
                                              Encoding encoding) {
  const std::string where = server.endpoint() + " <-> " + peer;
  return std::make_unique<ZmqLink>(nullptr, &server, std::move(peer), where, encoding);
}

std::unique_ptr<TensorLink> throttle_link(std::unique_ptr<TensorLink> inner, double bytes_per_second) {
  if (!inner) throw std::invalid_argument("throttle_link: null link");
  if (!(bytes_per_second > 0) || !std::isfinite(bytes_per_second))
    throw std::invalid_argument("throttle_link: bandwidth must be positive and finite");
  return std::make_unique<ThrottledLink>(std::move(inner), bytes_per_second);
}

double parse_bandwidth(std::string_view text) {
  const std::string original(text);
  auto fail = [&](const std::string& why) {
    return std::invalid_argument("bandwidth '" + original + "': " + why +
                                 " (examples: 100mbit, 1gbit, 10MB/s, 512KiB/s)");
  };
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  size_t pos = 0;
  while (pos < s.size() && (std::isdigit(static_cast<unsigned char>(s[pos])) || s[pos] == '.')) ++pos;
  if (pos == 0) throw fail("no number");
  double value;
  try {
    size_t used = 0;
    value = std::stod(s.substr(0, pos), &used);
    if (used != pos) throw fail("malformed number");
  } catch (const std::logic_error&) {
    throw fail("malformed number");
  }
  std::string unit = s.substr(pos);
  double multiplier = 1;
  bool bits = false;
  std::string lower;
  for (char c : unit) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto strip = [&lower](std::string_view suffix) {
    if (lower.size() < suffix.size() || lower.compare(lower.size() - suffix.size(), suffix.size(), suffix) != 0)
      return false;
    lower.resize(lower.size() - suffix.size());
    return true;
  };
  if (strip("bps")) {  // "kbps" = kilobits per second
    bits = true;
  } else {
    strip("/s");
    if (strip("bit")) bits = true;
    else if (!strip("b") && !lower.empty()) throw fail("unknown unit '" + unit + "'");
  }
  if (lower.empty()) multiplier = 1;
  else if (lower == "k") multiplier = 1e3;
  else if (lower == "m") multiplier = 1e6;
  else if (lower == "g") multiplier = 1e9;
  else if (lower == "ki") multiplier = 1024.0;
  else if (lower == "mi") multiplier = 1024.0 * 1024.0;
  else if (lower == "gi") multiplier = 1024.0 * 1024.0 * 1024.0;
  else throw fail("unknown prefix '" + lower + "'");
  double bytes = value * multiplier / (bits ? 8.0 : 1.0);
  if (!(bytes > 0) || !std::isfinite(bytes)) throw fail("must be positive");
  return bytes;
}

}  // namespace cleave::transport
