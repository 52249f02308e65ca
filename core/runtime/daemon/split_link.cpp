// split_link.cpp: see split_link.h.
#include "core/runtime/daemon/split_link.h"

#include "core/runtime/common/wire.h"
#include "transport/log.h"

namespace cleave {

using namespace transport;

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

Tensor SplitLink::receive(TensorKind kind, int64_t seq) {
  for (;;) {
    if (auto t = early_.take(kind, seq)) return from_message(ctx_.device, *t);
    // Keep the coordinator's connection served even when tensors arrive back to back.
    ctx_.channel.drain();
    auto r = link_->receive(Millis(20));
    if (r) {
      TensorMessage& t = r.value();
      KindRecord& rec = record_[kind_key(t.kind)];
      ++rec.count;
      if (!t.shape.empty()) rec.sample_shapes.insert(Shape(t.shape.begin() + 1, t.shape.end()));
      if (t.kind == kind && t.step == seq) return from_message(ctx_.device, t);
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
  for (;;) {
    Status s = link_->send(m);
    if (s) return;
    if (!s.is(FailureKind::kUnreachable))
      throw std::runtime_error("cannot send to " + peer_ + ": " + s.failure().message);
    // The peer has not said hello yet: wait for it.
    ctx_.channel.poll(Millis(20));
    check_split_job_alive(ctx_);
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
