// services.h: what an idle daemon does for the planner before any job is
// assigned: profile a model's layers on its device, and serve or run link
// probes to the other daemons (link_probe.h). See docs/protocol.md.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/runtime/daemon/job_context.h"
#include "core/runtime/daemon/link_probe.h"
#include "transport/message.h"

namespace cleave {

class DaemonServices {
 public:
  explicit DaemonServices(const JobContext& ctx) : ctx_(ctx) {}

  // Answers `command` when it is a service (Profile, ProbeServe, ProbePeer,
  // ProbeStop) and returns true; false for any other command.
  bool handle(const transport::Command& command, uint64_t request_id);

 private:
  void profile(const transport::ProfileCmd& c, uint64_t rid);
  nlohmann::json probe(const transport::Command& c);

  const JobContext& ctx_;
  std::map<std::string, std::unique_ptr<ProbeEchoServer>> probe_servers_;  // by the peer they answer
};

}  // namespace cleave
