// daemon_monitor.cpp: see daemon_monitor.h; the metrics and their meaning are
// listed in docs/monitoring.md (keep the two together).
#include "core/runtime/daemon/daemon_monitor.h"

#include "cleave/version.h"

#include <chrono>
#include <stdexcept>

#include "core/monitor/exposition.h"
#include "core/monitor/http_server.h"
#include "core/monitor/listen_address.h"
#include "core/runtime/daemon/job_channel.h"
#include "device/device.h"
#include "transport/endpoint.h"
#include "transport/log.h"

namespace cleave {
namespace {

using monitor::MetricType;

struct Metric {
  const char* name;
  MetricType type;
  const char* help;
};

constexpr Metric kMetrics[] = {
    {"cleaved_build_info", MetricType::gauge, "Always 1: the cleave version this daemon runs is the label."},
    {"cleaved_device_info", MetricType::gauge, "Always 1: the daemon's name, backend and device are the labels."},
    {"cleaved_start_time_seconds", MetricType::gauge, "When the daemon started (seconds since the Unix epoch)."},
    {"cleaved_coordinator_connected", MetricType::gauge,
     "1 while the daemon holds an authenticated connection to the coordinator."},
    {"cleaved_busy", MetricType::gauge, "1 while a job runs, 0 between jobs."},
    {"cleaved_current_job", MetricType::gauge,
     "1 with the running job's kind (stage, fed, split) as the label; no sample between jobs."},
    {"cleaved_jobs_total", MetricType::counter,
     "Jobs that ended, by kind and outcome (finished, shutdown, abandoned, refused)."},
    {"cleaved_job_step", MetricType::gauge,
     "The step (stage, split) or round (fed) the running or last job finished last, numbered as on the wire "
     "(from 0); -1 before the first."},
    {"cleaved_steps_total", MetricType::counter, "Steps (stage, split) or rounds (fed) finished, by job kind."},
    {"cleaved_link_bytes_sent_total", MetricType::counter,
     "Bytes sent per link: to the coordinator, messages (headers and payloads, before encryption); to the "
     "previous or next pipeline stage, tensor payloads as encoded."},
    {"cleaved_link_bytes_received_total", MetricType::counter,
     "Bytes received per link, counted as for cleaved_link_bytes_sent_total."},
    {"cleaved_refused_connections_total", MetricType::counter,
     "Failed connection handshakes per link: with the coordinator (a wrong --coordinator-key, or this device's key "
     "not on its allow-list), and of peers dialling this stage's endpoint."},
    {"cleaved_rejected_messages_total", MetricType::counter,
     "Messages from the coordinator that failed validation (dropped and logged)."},
    {"cleaved_device_memory_total_bytes", MetricType::gauge, "The device's memory (or --memory-limit)."},
    {"cleaved_device_memory_free_bytes", MetricType::gauge, "The device's memory that is free now."},
    {"cleaved_device_memory_used_bytes", MetricType::gauge,
     "Bytes the daemon has allocated on its device now (what --memory-limit counts)."},
    {"cleaved_device_memory_peak_bytes", MetricType::gauge,
     "The most bytes allocated at once since the daemon started or the running or last pipeline stage began; "
     "0 where the backend does not track it."},
    {"cleaved_errors_total", MetricType::counter,
     "Errors the daemon reported to the coordinator or ended a job with."},
    {"cleaved_last_error_info", MetricType::gauge,
     "1 with the last error's message (control characters removed, at most 256 bytes) as the label; no sample "
     "before the first."},
    {"cleaved_last_error_timestamp_seconds", MetricType::gauge,
     "When the last error happened (seconds since the Unix epoch); 0 before the first."},
};

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* outcome_of(const DaemonEvent& e) { return e.outcome.empty() ? "finished" : e.outcome.c_str(); }

}  // namespace

DaemonMonitor::DaemonMonitor(const DaemonOptions& options)
    : name_(options.name), coordinator_address_(options.coordinator) {
  for (const Metric& m : kMetrics) registry_.declare(m.name, m.type, m.help);
  registry_.set("cleaved_build_info", {{"version", CLEAVE_VERSION_STRING}}, 1);
  registry_.set("cleaved_start_time_seconds", {}, unix_now());
  registry_.set("cleaved_busy", {}, 0);
  registry_.set("cleaved_job_step", {}, -1);
  registry_.set("cleaved_errors_total", {}, 0);
  registry_.set("cleaved_last_error_timestamp_seconds", {}, 0);
  const std::string who = "cleaved " + options.name + ": ";
  try {
    server_ = std::make_unique<monitor::MetricsServer>(monitor::parse_listen_address(options.metrics_listen),
                                                       [this] { return registry_.render(); });
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--metrics-listen: ") + e.what());
  }
  transport::log(transport::LogLevel::kInfo, who + "metrics on " + server_->url());
  if (!server_->loopback())
    transport::log(transport::LogLevel::kWarning,
                   who + "the metrics endpoint " + server_->url() + " has no authentication: anyone who can reach it "
                   "can read this daemon's state; bind it to 127.0.0.1 or firewall the port");
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

void DaemonMonitor::error(const std::string& text) {
  registry_.add("cleaved_errors_total", {}, 1);
  registry_.set_only("cleaved_last_error_info", {{"message", monitor::sanitize_label_text(text)}}, 1);
  registry_.set("cleaved_last_error_timestamp_seconds", {}, unix_now());
}

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
