// session.h: what every coordinator run has, whatever its job kind — the one
// skeleton the pipeline, federated and split drivers are built on.
//
// A Session listens (CURVE with the coordinator's key and the allow-list, or
// plain TCP with --insecure), owns the roster of daemons with liveness
// (PeerPool: heartbeats, silence, disconnects, the message audit), hands out
// request ids from one counter, runs registration until the driver has the
// daemons it needs, and releases the daemons at the end — and on any error,
// so that a failed run never leaves a daemon serving a dead job. A driver
// holds only what is particular to its job kind.
//
// What the coordinator receives is capped by kind (transport/message.h
// DecodeLimits): headers are control messages (<= 1 MiB) and payload frames
// at most SessionOptions::max_payload_bytes, which becomes ZMQ_MAXMSGSIZE
// before the socket binds, so a bigger frame is refused before it is
// buffered. A driver sets it from its job (job_payload_cap). The allow-list
// is watched: removing a key file (or replacing it, then SIGHUP: `cleave`
// calls transport::request_allow_list_reload) revokes that key within about a
// second, and the pool marks the peer dead with reason "key revoked".
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/runtime/coordinator/peer_pool.h"
#include "core/util/seconds.h"
#include "transport/endpoint.h"
#include "transport/message.h"

namespace cleave {

struct ModelSpec;
class SessionMetrics;

struct SessionOptions {
  std::string who;         // log and progress prefix: "cleave", "cleave fed", "cleave split"
  std::string listen;      // ZeroMQ endpoint to bind, e.g. tcp://*:7000
  std::string key_path;    // the coordinator's secret key
  std::string allow_path;  // directory of admitted .pub files (or one file)
  bool insecure = false;
  int peer_timeout_ms = 5000;
  // Largest payload frame accepted (bytes); 0: kDefaultCoordinatorPayloadBytes.
  size_t max_payload_bytes = 0;
  std::function<bool()> interrupted;                     // polled; true stops the run
  std::function<void(const std::string&)> on_listening;  // called with the bound endpoint
};

// The session part of a driver's own options: any options struct with the
// fields above of the same names (FedOptions, SplitOptions, ClusterOptions).
// `max_payload_bytes`: the job's cap (job_payload_cap), 0 for the default.
template <typename DriverOptions>
SessionOptions session_options(std::string who, const DriverOptions& o, size_t max_payload_bytes = 0) {
  return SessionOptions{.who = std::move(who),
                        .listen = o.listen,
                        .key_path = o.key_path,
                        .allow_path = o.allow_path,
                        .insecure = o.insecure,
                        .peer_timeout_ms = o.peer_timeout_ms,
                        .max_payload_bytes = max_payload_bytes,
                        .interrupted = o.interrupted,
                        .on_listening = o.on_listening};
}

// The payload cap of a coordinator whose driver does not give its job's:
// generous for the models cleave trains, and far below what would let one
// peer exhaust the coordinator's memory.
inline constexpr size_t kDefaultCoordinatorPayloadBytes = size_t{256} << 20;

// The largest payload frame a coordinator of this job receives: a stage's
// state with every parameter of the model and its optimizer state (the
// largest stage there can be: params x (1 + optimizer states) floats, which
// also covers federated weights), or a float32 batch tensor of `batch` samples
// at the widest layer boundary — whichever is larger. Pass it to
// session_options.
size_t job_payload_cap(const ModelSpec& spec, const std::string& optimizer_kind, double momentum, int64_t batch);

// One registration seen by Session::register_until.
struct Registration {
  std::string peer;  // its authenticated name
  const transport::RegisterMsg& reg;
  nlohmann::json details;  // reg.details_json parsed ({} when absent, or when refused: see details_error)
  // Why details_json was refused ("" when it was not): over the size or depth
  // of kPeerJsonLimits (core/io/untrusted_json.h), not JSON, or not an object.
  // The driver decides whether that refuses the daemon.
  std::string details_error;
};

// `reg` of `peer` with its details_json parsed within kPeerJsonLimits
// (details_error says why they were refused). `reg` must outlive the result.
Registration parse_registration(const std::string& peer, const transport::RegisterMsg& reg);

class Session {
 public:
  // Listens; with a coordinator monitor installed (session_monitor.h,
  // `--metrics-listen`), the run's metrics are published to it from here on.
  explicit Session(SessionOptions options);
  // Publishes the run's final metrics, if any.
  ~Session();

  transport::ServerEndpoint& server() { return *server_; }
  PeerPool& pool() { return *pool_; }
  const std::string& who() const { return options_.who; }
  uint64_t next_request_id() { return pool_->next_request_id(); }

  // Registration: every daemon that registers for the first time is offered
  // to `offer` (which adds it to the pool when it wants it) until `done()`.
  // After `timeout_ms` it throws std::runtime_error("TEXT") with
  // TEXT = missing(names of those registered so far).
  void register_until(int timeout_ms, const std::function<bool()>& done,
                      const std::function<void(const Registration&)>& offer,
                      const std::function<std::string(const std::string& registered)>& missing);
  // Refuses the registration of `peer` (a `role`: "device", "client") because
  // its details are unreadable or do not fit the job: logged ("WHO: ROLE
  // PEER: WHY: registration refused") and counted
  // ("registration_details_invalid") the first time only (a daemon registers
  // again every second).
  void refuse_registration(const std::string& role, const std::string& peer, const std::string& why);
  // "; refused NAME: WHY" for each refused registration, for the message a
  // register timeout ends with ("" when none was refused).
  std::string refused_registrations() const;

  // Ends the job of each of `names` that is still alive (Finish) and, when
  // `shutdown`, tells it to exit. Errors are ignored: the daemons notice a
  // silent coordinator anyway.
  void release(const std::vector<std::string>& names, bool shutdown);

  // Runs `body`; if it throws, stops monitoring, calls `stop` (release the
  // daemons) and rethrows: the orderly stop on error every driver needs.
  template <typename Body>
  auto stop_on_error(Body&& body, const std::function<void()>& stop) -> decltype(body()) {
    try {
      return body();
    } catch (...) {
      pool_->set_monitoring(false);
      note_failure();
      stop();
      throw;
    }
  }

  // A job's life after registration: runs `body` (which returns the result)
  // with the roster monitored, then stops monitoring and releases `names`
  // (see release) — when `body` returns and, rethrowing, when it throws.
  template <typename Body>
  auto run_job(const std::vector<std::string>& names, bool shutdown, Body&& body) -> decltype(body()) {
    pool_->set_monitoring(true);
    auto result = stop_on_error(body, [&] { release(names, shutdown); });
    pool_->set_monitoring(false);
    release(names, shutdown);
    return result;
  }

  // {"name", "gflops", "details"} of each of `names`, for the result JSON.
  nlohmann::json devices_json(const std::vector<std::string>& names);
  // {name: {kind: count}}: the message kinds each of `names` sent, the run's audit.
  nlohmann::json message_kinds_json(const std::vector<std::string>& names) const;

 private:
  // Inside a catch: the exception's message becomes the metrics' last error.
  void note_failure();

  SessionOptions options_;
  std::unique_ptr<transport::ServerEndpoint> server_;
  std::unique_ptr<PeerPool> pool_;
  std::map<std::string, std::string> refused_registrations_;  // daemon -> why its registration was refused
  std::unique_ptr<SessionMetrics> metrics_;  // null unless a coordinator monitor is installed
};

}  // namespace cleave
