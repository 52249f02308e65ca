// split_link.h: the cut-layer link of a split-learning job, shared by the
// client and server roles (split_job.h).
//
// A SplitLink wraps the TensorLink to one peer. Receiving waits for the
// tensor of a given kind and sequence number while keeping the coordinator
// connection served (heartbeats answered, a queued stop noticed), files
// tensors that arrive ahead of their turn, and records what the peer sent
// (kind, count, per-sample shape) so a run can prove what left a client.
// No wait lasts for ever: --coordinator-timeout plus four times the slowest
// wait so far (a minute before the first), then an error naming the link.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "core/runtime/daemon/split_job.h"
#include "core/runtime/daemon/tensor_mailbox.h"
#include "transport/link.h"
#include "transport/log.h"

namespace cleave {

// The job must end now (stop queued, daemon stopping, coordinator silent).
struct SplitJobAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The coordinator dropped the peer of a link from the running phase (a
// client that died or fell silent): the server stops waiting for it.
struct SplitPeerDropped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws SplitJobAborted when the job must end (see above).
void check_split_job_alive(const SplitJobContext& ctx);

// The split job as a JobChannel job (job_channel.h: serve_job, job_interruption).
JobServing split_serving(const SplitJobContext& ctx);

// Runs one command of a split role (`role`: "split client", "split server"):
// an abort ends the job when the daemon is stopping (serve_job notices the
// other reasons itself); any other failure is reported to the coordinator
// as this role's error, and the job goes on.
template <typename Body>
std::optional<JobEnd> run_split_command(const SplitJobContext& ctx, const char* role, uint64_t rid, Body&& body) {
  try {
    return body();
  } catch (const SplitJobAborted& e) {
    transport::log(transport::LogLevel::kWarning, "cleaved " + ctx.options.name + ": split job ended: " + e.what());
    return ctx.stop ? JobEnd::abandoned : std::optional<JobEnd>{};
  } catch (const std::exception& e) {
    ctx.channel.send(error_message(transport::ErrorCode::kInternal,
                                   ctx.options.name + " (" + role + ") failed: " + e.what(), rid));
  }
  return std::nullopt;
}

class SplitLink {
 public:
  SplitLink(std::unique_ptr<transport::TensorLink> link, std::string peer, const SplitJobContext& ctx);

  // The tensor (kind, seq) from the peer as a tensor on the job's device,
  // checked to hold samples of `sample_shape` (`rows` of them; -1: any number).
  // Throws std::runtime_error naming the peer for another shape or when the
  // link closes, SplitJobAborted when the job ends.
  Tensor receive(transport::TensorKind kind, int64_t seq, const Shape& sample_shape, int64_t rows = -1);
  // The same without a shape check (labels, whose shape the loss checks).
  Tensor receive(transport::TensorKind kind, int64_t seq);
  // Sends `t` as (kind, seq); waits while the peer has not said hello yet.
  void send(transport::TensorKind kind, int64_t seq, const Tensor& t);

  // Called on every turn of a wait (receive, send) after the coordinator's
  // messages were taken in; it may throw (SplitPeerDropped) to end the wait.
  void set_on_wait(std::function<void()> on_wait) { on_wait_ = std::move(on_wait); }
  // Takes over what `older` recorded (a client's link bound again after a rejoin).
  void carry_record_from(const SplitLink& older);

  const std::string& peer() const { return peer_; }
  transport::LinkStats stats() const { return link_->stats(); }
  // {"activation": {"count": n, "sample_shapes": [[32, 13, 13]]}, "labels": {...}, ...}
  nlohmann::json received_record() const;

 private:
  using Clock = std::chrono::steady_clock;
  template <typename What>
  void check_deadline(Clock::time_point t0, const What& what) const;  // split_link.cpp
  void waited_since(Clock::time_point t0);

  struct KindRecord {
    int64_t count = 0;
    std::set<Shape> sample_shapes;
  };
  std::unique_ptr<transport::TensorLink> link_;
  std::string peer_;
  const SplitJobContext& ctx_;
  TensorMailbox early_{64};  // a peer may run at most 64 tensors ahead
  std::map<std::string, KindRecord> record_;
  Clock::duration slowest_wait_{};
  std::function<void()> on_wait_;
};

}  // namespace cleave
