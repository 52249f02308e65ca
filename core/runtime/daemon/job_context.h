// job_context.h: where a daemon's job runs — its device, its connection to
// the coordinator, its keys and options — handed to every job kind's runner
// (pipeline_job.h, fed_client.h, split_job.h).
#pragma once

#include <atomic>

#include "core/runtime/daemon/daemon.h"
#include "core/runtime/daemon/job_channel.h"
#include "device/device.h"
#include "transport/keys.h"

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

}  // namespace cleave
