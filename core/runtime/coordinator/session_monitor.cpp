// session_monitor.cpp: see session_monitor.h; the metrics and their meaning
// are listed in docs/monitoring.md (keep the two together).
#include "core/runtime/coordinator/session_monitor.h"

#include "cleave/version.h"

#include <mutex>
#include <stdexcept>

#include "core/monitor/exposition.h"
#include "core/monitor/http_server.h"
#include "core/monitor/listen_address.h"
#include "core/runtime/coordinator/peer_pool.h"
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
    {"cleave_coordinator_build_info", MetricType::gauge, "Always 1: the cleave version is the label."},
    {"cleave_coordinator_start_time_seconds", MetricType::gauge,
     "When the coordinator started serving metrics (seconds since the Unix epoch)."},
    {"cleave_coordinator_runs_total", MetricType::counter,
     "Runs (coordinator sessions) started, by job kind (pipeline, fed, split)."},
    {"cleave_coordinator_running", MetricType::gauge, "1 while a run is going, 0 before and after."},
    {"cleave_coordinator_current_job", MetricType::gauge,
     "1 with the running job's kind as the label; no sample between runs."},
    {"cleave_coordinator_step", MetricType::gauge,
     "The newest step (pipeline, split) or round (fed) a daemon reported metrics for, numbered as on the wire "
     "(from 0); -1 before the first."},
    {"cleave_coordinator_devices_registered", MetricType::gauge, "Daemons in the current or last run's roster."},
    {"cleave_coordinator_devices_live", MetricType::gauge,
     "Daemons of the roster not declared dead (disconnected, silent, or revoked)."},
    {"cleave_coordinator_device_up", MetricType::gauge, "1 per daemon of the roster while it lives, 0 once dead."},
    {"cleave_coordinator_peer_bytes_sent_total", MetricType::counter,
     "Bytes sent to each peer (message headers and payloads, before encryption)."},
    {"cleave_coordinator_peer_bytes_received_total", MetricType::counter,
     "Bytes received from each authenticated peer, valid or not."},
    {"cleave_coordinator_refused_messages_total", MetricType::counter,
     "Messages refused by who may send what (docs/protocol.md), by reason; the run's \"refused_messages\"."},
    {"cleave_coordinator_rejected_messages_total", MetricType::counter,
     "Messages that failed validation (dropped and logged)."},
    {"cleave_coordinator_refused_connections_total", MetricType::counter,
     "Failed connection handshakes: keys not on the allow-list, peers without CURVE, junk."},
    {"cleave_coordinator_errors_total", MetricType::counter, "Runs that failed and daemons that died."},
    {"cleave_coordinator_last_error_info", MetricType::gauge,
     "1 with the last error's message (control characters removed, at most 256 bytes) as the label; no sample "
     "before the first."},
    {"cleave_coordinator_last_error_timestamp_seconds", MetricType::gauge,
     "When the last error happened (seconds since the Unix epoch); 0 before the first."},
};

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string job_kind(const std::string& who) {
  if (who == "cleave fed") return "fed";
  if (who == "cleave split") return "split";
  return "pipeline";  // "cleave": training and profiling
}

std::mutex g_installed_mutex;
std::shared_ptr<CoordinatorMonitor> g_installed;

}  // namespace

CoordinatorMonitor::CoordinatorMonitor(const std::string& listen, const std::string& who) {
  for (const Metric& m : kMetrics) registry_.declare(m.name, m.type, m.help);
  registry_.set("cleave_coordinator_build_info", {{"version", CLEAVE_VERSION_STRING}}, 1);
  registry_.set("cleave_coordinator_start_time_seconds", {}, unix_now());
  registry_.set("cleave_coordinator_running", {}, 0);
  registry_.set("cleave_coordinator_step", {}, -1);
  for (const char* counter : {"cleave_coordinator_errors_total", "cleave_coordinator_rejected_messages_total",
                              "cleave_coordinator_refused_connections_total"})
    registry_.add(counter, {}, 0);
  registry_.set("cleave_coordinator_last_error_timestamp_seconds", {}, 0);
  const monitor::ListenAddress address = monitor::parse_listen_address(listen);
  try {
    server_ = std::make_unique<monitor::MetricsServer>(address, [this] { return registry_.render(); });
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--metrics-listen: ") + e.what());
  }
  transport::log(transport::LogLevel::kInfo, who + ": metrics on " + server_->url());
  if (!server_->loopback())
    transport::log(transport::LogLevel::kWarning,
                   who + ": the metrics endpoint " + server_->url() + " has no authentication: anyone who can reach "
                   "it can read the run's state; bind it to 127.0.0.1 or firewall the port");
}

CoordinatorMonitor::~CoordinatorMonitor() = default;

void install_coordinator_monitor(std::shared_ptr<CoordinatorMonitor> monitor) {
  std::lock_guard lock(g_installed_mutex);
  g_installed = std::move(monitor);
}

std::shared_ptr<CoordinatorMonitor> installed_coordinator_monitor() {
  std::lock_guard lock(g_installed_mutex);
  return g_installed;
}

SessionMetrics::SessionMetrics(std::shared_ptr<CoordinatorMonitor> monitor, const std::string& who)
    : monitor_(std::move(monitor)), r_(monitor_->registry()), kind_(job_kind(who)) {
  r_.add("cleave_coordinator_runs_total", {{"kind", kind_}}, 1);
  r_.set("cleave_coordinator_running", {}, 1);
  r_.set_only("cleave_coordinator_current_job", {{"kind", kind_}}, 1);
  r_.set("cleave_coordinator_step", {}, -1);
  r_.set("cleave_coordinator_devices_registered", {}, 0);
  r_.set("cleave_coordinator_devices_live", {}, 0);
  r_.clear("cleave_coordinator_device_up");
}

SessionMetrics::~SessionMetrics() {
  r_.set("cleave_coordinator_running", {}, 0);
  r_.clear("cleave_coordinator_current_job");
}

void SessionMetrics::observe(const transport::Received* got) {
  if (!got) return;
  if (const auto* m = std::get_if<transport::MetricsMsg>(&got->message.body))
    if (static_cast<double>(m->step) > r_.value("cleave_coordinator_step", {}, -1))
      r_.set("cleave_coordinator_step", {}, static_cast<double>(m->step));
}

void SessionMetrics::publish(transport::ServerEndpoint& server, PeerPool& pool, bool now) {
  const auto t = std::chrono::steady_clock::now();
  if (!now && t - last_publish_ < std::chrono::milliseconds(200)) return;
  last_publish_ = t;
  int live = 0;
  for (const PoolPeer& p : pool.peers()) {
    live += p.dead ? 0 : 1;
    r_.set("cleave_coordinator_device_up", {{"device", p.name}}, p.dead ? 0 : 1);
    if (p.dead && reported_dead_.insert(p.name).second) error(p.name + " " + p.dead_reason);
  }
  r_.set("cleave_coordinator_devices_registered", {}, static_cast<double>(pool.peers().size()));
  r_.set("cleave_coordinator_devices_live", {}, live);
  for (const auto& [peer, traffic] : server.peer_traffic()) {
    r_.add("cleave_coordinator_peer_bytes_sent_total", {{"peer", peer}}, totals_.advance("sent/" + peer, traffic.bytes_sent));
    r_.add("cleave_coordinator_peer_bytes_received_total", {{"peer", peer}},
           totals_.advance("received/" + peer, traffic.bytes_received));
  }
  const nlohmann::json refused = pool.refused_json();  // {reason: count}
  for (const auto& item : refused.items())
    r_.add("cleave_coordinator_refused_messages_total", {{"reason", item.key()}},
           totals_.advance("refused/" + item.key(), item.value().get<uint64_t>()));
  const transport::EndpointStats s = server.stats();
  r_.add("cleave_coordinator_rejected_messages_total", {}, totals_.advance("rejected", s.messages_rejected));
  r_.add("cleave_coordinator_refused_connections_total", {}, totals_.advance("handshakes", s.handshakes_failed));
}

void SessionMetrics::error(const std::string& text) {
  r_.add("cleave_coordinator_errors_total", {}, 1);
  r_.set_only("cleave_coordinator_last_error_info", {{"message", monitor::sanitize_label_text(text)}}, 1);
  r_.set("cleave_coordinator_last_error_timestamp_seconds", {}, unix_now());
}

}  // namespace cleave
