// metrics_endpoint.h: what the daemon's and the coordinator's metrics
// (daemon/daemon_monitor.h, coordinator/session_monitor.h) share — starting
// the endpoint of `--metrics-listen`, and the metrics every cleave process
// serves under its prefix ("cleaved", "cleave_coordinator"):
//   PREFIX_build_info{version}            always 1
//   PREFIX_start_time_seconds             when it started (Unix time)
//   PREFIX_errors_total                   errors so far
//   PREFIX_last_error_info{message}       1, the last error as the label
//   PREFIX_last_error_timestamp_seconds   when (0 before the first)
#pragma once

#include <memory>
#include <string>

#include "core/monitor/registry.h"

namespace cleave {

namespace monitor {
class MetricsServer;
}

// Declares the five above and sets their starting values; `errors` ends the
// help of PREFIX_errors_total (what counts as an error).
void declare_process_metrics(monitor::Registry& registry, const std::string& prefix, const std::string& errors);

// Counts one error and makes `text` (sanitised, at most 256 bytes) the last one.
void record_error(monitor::Registry& registry, const std::string& prefix, const std::string& text);

// Serves `registry` at `listen` (HOST:PORT) and logs "WHO: metrics on URL";
// unless the address is loopback, also a warning that anyone who can reach
// it can read `whose` state. Throws std::runtime_error("--metrics-listen:
// ...") for an address that is not HOST:PORT or cannot be listened on.
std::unique_ptr<monitor::MetricsServer> serve_metrics(monitor::Registry& registry, const std::string& listen,
                                                      const std::string& who, const std::string& whose);

}  // namespace cleave
