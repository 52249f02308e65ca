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
#include <string>

#include "core/runtime/daemon/fed_client.h"

namespace cleave {

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
  FedClientOptions fed;            // federated client data (--dataset/--shard); empty: none (fed_client.h)
};

// Exit code when no authenticated connection to the coordinator was made
// within connect_timeout_ms.
inline constexpr int kExitNoCoordinator = 2;

// Runs until `stop` becomes true, a shutdown control arrives, or max_jobs jobs
// ran. Returns the process exit code. Throws std::runtime_error only for bad
// start-up input (keys, backend), before serving.
int run_daemon(const DaemonOptions& options, const std::atomic<bool>& stop);

}  // namespace cleave
