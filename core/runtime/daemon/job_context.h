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

struct JobContext {
  Device& device;
  JobChannel& channel;
  const transport::KeyPair& keys;
  const DaemonOptions& options;
  const std::atomic<bool>& stop;

  // The job as serve_job and job_interruption see it; `what` names it in logs
  // and refusals ("stage", "federated job", "split job").
  JobServing serving(const char* what) const {
    return {channel, options.name, what, options.coordinator_timeout_ms, stop};
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
