// session_monitor.h: what `cleave train|profile|fed|split --metrics-listen
// ADDR` serves — the coordinator's state as Prometheus metrics
// (docs/monitoring.md lists them).
//
// The endpoint belongs to the process (CoordinatorMonitor): the app starts one
// from the flag and installs it (install_coordinator_monitor) before its run,
// and every Session the process opens then publishes to it through a
// SessionMetrics. Publishing happens on the session's own thread — each time
// its PeerPool receives (at most every 200 ms; the pool, the roster and the
// endpoint are not thread-safe, the registry is), when the run fails and when
// the session ends — so a scrape sees the run as of its last receive, and
// after the run its final numbers.
#pragma once

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "core/monitor/registry.h"

namespace cleave {

class PeerPool;
namespace monitor {
class MetricsServer;
}
namespace transport {
class ServerEndpoint;
struct Received;
}  // namespace transport

class CoordinatorMonitor {
 public:
  // Declares the metrics and serves them at `listen` (HOST:PORT); logs "WHO:
  // metrics on http://HOST:PORT/metrics", and a warning when the address is
  // reachable from other machines (no authentication). Throws
  // std::runtime_error("--metrics-listen: ...") when `listen` is not
  // HOST:PORT or cannot be listened on (metrics_endpoint.h).
  CoordinatorMonitor(const std::string& listen, const std::string& who);
  ~CoordinatorMonitor();
  CoordinatorMonitor(const CoordinatorMonitor&) = delete;
  CoordinatorMonitor& operator=(const CoordinatorMonitor&) = delete;

  monitor::Registry& registry() { return registry_; }
  const monitor::MetricsServer& server() const { return *server_; }

 private:
  monitor::Registry registry_;
  std::unique_ptr<monitor::MetricsServer> server_;
};

// The process's coordinator monitor, used by every Session opened from now
// on (nullptr: none, the default). Thread-safe.
void install_coordinator_monitor(std::shared_ptr<CoordinatorMonitor> monitor);
std::shared_ptr<CoordinatorMonitor> installed_coordinator_monitor();

// One session's metrics. `who` is the session's ("cleave", "cleave fed",
// "cleave split"): it names the job kind (pipeline, fed, split).
class SessionMetrics {
 public:
  SessionMetrics(std::shared_ptr<CoordinatorMonitor> monitor, const std::string& who);
  // Marks the job ended (publish once more first).
  ~SessionMetrics();
  SessionMetrics(const SessionMetrics&) = delete;
  SessionMetrics& operator=(const SessionMetrics&) = delete;

  // What PeerPool::receive returned (nullptr: nothing): the newest step or
  // round a daemon reported metrics for.
  void observe(const transport::Received* got);
  // The roster, the endpoint's traffic and the refusals now; at most every
  // 200 ms unless `now`.
  void publish(transport::ServerEndpoint& server, PeerPool& pool, bool now = false);
  // The run failed with `text`, or a daemon of it died.
  void error(const std::string& text);

 private:
  std::shared_ptr<CoordinatorMonitor> monitor_;
  monitor::Registry& r_;
  std::string kind_;
  monitor::RunningTotals totals_;  // this session's endpoint and pool count from 0
  std::set<std::string> reported_dead_;
  std::chrono::steady_clock::time_point last_publish_{};
};

}  // namespace cleave
