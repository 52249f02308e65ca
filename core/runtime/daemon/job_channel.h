// job_channel.h: a daemon's connection to the coordinator while it serves a
// job (pipeline stage, split-learning client or server).
//
// It answers heartbeats and link probes at once, files tensors and weights
// that arrive ahead of their use in mailboxes, and queues commands (assign,
// control), so that whoever waits — the main loop, or a stage blocked on its
// inputs — sees the coordinator's messages in arrival order and the
// coordinator never sees the daemon fall silent.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/runtime/daemon/tensor_mailbox.h"
#include "transport/endpoint.h"
#include "transport/link.h"
#include "transport/message.h"

namespace cleave {

class JobChannel {
 public:
  JobChannel(transport::ClientEndpoint& client, std::string name) : client_(client), name_(std::move(name)) {}

  // Handles at most one incoming message; returns false on timeout, or
  // early when `woken` is signalled (transport::ClientEndpoint::receive).
  bool poll(transport::Millis timeout, const transport::Wakeup* woken = nullptr);
  // Handles everything already queued, without waiting.
  void drain() {
    while (poll(transport::Millis(0))) {
    }
  }

  std::optional<transport::Message> pop_command();
  // True when a stop or shutdown is queued (a running step must give up).
  bool stop_queued() const;

  // A tensor from the coordinator with this (kind, step, micro-batch), if it arrived.
  std::optional<transport::TensorMessage> take_tensor(transport::TensorKind kind, int64_t step, int mb);
  // The weights message for `stage`, if one arrived (the newest wins).
  std::optional<transport::Message> take_weights(int stage);
  // The coordinator's secure-aggregation message of `phase` for `round`, if it
  // arrived (fed_secagg_client.h). Only the newest round's are kept.
  std::optional<transport::Message> take_secagg(int64_t round, transport::SecAggPhase phase);
  void clear_mailboxes() {
    tensors_.clear();
    weights_.clear();
    secagg_.clear();
  }

  std::chrono::milliseconds silence() const;
  void heard_now() { last_heard_ = std::chrono::steady_clock::now(); }

  // Sends to the coordinator; a failure is logged (the coordinator notices silence).
  void send(const transport::Message& m);

  // Told the text of every error this daemon sends the coordinator, and of a
  // job abandoned for the coordinator's silence (the metrics' last error,
  // daemon_monitor.h). May be empty.
  std::function<void(const std::string&)> on_error;

 private:
  transport::ClientEndpoint& client_;
  std::string name_;
  std::deque<transport::Message> commands_;
  TensorMailbox tensors_;
  std::map<int, transport::Message> weights_;
  std::map<std::pair<int64_t, int>, transport::Message> secagg_;  // (round, phase)
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_version_error_{};
};

// How a job served on a JobChannel ended (refused: the assignment was answered
// with an error and no job ran).
enum class JobEnd { finished, shutdown, abandoned, refused };

// Who serves a job on the channel, for the loop below.
struct JobServing {
  JobChannel& channel;
  std::string name;  // the daemon's name, for logs and errors
  std::string what;  // "federated job", "split job"
  int timeout_ms;    // --coordinator-timeout
  const std::atomic<bool>& stop;
};

// Why a running job must give up now, or "" when it need not: the daemon is
// stopping, the coordinator queued Stop or Shutdown, or it has been silent past
// the timeout. For long work inside a command (a round, an epoch) to check.
std::string job_interruption(const JobServing& job);

// The one job loop every job kind runs in (pipeline stage, federated client,
// split roles): serves the coordinator's commands until the job ends. Another
// assignment is refused ("NAME is already running a WHAT"), Shutdown and Finish
// are acknowledged (Finish's ack carries {"op": "finish"} plus finish_detail())
// and end the job, every other command goes to `handle`, which may end it too.
// `between` (may be empty) runs after every poll, for mailboxes the job
// watches. The job is abandoned when the daemon stops or the coordinator is
// silent past the timeout.
JobEnd serve_job(const JobServing& job, const std::function<nlohmann::json()>& finish_detail,
                 const std::function<std::optional<JobEnd>(const transport::Command&, uint64_t request_id)>& handle,
                 const std::function<void()>& between = {});

// An `error` reply for request `request_id`.
transport::Message error_message(transport::ErrorCode code, const std::string& text, uint64_t request_id);
// An `ack` of request `request_id` whose detail is `detail` (JSON).
transport::Message ack_message(uint64_t request_id, const nlohmann::json& detail);

}  // namespace cleave
