// session_monitor.cpp: see session_monitor.h; the metrics and their meaning
// are listed in docs/monitoring.md (keep the two together).
#include "core/runtime/coordinator/session_monitor.h"

#include <mutex>

#include "core/monitor/http_server.h"
#include "core/runtime/common/metrics_endpoint.h"
#include "core/runtime/coordinator/peer_pool.h"
#include "transport/endpoint.h"

namespace cleave {
namespace {

// The coordinator's own metrics (declare_table's format; docs/monitoring.md
// says more). declare_process_metrics adds build info, start time and errors.
constexpr const char* kPrefix = "cleave_coordinator";
constexpr const char* kMetrics = R"(
cleave_coordinator_runs_total counter Runs (coordinator sessions) started, by job kind (pipeline, fed, split).
cleave_coordinator_running gauge 1 while a run is going, 0 before and after.
cleave_coordinator_current_job gauge 1 with the running job's kind as the label; no sample between runs.
cleave_coordinator_step gauge The newest step (pipeline, split) or round (fed) a daemon reported metrics for,
  numbered as on the wire (from 0); -1 before the first.
cleave_coordinator_devices_registered gauge Daemons in the current or last run's roster.
cleave_coordinator_devices_live gauge Daemons of the roster not declared dead (disconnected, silent, or revoked).
cleave_coordinator_device_up gauge 1 per daemon of the roster while it lives, 0 once dead.
cleave_coordinator_peer_bytes_sent_total counter Bytes sent to each peer (message headers and payloads,
  before encryption).
cleave_coordinator_peer_bytes_received_total counter Bytes received from each authenticated peer, valid or not.
cleave_coordinator_refused_messages_total counter Messages refused by who may send what (docs/protocol.md),
  by reason; the run's "refused_messages".
cleave_coordinator_rejected_messages_total counter Messages that failed validation (dropped and logged).
cleave_coordinator_refused_connections_total counter Failed connection handshakes: keys not on the allow-list,
  peers without CURVE, junk.
)";

std::string job_kind(const std::string& who) {
  if (who == "cleave fed") return "fed";
  if (who == "cleave split") return "split";
  return "pipeline";  // "cleave": training and profiling
}

std::mutex g_installed_mutex;
std::shared_ptr<CoordinatorMonitor> g_installed;

}  // namespace

CoordinatorMonitor::CoordinatorMonitor(const std::string& listen, const std::string& who) {
  declare_process_metrics(registry_, kPrefix, "runs that failed and daemons that died.");
  registry_.declare_table(kMetrics);
  registry_.set("cleave_coordinator_running", {}, 0);
  registry_.set("cleave_coordinator_step", {}, -1);
  registry_.add("cleave_coordinator_rejected_messages_total", {}, 0);
  registry_.add("cleave_coordinator_refused_connections_total", {}, 0);
  server_ = serve_metrics(registry_, listen, who, "the run's");
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

void SessionMetrics::error(const std::string& text) { record_error(r_, kPrefix, text); }

}  // namespace cleave
