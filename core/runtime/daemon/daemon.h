// daemon.h: the device daemon's service loop (`cleaved`).
//
// The daemon dials out to the coordinator (so devices behind NAT can join),
// registers its capabilities, and serves jobs one after another: assign (build
// the stage, bind the peer link for the previous stage), connect (dial the next
// stage), steps (run the schedule for one batch), weights (send the partition),
// finish (send the trace, drop the stage). A bad job, a dead peer or a dead
// coordinator ends that job with an error sent (when possible) and logged; the
// daemon then registers again and waits for the next job.
//
// Until the coordinator completes a CURVE handshake the daemon only dials:
// a refused key or a wrong --coordinator-key makes the endpoint back off
// (1 s doubling to 30 s, one log line per step, transport/endpoint.h), and
// with connect_timeout_ms the daemon gives up with kExitNoCoordinator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/runtime/daemon/fed_client.h"

namespace cleave {

namespace transport {
class Wakeup;
}

// What a daemon tells the program that embeds it (the SDK's progress and
// status, include/cleave/cleave.h). Delivered on the daemon's own thread.
struct DaemonEvent {
  enum class Kind {
    connected,       // the first authenticated connection to the coordinator
    job_started,     // an assignment was accepted: `job` says which kind
    progress,        // a federated round or a stage / split step done: `step`, `loss` (NaN: not known here)
    job_ended,       // the job ended (finished, abandoned or shut down)
    no_coordinator,  // connect_timeout_ms passed unconnected: `message` says why; the daemon exits
  };
  Kind kind = Kind::connected;
  std::string job;           // "stage" | "fed" | "split"
  int64_t step = -1;
  double loss = 0;
  bool refused_key = false;  // no_coordinator: handshakes were made and failed (a key problem)
  std::string message;
  std::string outcome;       // job_ended: "finished" | "shutdown" | "abandoned" | "refused" (no job ran)
};

struct DaemonOptions {
  std::string coordinator;         // tcp://HOST:PORT
  std::string key_path;            // this device's secret key (NAME.key)
  std::string coordinator_key_path;  // the coordinator's public key (.pub)
  std::string name;                // device name (defaults to the key's file stem)
  std::string backend = "auto";
  size_t memory_limit = 0;         // bytes, 0 = none
  int threads = 0;                 // CPU threads (0 = all cores)
  std::string peer_bind = "tcp://127.0.0.1:*";  // where the previous stage dials in
  double bandwidth_limit = 0;      // bytes/s on outgoing peer links, 0 = unlimited
  bool insecure = false;           // plain TCP (a warning is logged)
  int max_jobs = -1;               // exit after this many jobs (-1: serve forever)
  int coordinator_timeout_ms = 10000;  // a job is abandoned after this much silence
  int connect_timeout_ms = 0;      // give up when not connected this long after start (0: keep trying)
  // HOST:PORT where Prometheus metrics are served over HTTP (daemon_monitor.h,
  // docs/monitoring.md); "": off. Unauthenticated: a warning is logged unless loopback.
  std::string metrics_listen;
  FedClientOptions fed;            // federated client data (--dataset/--shard); empty: none (fed_client.h)
  // Which data jobs a daemon holding data takes (the SDK's roles): a federated
  // client sends parameter blocks, a split-learning client its cut layer's
  // activations, which say more about its samples. Both for `cleaved --dataset`.
  bool fed_jobs = true;
  bool split_client_jobs = true;
  // An embedding app's keys as Z85 text, used instead of key_path /
  // coordinator_key_path when set (the SDK; cleaved reads files).
  std::string secret_key_z85;
  std::string coordinator_key_z85;
  std::function<void(const DaemonEvent&)> on_event;  // empty: nobody listens
  // Polled between jobs: true releases the device's cached memory now.
  std::function<bool()> release_requested;
  // Signalled by the embedder whenever `stop` or release_requested may have
  // become true. With it, a daemon between jobs sleeps until a message, the
  // end of a handshake, its next registration (once a second) or, unconnected,
  // its --connect-timeout deadline (at most 5 s), instead of waking every
  // 100 ms to look at its flags; without it (nullptr), it looks every 100 ms.
  const transport::Wakeup* wake = nullptr;
};

// Exit code when no authenticated connection to the coordinator was made
// within connect_timeout_ms.
inline constexpr int kExitNoCoordinator = 2;

// Runs until `stop` becomes true, a shutdown control arrives, or max_jobs jobs
// ran. Returns the process exit code. Throws std::runtime_error only for bad
// start-up input (keys, backend, a client's data), before serving.
int run_daemon(const DaemonOptions& options, const std::atomic<bool>& stop);

}  // namespace cleave
