// job_context.h: where a daemon's job runs — its device, its connection to
// the coordinator, its keys and options — handed to every job kind's runner
// (pipeline_job.h, fed_client.h, split_job.h).
#pragma once

#include <atomic>

#include "core/runtime/daemon/daemon.h"
#include "core/runtime/daemon/job_channel.h"
#include "device/device.h"
#include "transport/keys.h"
#include "transport/log.h"

namespace cleave {

class DaemonMonitor;

struct JobContext {
  Device& device;
  JobChannel& channel;
  const transport::KeyPair& keys;
  const DaemonOptions& options;
  const std::atomic<bool>& stop;
  DaemonMonitor* monitor;  // --metrics-listen (daemon_monitor.h); nullptr: off

  // The job as serve_job and job_interruption see it; `what` names it in logs
  // and refusals ("stage", "federated job", "split job").
  JobServing serving(const char* what) const {
    return {channel, options.name, what, options.coordinator_timeout_ms, stop};
  }
  // Tells whoever embeds the daemon (the SDK's progress callback) that `job`
  // ("fed" | "stage" | "split") finished round or step `step`; `loss` is its
  // mean loss where this daemon computes one, NaN where it does not.
  void progress(const char* job, int64_t step, double loss) const {
    if (!options.on_event) return;
    DaemonEvent e;
    e.kind = DaemonEvent::Kind::progress;
    e.job = job;
    e.step = step;
    e.loss = loss;
    options.on_event(e);
  }
};

// Sets a job up with `setup`, which returns the assignment's ack detail (JSON).
// When it throws, the assignment is refused with the reason ("cleaved NAME:
// refused WHAT: ...") and false is returned: no job runs.
template <typename Setup>
bool set_up_job(const JobContext& ctx, const char* what, uint64_t request_id, Setup&& setup) {
  nlohmann::json detail;
  try {
    detail = setup();
  } catch (const std::exception& e) {
    transport::log(transport::LogLevel::kWarning, "cleaved " + ctx.options.name + ": refused " + what + ": " + e.what());
    ctx.channel.send(error_message(transport::ErrorCode::kRefused, e.what(), request_id));
    return false;
  }
  ctx.channel.send(ack_message(request_id, detail));
  return true;
}

}  // namespace cleave
