// metrics_endpoint.cpp: see metrics_endpoint.h.
#include "core/runtime/common/metrics_endpoint.h"

#include "cleave/version.h"

#include <chrono>
#include <stdexcept>

#include "core/monitor/exposition.h"
#include "core/monitor/http_server.h"
#include "core/monitor/listen_address.h"
#include "transport/log.h"

namespace cleave {
namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

void declare_process_metrics(monitor::Registry& r, const std::string& prefix, const std::string& errors) {
  using monitor::MetricType;
  r.declare(prefix + "_build_info", MetricType::gauge, "Always 1: the cleave version is the label.");
  r.declare(prefix + "_start_time_seconds", MetricType::gauge, "When it started (seconds since the Unix epoch).");
  r.declare(prefix + "_errors_total", MetricType::counter, "Errors: " + errors);
  r.declare(prefix + "_last_error_info", MetricType::gauge,
            "1 with the last error's message (control characters removed, at most 256 bytes) as the label; no "
            "sample before the first.");
  r.declare(prefix + "_last_error_timestamp_seconds", MetricType::gauge,
            "When the last error happened (seconds since the Unix epoch); 0 before the first.");
  r.set(prefix + "_build_info", {{"version", CLEAVE_VERSION_STRING}}, 1);
  r.set(prefix + "_start_time_seconds", {}, unix_now());
  r.add(prefix + "_errors_total", {}, 0);
  r.set(prefix + "_last_error_timestamp_seconds", {}, 0);
}

void record_error(monitor::Registry& r, const std::string& prefix, const std::string& text) {
  r.add(prefix + "_errors_total", {}, 1);
  r.set_only(prefix + "_last_error_info", {{"message", monitor::sanitize_label_text(text)}}, 1);
  r.set(prefix + "_last_error_timestamp_seconds", {}, unix_now());
}

std::unique_ptr<monitor::MetricsServer> serve_metrics(monitor::Registry& registry, const std::string& listen,
                                                      const std::string& who, const std::string& whose) {
  std::unique_ptr<monitor::MetricsServer> server;
  try {
    server = std::make_unique<monitor::MetricsServer>(monitor::parse_listen_address(listen),
                                                      [&registry] { return registry.render(); });
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--metrics-listen: ") + e.what());
  }
  transport::log(transport::LogLevel::kInfo, who + ": metrics on " + server->url());
  if (!server->loopback())
    transport::log(transport::LogLevel::kWarning,
                   who + ": the metrics endpoint " + server->url() + " has no authentication: anyone who can reach "
                   "it can read " + whose + " state; bind it to 127.0.0.1 or firewall the port");
  return server;
}

}  // namespace cleave
