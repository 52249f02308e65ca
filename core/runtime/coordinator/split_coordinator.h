// split_coordinator.h: split learning across cleaved daemons (`cleave split`).
//
// The coordinator listens (CURVE + allow-list) and waits for N clients
// (daemons started with their own data: --dataset ... --shard i/N) and one
// server (a daemon without data, or the one named by --server). It cuts the
// model (split_layout.h), assigns the server its part and each client the
// front (and, U-shaped, the tail), and then runs epochs: in each, every client
// passes once over its shard; the server serves their batches in a
// round-robin order the coordinator lists, so a run is reproducible for a
// seed. Cut-layer tensors go straight between each client and the server
// (split_job.h). With --splitfed, the clients' blocks are averaged (FedAvg,
// weighted by samples) after every epoch. Each epoch ends with an
// evaluation: every client runs its shard of the test split through the
// split model and reports loss and accuracy; the coordinator never holds a
// sample or a label. A client that dies, disconnects or falls silent is
// dropped from the running epoch (the server is told to stop serving it; the
// others finish the epoch; SplitFed averages those that did) and rejoins at
// the next epoch if its daemon registers again. See docs/split.md.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/train/train_config.h"

namespace cleave {

struct SplitOptions {
  int clients = 1;                  // N: data clients to wait for
  std::string labels = "server";    // server: vanilla; client: U-shaped
  bool splitfed = false;            // average the client-side blocks every epoch
  int cut = -1;                     // client front [0, cut) (-1: default_split_cut)
  int cut_back = -1;                // U-shaped: client tail [cut_back, L) (-1: default)
  std::string encoding = "f32";     // cut-layer link: f32 | f16 | int8 (labels always f32)
  std::string server;               // name of the server daemon ("": the first daemon without data)
  int64_t eval_batch = 256;
  // Local DP on the cut layer (activation_noise.h): each client clips every
  // sample's activation row to L2 norm activation_clip and adds Gaussian noise
  // of standard deviation activation_noise * activation_clip before it leaves.
  double activation_noise = 0;      // SIGMA: 0 is off (no clip either)
  double activation_clip = 1.0;     // C, > 0
  std::string key_path;             // coordinator's secret key
  std::string allow_path;           // directory of admitted .pub files (or one file)
  std::string listen = "tcp://*:7000";
  bool insecure = false;
  int register_timeout_ms = 120000;
  int peer_timeout_ms = 10000;      // a daemon silent this long is declared dead (a client: dropped; the server: the run fails)
  double epoch_timeout_s = 3600;    // an epoch (training + evaluation) taking longer fails the run
  bool shutdown_daemons = false;    // tell the daemons to exit at the end
  std::function<bool()> interrupted;
  std::function<void(const std::string&)> on_listening;

  // Throws std::invalid_argument naming the first bad setting.
  void validate() const;
};

// Runs the split-learning job: `config` gives the model, optimizer, batch,
// seed, epochs and limit_test (the clients own all data). Returns the result
// JSON: mode "split", labels, splitfed, layout, losses (one per training
// batch in the server's order), rounds [{round, accuracy, loss, train_loss,
// steps, cut_bytes_up, cut_bytes_down, eval_bytes_up, eval_bytes_down,
// dropped [{client, reason, phase, step, missed_steps}], rejoined [names],
// splitfed_samples {client: samples} (SplitFed), seconds}], rejoin_weights,
// test_accuracy, test_loss, samples_per_sec, wall_seconds,
// activation_noise and activation_clip (with --activation-noise > 0),
// devices, messages_from_clients (kinds each client sent the coordinator) and
// cut_layer_messages (kinds and per-sample shapes each client sent the
// server, as the server recorded them). Throws std::runtime_error with a
// clear message when the run cannot go on (a daemon refuses or fails, the
// server is lost, or every client is gone).
nlohmann::json train_split(const TrainConfig& config, const SplitOptions& options);

}  // namespace cleave
