// daemon_monitor.h: what `cleaved --metrics-listen ADDR` serves — the
// daemon's state as Prometheus metrics (docs/monitoring.md lists them).
//
// Two kinds of values, written from two places:
//   - read at scrape time (watch()): the device's memory and the
//     coordinator link's counters, which are safe to read from the scraping
//     thread (atomics and mutexes inside the device and the endpoint);
//   - pushed by the daemon's own thread as things happen: jobs started and
//     ended (observe(), wrapped around DaemonOptions::on_event), steps,
//     the running job's peer links (link_traffic()), errors (error()).
// Off unless DaemonOptions::metrics_listen is set; then run_daemon owns one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/monitor/registry.h"
#include "core/runtime/daemon/daemon.h"

namespace cleave {

class Device;
class JobChannel;
namespace monitor {
class MetricsServer;
}
namespace transport {
class ClientEndpoint;
}

class DaemonMonitor {
 public:
  // Declares the metrics and serves them at options.metrics_listen; logs
  // "cleaved NAME: metrics on http://HOST:PORT/metrics", and a warning when
  // the address is reachable from other machines (the endpoint has no
  // authentication). Throws std::runtime_error("--metrics-listen: cannot
  // serve metrics on ADDR: WHY") when it cannot listen (the port in use, an
  // address not here).
  explicit DaemonMonitor(const DaemonOptions& options);
  ~DaemonMonitor();
  DaemonMonitor(const DaemonMonitor&) = delete;
  DaemonMonitor& operator=(const DaemonMonitor&) = delete;

  // Every scrape reads `device`'s memory and `coordinator`'s counters until
  // the handle is destroyed (before they are).
  [[nodiscard]] monitor::Registry::Collection watch(const Device& device,
                                                    const transport::ClientEndpoint& coordinator);

  // A DaemonOptions::on_event that counts jobs and steps and tracks the
  // running job, then passes the event on to `next` (which may be empty).
  std::function<void(const DaemonEvent&)> observe(std::function<void(const DaemonEvent&)> next);

  // The running job's link `link` ("previous", "next") to `peer`: its
  // payload bytes and the connections its endpoint refused, counted since
  // the link was made (the counters add what grew).
  void link_traffic(const std::string& link, const std::string& peer, uint64_t bytes_sent, uint64_t bytes_received,
                    uint64_t refused_connections);
  // An error this daemon reported to the coordinator or ended a job with.
  void error(const std::string& text);

  const monitor::Registry& registry() const { return registry_; }

 private:
  void on_event(const DaemonEvent& e);

  std::string name_, coordinator_address_;
  monitor::Registry registry_;
  monitor::RunningTotals link_totals_;  // the daemon's thread only
  std::unique_ptr<monitor::MetricsServer> server_;
};

// The daemon's monitor when options.metrics_listen is set (its events then
// go through it: options.on_event is wrapped), else nullptr.
std::unique_ptr<DaemonMonitor> start_daemon_monitor(DaemonOptions& options);
// Once the daemon's device and coordinator link exist: `daemon_monitor` reads them
// at every scrape and hears the errors `channel` sends, until the handle goes
// (declare it after them). An empty handle when `daemon_monitor` is null.
monitor::Registry::Collection watch_daemon(DaemonMonitor* daemon_monitor, const Device& device,
                                           const transport::ClientEndpoint& coordinator, JobChannel& channel);

}  // namespace cleave
