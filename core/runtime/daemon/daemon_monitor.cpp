// daemon_monitor.cpp: see daemon_monitor.h; the metrics and their meaning are
// listed in docs/monitoring.md (keep the two together).
#include "core/runtime/daemon/daemon_monitor.h"

#include "core/monitor/http_server.h"
#include "core/runtime/common/metrics_endpoint.h"
#include "core/runtime/daemon/job_channel.h"
#include "device/device.h"
#include "transport/endpoint.h"

namespace cleave {
namespace {

// The daemon's own metrics (declare_table's format; docs/monitoring.md says
// more). declare_process_metrics adds build info, start time and errors.
constexpr const char* kPrefix = "cleaved";
constexpr const char* kMetrics = R"(
cleaved_device_info gauge Always 1: the daemon's name, backend and device are the labels.
cleaved_coordinator_connected gauge 1 while the daemon holds an authenticated connection to the coordinator.
cleaved_busy gauge 1 while a job runs, 0 between jobs.
cleaved_current_job gauge 1 with the running job's kind (stage, fed, split) as the label;
  no sample between jobs.
cleaved_jobs_total counter Jobs that ended, by kind and outcome (finished, shutdown, abandoned, refused).
cleaved_job_step gauge The step (stage, split) or round (fed) the running or last job finished last,
  numbered as on the wire (from 0); -1 before the first.
cleaved_steps_total counter Steps (stage, split) or rounds (fed) finished, by job kind.
cleaved_link_bytes_sent_total counter Bytes sent per link: to the coordinator, messages (headers and payloads,
  before encryption); to the previous or next pipeline stage, tensor payloads as encoded.
cleaved_link_bytes_received_total counter Bytes received per link, counted as for cleaved_link_bytes_sent_total.
cleaved_refused_connections_total counter Failed connection handshakes per link: with the coordinator (a wrong
  --coordinator-key, or this device's key not on its allow-list), and of peers dialling this stage's endpoint.
cleaved_rejected_messages_total counter Messages from the coordinator that failed validation (dropped and logged).
cleaved_device_memory_total_bytes gauge The device's memory (or --memory-limit).
cleaved_device_memory_free_bytes gauge The device's memory that is free now.
cleaved_device_memory_used_bytes gauge Bytes the daemon has allocated on its device now (what --memory-limit counts).
cleaved_device_memory_peak_bytes gauge The most bytes allocated at once since the daemon started or the running
  or last pipeline stage began; 0 where the backend does not track it.
)";

const char* outcome_of(const DaemonEvent& e) { return e.outcome.empty() ? "finished" : e.outcome.c_str(); }

}  // namespace

DaemonMonitor::DaemonMonitor(const DaemonOptions& options)
    : name_(options.name), coordinator_address_(options.coordinator) {
  declare_process_metrics(registry_, kPrefix, "what the daemon sent the coordinator or ended a job with.");
  registry_.declare_table(kMetrics);
  registry_.set("cleaved_busy", {}, 0);
  registry_.set("cleaved_job_step", {}, -1);
  server_ = serve_metrics(registry_, options.metrics_listen, "cleaved " + options.name, "this daemon's");
}

DaemonMonitor::~DaemonMonitor() = default;

monitor::Registry::Collection DaemonMonitor::watch(const Device& device, const transport::ClientEndpoint& coordinator) {
  registry_.set("cleaved_device_info",
                {{"name", name_}, {"backend", backend_name(device.backend())}, {"device", device.name()}}, 1);
  const monitor::Labels link = {{"link", "coordinator"}, {"peer", coordinator_address_}};
  return registry_.collect([&device, &coordinator, link](monitor::Registry& r) {
    const MemoryInfo mem = device.memory();
    r.set("cleaved_device_memory_total_bytes", {}, static_cast<double>(mem.total));
    r.set("cleaved_device_memory_free_bytes", {}, static_cast<double>(mem.free));
    r.set("cleaved_device_memory_used_bytes", {}, static_cast<double>(device.bytes_in_use()));
    r.set("cleaved_device_memory_peak_bytes", {}, static_cast<double>(device.peak_bytes_in_use()));
    // The endpoint's counters only grow while it lives (the daemon's life): set, not added.
    const transport::EndpointStats s = coordinator.stats();
    r.set("cleaved_coordinator_connected", {}, coordinator.connected() ? 1 : 0);
    r.set("cleaved_link_bytes_sent_total", link, static_cast<double>(s.bytes_sent));
    r.set("cleaved_link_bytes_received_total", link, static_cast<double>(s.bytes_received));
    r.set("cleaved_refused_connections_total", {{"link", "coordinator"}}, static_cast<double>(s.handshakes_failed));
    r.set("cleaved_rejected_messages_total", {}, static_cast<double>(s.messages_rejected));
  });
}

std::function<void(const DaemonEvent&)> DaemonMonitor::observe(std::function<void(const DaemonEvent&)> next) {
  return [this, next = std::move(next)](const DaemonEvent& e) {
    on_event(e);
    if (next) next(e);
  };
}

void DaemonMonitor::on_event(const DaemonEvent& e) {
  switch (e.kind) {
    case DaemonEvent::Kind::job_started:
      link_totals_.restart();  // the new job's links count from 0
      registry_.set("cleaved_busy", {}, 1);
      registry_.set_only("cleaved_current_job", {{"kind", e.job}}, 1);
      registry_.set("cleaved_job_step", {}, -1);
      break;
    case DaemonEvent::Kind::progress:
      registry_.set("cleaved_job_step", {}, static_cast<double>(e.step));
      registry_.add("cleaved_steps_total", {{"kind", e.job}}, 1);
      break;
    case DaemonEvent::Kind::job_ended:
      registry_.add("cleaved_jobs_total", {{"kind", e.job}, {"outcome", outcome_of(e)}}, 1);
      registry_.set("cleaved_busy", {}, 0);
      registry_.clear("cleaved_current_job");
      break;
    case DaemonEvent::Kind::no_coordinator:
      error(e.message);
      break;
    case DaemonEvent::Kind::connected:
      break;
  }
}

void DaemonMonitor::link_traffic(const std::string& link, const std::string& peer, uint64_t bytes_sent,
                                 uint64_t bytes_received, uint64_t refused_connections) {
  const monitor::Labels labels = {{"link", link}, {"peer", peer}};
  const std::string key = link + "/" + peer;
  registry_.add("cleaved_link_bytes_sent_total", labels, link_totals_.advance(key + "/sent", bytes_sent));
  registry_.add("cleaved_link_bytes_received_total", labels, link_totals_.advance(key + "/received", bytes_received));
  registry_.add("cleaved_refused_connections_total", {{"link", link}},
                link_totals_.advance(key + "/refused", refused_connections));
}

void DaemonMonitor::error(const std::string& text) { record_error(registry_, kPrefix, text); }

std::unique_ptr<DaemonMonitor> start_daemon_monitor(DaemonOptions& options) {
  if (options.metrics_listen.empty()) return nullptr;
  auto started = std::make_unique<DaemonMonitor>(options);
  options.on_event = started->observe(std::move(options.on_event));
  return started;
}

monitor::Registry::Collection watch_daemon(DaemonMonitor* daemon_monitor, const Device& device,
                                           const transport::ClientEndpoint& coordinator, JobChannel& channel) {
  if (!daemon_monitor) return {};
  channel.on_error = [daemon_monitor](const std::string& text) { daemon_monitor->error(text); };
  return daemon_monitor->watch(device, coordinator);
}

}  // namespace cleave
