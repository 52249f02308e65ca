// split_link.cpp: see split_link.h.
#include "core/runtime/daemon/split_link.h"

#include "core/runtime/common/wire.h"
#include "transport/log.h"

namespace cleave {

using namespace transport;
using Clock = std::chrono::steady_clock;

namespace {

const char* kind_key(TensorKind k) {
  switch (k) {
    case TensorKind::kActivation: return "activation";
    case TensorKind::kGradient: return "gradient";
    case TensorKind::kInput: return "input";
    case TensorKind::kLabels: return "labels";
  }
  return "unknown";
}

}  // namespace

JobServing split_serving(const SplitJobContext& ctx) { return ctx.serving("split job"); }

void check_split_job_alive(const SplitJobContext& ctx) {
  if (const std::string why = job_interruption(split_serving(ctx)); !why.empty()) throw SplitJobAborted(why);
}

SplitLink::SplitLink(std::unique_ptr<TensorLink> link, std::string peer, const SplitJobContext& ctx)
    : link_(std::move(link)), peer_(std::move(peer)), ctx_(ctx) {}

// No wait on the cut-layer link lasts for ever: --coordinator-timeout plus
// four times the slowest wait so far (a minute before the first one ended).
// `what()` is built only when the deadline has passed.
template <typename What>
void SplitLink::check_deadline(Clock::time_point t0, const What& what) const {
  const auto allowance = slowest_wait_ > Clock::duration::zero() ? 4 * slowest_wait_ : Clock::duration(std::chrono::seconds(60));
  const auto deadline = Millis(ctx_.options.coordinator_timeout_ms) + std::chrono::duration_cast<Millis>(allowance);
  if (Clock::now() - t0 <= deadline) return;
  throw std::runtime_error("waited " + std::to_string(std::chrono::duration_cast<Millis>(Clock::now() - t0).count() / 1000) +
                           " s for " + what() + " over the link to " + peer_ + " (" + link_->describe() +
                           "; the deadline is " + std::to_string(deadline.count()) + " ms): the link stalled");
}

void SplitLink::waited_since(Clock::time_point t0) { slowest_wait_ = std::max(slowest_wait_, Clock::now() - t0); }

Tensor SplitLink::receive(TensorKind kind, int64_t seq) {
  const auto t0 = Clock::now();
  for (;;) {
    if (auto t = early_.take(kind, seq)) return from_message(ctx_.device, *t);
    // Keep the coordinator's connection served even when tensors arrive back to back.
    ctx_.channel.drain();
    if (on_wait_) on_wait_();
    auto r = link_->receive(Millis(20));
    if (r) {
      TensorMessage& t = r.value();
      KindRecord& rec = record_[kind_key(t.kind)];
      ++rec.count;
      if (!t.shape.empty()) rec.sample_shapes.insert(Shape(t.shape.begin() + 1, t.shape.end()));
      if (t.kind == kind && t.step == seq) {
        waited_since(t0);
        return from_message(ctx_.device, t);
      }
      if (t.step < seq)
        throw std::runtime_error(peer_ + " sent a stale " + kind_key(t.kind) + " tensor (#" + std::to_string(t.step) +
                                 ", expected #" + std::to_string(seq) + ")");
      early_.put(std::move(t), peer_);
      continue;
    }
    if (r.is(FailureKind::kClosed)) throw std::runtime_error("the link to " + peer_ + " closed");
    if (r.is(FailureKind::kRejected))
      log(LogLevel::kWarning, "cleaved " + ctx_.options.name + ": rejected input from " + peer_ + ": " + r.failure().message);
    check_split_job_alive(ctx_);
    check_deadline(t0, [&] { return std::string("the ") + kind_key(kind) + " #" + std::to_string(seq); });
  }
}

Tensor SplitLink::receive(TensorKind kind, int64_t seq, const Shape& sample_shape, int64_t rows) {
  Tensor t = receive(kind, seq);
  const Shape want = batched(rows >= 0 ? rows : (t.shape().empty() ? 0 : t.dim(0)), sample_shape);
  if (t.shape() != want)
    throw std::runtime_error(peer_ + " sent " + kind_key(kind) + " #" + std::to_string(seq) + " of shape " +
                             shape_str(t.shape()) + ", expected " + shape_str(want));
  return t;
}

void SplitLink::send(TensorKind kind, int64_t seq, const Tensor& t) {
  const TensorMessage m = to_message(t, kind, seq, 0);
  const auto t0 = Clock::now();
  for (;;) {
    Status s = link_->send(m);
    if (s) return;
    if (!s.is(FailureKind::kUnreachable))
      throw std::runtime_error("cannot send to " + peer_ + ": " + s.failure().message);
    // The peer has not said hello yet: wait for it.
    ctx_.channel.poll(Millis(20));
    ctx_.channel.drain();
    if (on_wait_) on_wait_();
    check_split_job_alive(ctx_);
    check_deadline(t0, [&] { return std::string("the peer to take ") + kind_key(kind) + " #" + std::to_string(seq); });
  }
}

void SplitLink::carry_record_from(const SplitLink& older) {
  for (const auto& [kind, rec] : older.record_) {
    KindRecord& mine = record_[kind];
    mine.count += rec.count;
    mine.sample_shapes.insert(rec.sample_shapes.begin(), rec.sample_shapes.end());
  }
}

nlohmann::json SplitLink::received_record() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [kind, rec] : record_) {
    nlohmann::json shapes = nlohmann::json::array();
    for (const auto& s : rec.sample_shapes) shapes.push_back(s);
    out[kind] = {{"count", rec.count}, {"sample_shapes", shapes}};
  }
  return out;
}

}  // namespace cleave
