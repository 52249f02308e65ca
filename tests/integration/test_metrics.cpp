// test_metrics.cpp: `--metrics-listen` end to end (issue 19, part; the
// metrics are listed in docs/monitoring.md). Real cleaved processes serve
// their state: scraped idle (no job yet, memory gauges), during and after a
// 2-daemon pipeline job (jobs run, steps, bytes per link), and after errors
// they report and handshakes they fail; the coordinator's endpoint (installed
// the way `cleave ... --metrics-listen` does) is scraped during and after the
// run and shows the devices, their bytes, the step and a failed run's error.
// Bad values of the flag are usage errors naming it, a port in use a clear
// start-up failure.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "apps/cli_util.h"
#include "cleave/version.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/runtime/coordinator/session_monitor.h"
#include "core/monitor/http_server.h"
#include "integration/daemon_cluster.h"
#include "monitor/http_client.h"
#include "skip.h"
#include "transport/endpoint.h"
#include "transport/keys.h"

using namespace cleave;
using namespace std::chrono_literals;
using cleave::testing::DaemonCluster;
using cleave::testing::http_body;
using cleave::testing::http_get;
using cleave::testing::metric_value;

namespace {

// The port daemon `i` logged for its metrics ("metrics on http://127.0.0.1:PORT/metrics"), waiting up to 20 s.
int logged_metrics_port(const DaemonCluster& cluster, int i) {
  const std::regex line(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  for (int tries = 0; tries < 400; ++tries) {
    std::smatch m;
    const std::string log = cluster.log(i);
    if (std::regex_search(log, m, line)) return std::stoi(m[1]);
    std::this_thread::sleep_for(50ms);
  }
  FAIL("daemon " << i << " logged no metrics address:\n" << cluster.log(i));
  return 0;
}

// The metrics text at `port`, waiting (up to 10 s) until `ready` holds for it.
template <typename Ready>
std::string scrape_until(int port, Ready ready) {
  std::string text;
  for (int tries = 0; tries < 200; ++tries) {
    text = http_body(http_get(port));
    if (ready(text)) return text;
    std::this_thread::sleep_for(50ms);
  }
  return text;
}

TrainConfig tiny_mlp_run() {
  TrainConfig c;
  c.model_path = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  c.epochs = 1;
  c.batch = 32;
  c.seed = 5;
  c.limit_train = 128;  // 4 steps
  c.limit_test = 64;
  c.microbatches = 2;
  c.threads = 1;
  c.progress = false;
  return c;
}

// Removes the process's coordinator monitor when a case ends, however it ends.
struct InstalledMonitor {
  std::shared_ptr<CoordinatorMonitor> monitor = std::make_shared<CoordinatorMonitor>("127.0.0.1:0", "test");
  InstalledMonitor() { install_coordinator_monitor(monitor); }
  ~InstalledMonitor() { install_coordinator_monitor(nullptr); }
  int port() const { return monitor->server().bound().port; }
};

}  // namespace

TEST_CASE("cleaved and the coordinator serve their state before, during and after a 2-daemon pipeline job",
          "[integration][metrics]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(2);
  const std::string coordinator = "tcp://127.0.0.1:" + std::to_string(testing::free_loopback_port());
  // Two jobs allowed, so the daemons are still there to be scraped after the first.
  for (int i = 1; i <= 2; ++i) cluster.start(i, coordinator, {"--max-jobs", "2", "--metrics-listen", "127.0.0.1:0"});
  const int port1 = logged_metrics_port(cluster, 1), port2 = logged_metrics_port(cluster, 2);

  // Idle, with no coordinator yet: no job, memory gauges, version and device.
  // The endpoint is up before the device is opened: wait for the device's sample.
  const std::string idle = scrape_until(port1, [](const std::string& t) {
    return metric_value(t, "cleaved_device_memory_total_bytes") >= 0;
  });
  INFO(idle);
  CHECK(idle.find("# TYPE cleaved_jobs_total counter\n") != std::string::npos);
  CHECK(idle.find("\ncleaved_jobs_total{") == std::string::npos);  // none ended yet
  CHECK(metric_value(idle, "cleaved_busy") == 0);
  CHECK(metric_value(idle, "cleaved_coordinator_connected") == 0);
  CHECK(metric_value(idle, "cleaved_device_memory_total_bytes") > 0);
  CHECK(metric_value(idle, "cleaved_device_memory_used_bytes") >= 0);
  CHECK(metric_value(idle, "cleaved_device_memory_peak_bytes") >= 0);
  CHECK(metric_value(idle, "cleaved_build_info{version=\"" CLEAVE_VERSION_STRING "\"}") == 1);
  CHECK(idle.find("cleaved_device_info{name=\"dev1\",backend=\"cpu\",device=\"cpu") != std::string::npos);

  // The run, with the coordinator's endpoint installed and both endpoints scraped while it goes.
  InstalledMonitor coord;
  std::atomic<bool> done{false};
  std::atomic<double> coord_running{0}, coord_live{0}, daemon_busy{0}, daemon_connected{0};
  std::thread scraper([&] {
    while (!done) {
      const std::string c = http_body(http_get(coord.port(), "/metrics", 2000));
      if (metric_value(c, "cleave_coordinator_current_job{kind=\"pipeline\"}") == 1) coord_running = 1;
      coord_live = std::max<double>(coord_live, metric_value(c, "cleave_coordinator_devices_live"));
      const std::string d = http_body(http_get(port1, "/metrics", 2000));
      if (metric_value(d, "cleaved_current_job{kind=\"stage\"}") == 1 && metric_value(d, "cleaved_busy") == 1)
        daemon_busy = 1;
      if (metric_value(d, "cleaved_coordinator_connected") == 1) daemon_connected = 1;
      std::this_thread::sleep_for(20ms);
    }
  });
  ClusterOptions cl = cluster.options(2);
  cl.listen = coordinator;
  nlohmann::json result;
  try {
    result = train_pipeline(tiny_mlp_run(), cl);
  } catch (...) {
    done = true;
    scraper.join();
    throw;
  }
  done = true;
  scraper.join();
  REQUIRE(result["losses"].size() == 4);
  CHECK(coord_running == 1);
  CHECK(coord_live == 2);
  CHECK(daemon_busy == 1);
  CHECK(daemon_connected == 1);

  // The daemons after the job: one stage job finished, 4 steps, bytes on every link.
  double peer_bytes = 0;
  int next_links = 0, previous_links = 0;
  for (const int port : {port1, port2}) {
    const std::string after = scrape_until(port, [](const std::string& t) {
      return metric_value(t, "cleaved_jobs_total{kind=\"stage\",outcome=\"finished\"}") == 1;
    });
    INFO(after);
    CHECK(metric_value(after, "cleaved_jobs_total{kind=\"stage\",outcome=\"finished\"}") == 1);
    CHECK(metric_value(after, "cleaved_busy") == 0);
    CHECK(after.find("\ncleaved_current_job{") == std::string::npos);
    CHECK(metric_value(after, "cleaved_steps_total{kind=\"stage\"}") == 4);
    CHECK(metric_value(after, "cleaved_job_step") == 3);
    CHECK(metric_value(after, "cleaved_link_bytes_sent_total{link=\"coordinator\",peer=\"" + coordinator + "\"}") > 0);
    CHECK(metric_value(after, "cleaved_link_bytes_received_total{link=\"coordinator\",peer=\"" + coordinator + "\"}") >
          0);
    CHECK(metric_value(after, "cleaved_device_memory_peak_bytes") > 0);
    CHECK(metric_value(after, "cleaved_errors_total") == 0);
    for (const char* link : {"next", "previous"})
      for (const char* peer : {"dev1", "dev2"}) {
        const std::string series = std::string("{link=\"") + link + "\",peer=\"" + peer + "\"}";
        const double sent = metric_value(after, "cleaved_link_bytes_sent_total" + series);
        if (sent < 0) continue;
        (std::string(link) == "next" ? next_links : previous_links) += 1;
        peer_bytes += sent + metric_value(after, "cleaved_link_bytes_received_total" + series);
      }
  }
  // Stage 0 has a next link, stage 1 a previous one: activations one way, gradients the other.
  CHECK(next_links == 1);
  CHECK(previous_links == 1);
  CHECK(peer_bytes > 0);

  // The coordinator after the run: not running, both devices, their bytes, the last step.
  const std::string c = http_body(http_get(coord.port()));
  INFO(c);
  CHECK(metric_value(c, "cleave_coordinator_runs_total{kind=\"pipeline\"}") == 1);
  CHECK(metric_value(c, "cleave_coordinator_running") == 0);
  CHECK(metric_value(c, "cleave_coordinator_devices_registered") == 2);
  CHECK(metric_value(c, "cleave_coordinator_step") == 3);
  for (const char* dev : {"dev1", "dev2"}) {
    CHECK(metric_value(c, std::string("cleave_coordinator_device_up{device=\"") + dev + "\"}") == 1);
    CHECK(metric_value(c, std::string("cleave_coordinator_peer_bytes_sent_total{peer=\"") + dev + "\"}") > 0);
    CHECK(metric_value(c, std::string("cleave_coordinator_peer_bytes_received_total{peer=\"") + dev + "\"}") > 0);
  }
  CHECK(metric_value(c, "cleave_coordinator_errors_total") == 0);
}

TEST_CASE("a failed run's error is the coordinator's last error", "[integration][metrics]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(1);
  InstalledMonitor coord;
  ClusterOptions cl = cluster.options(1);
  cl.register_timeout_ms = 300;  // nobody comes
  CHECK_THROWS(train_pipeline(tiny_mlp_run(), cl));
  const std::string c = http_body(http_get(coord.port()));
  INFO(c);
  CHECK(metric_value(c, "cleave_coordinator_errors_total") == 1);
  CHECK(metric_value(c, "cleave_coordinator_last_error_timestamp_seconds") > 0);
  CHECK(c.find("\ncleave_coordinator_last_error_info{message=\"") != std::string::npos);
  CHECK(metric_value(c, "cleave_coordinator_running") == 0);
}

TEST_CASE("a daemon's errors and refused handshakes show on its endpoint", "[integration][metrics]") {
  DaemonCluster cluster(2);
  transport::ServerOptions so;
  so.bind = "tcp://127.0.0.1:*";
  so.keys = transport::load_secret_key(cluster.coordinator_key());
  so.allow = transport::AllowList::load(cluster.allow());
  so.label = "test coordinator";
  transport::ServerEndpoint server(so);
  cluster.start(1, server.endpoint(), {"--metrics-listen", "127.0.0.1:0"});
  // dev2 pins a key the coordinator does not hold: every handshake fails.
  transport::write_keypair(cluster.dir(), "impostor", transport::generate_keypair(), true);
  const std::string dir = cluster.dir();
  struct Process {
    pid_t pid;
    ~Process() { terminate(pid, 2000); }
  } dev2{spawn({std::string(CLEAVE_BINARY_DIR) + "/apps/cleaved/cleaved", "--coordinator", server.endpoint(), "--key",
                dir + "/dev2.key", "--coordinator-key", dir + "/impostor.pub", "--name", "dev2", "--backend", "cpu",
                "--threads", "1", "--metrics-listen", "127.0.0.1:0"},
               dir + "/dev2.log")};
  const int port1 = logged_metrics_port(cluster, 1), port2 = logged_metrics_port(cluster, 2);

  // A step before any assignment: dev1 answers with an error, which becomes its last error.
  std::string peer;
  for (int tries = 0; tries < 200 && peer.empty(); ++tries)
    if (auto r = server.receive(100ms); r && std::holds_alternative<transport::RegisterMsg>(r->message.body))
      peer = r->peer;
  REQUIRE(peer == "dev1");
  REQUIRE(server.send(peer, transport::command_message(transport::StepCmd{0, 8}, 5)).ok());
  const std::string text = scrape_until(port1, [](const std::string& t) {
    return metric_value(t, "cleaved_errors_total") >= 1;
  });
  INFO(text);
  CHECK(metric_value(text, "cleaved_errors_total") == 1);
  CHECK(metric_value(text, "cleaved_last_error_info{message=\"dev1 has no stage assigned\"}") == 1);
  CHECK(metric_value(text, "cleaved_last_error_timestamp_seconds") > 0);
  CHECK(metric_value(text, "cleaved_coordinator_connected") == 1);
  CHECK(metric_value(text, "cleaved_refused_connections_total{link=\"coordinator\"}") == 0);

  const std::string refused = scrape_until(port2, [](const std::string& t) {
    return metric_value(t, "cleaved_refused_connections_total{link=\"coordinator\"}") >= 1;
  });
  INFO(refused);
  CHECK(metric_value(refused, "cleaved_refused_connections_total{link=\"coordinator\"}") >= 1);
  CHECK(metric_value(refused, "cleaved_coordinator_connected") == 0);
}

TEST_CASE("cleaved and cleave refuse a bad --metrics-listen value naming the flag, fail on a port in use, and warn about a "
          "non-loopback address is warned about",
          "[integration][metrics]") {
  using namespace cleave::cli_test;
  for (const char* bad : {"nonsense", "127.0.0.1:70000", "::1:9464"}) {
    INFO(bad);
    require_cleaved_usage_error(std::string("--coordinator tcp://127.0.0.1:9 --insecure --metrics-listen '") + bad + "'",
                                {"metrics-listen", "is not HOST:PORT"});
    require_usage_error(std::string("train --model ") + kMlp + " --insecure --metrics-listen '" + bad + "'",
                        {"--metrics-listen", "is not HOST:PORT"});
  }
  monitor::MetricsServer taken(monitor::parse_listen_address("127.0.0.1:0"), [] { return std::string(); });
  const std::string addr = "127.0.0.1:" + std::to_string(taken.bound().port);
  const RunResult r =
      run_cleaved("--coordinator tcp://127.0.0.1:9 --insecure --name dev --backend cpu --metrics-listen " + addr);
  INFO(r.output);
  CHECK(r.code == kExitFailure);
  CHECK(r.output.find("--metrics-listen: cannot serve metrics on " + addr + ": Address already in use") !=
        std::string::npos);

  // Reachable from other machines: served, with a warning that nothing guards it.
  const RunResult open = run_cleaved("--coordinator tcp://127.0.0.1:9 --insecure --name dev --backend cpu "
                                     "--connect-timeout 1 --metrics-listen 0.0.0.0:0");
  INFO(open.output);
  CHECK(std::regex_search(open.output, std::regex(R"(cleaved dev: metrics on http://0\.0\.0\.0:\d+/metrics)")));
  CHECK(open.output.find("has no authentication: anyone who can reach it can read this daemon's state") !=
        std::string::npos);
}
