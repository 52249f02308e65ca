// fed_coordinator.h: federated averaging across cleaved client daemons
// (`cleave fed`).
//
// The coordinator listens (CURVE + allow-list), waits for N federated clients
// (daemons started with their own data, see fed_client.h), sends each the model
// once (`assign` with training_json {"mode": "fed"}), then runs rounds: it
// samples a seeded fraction of the live clients (at least K), sends them the
// global parameter block (`weights`) and a `control` {"op": "fed_round"}, and
// collects their new blocks until every sampled client answered, dropped out or
// the round timeout passed. Updates with NaN/Inf or the wrong size are rejected
// (logged, counted). With at least K acceptable updates the round aggregates
// them (core/fed/strategy.h) and evaluates the global model on the test set the
// coordinator owns; with fewer it fails saying how many arrived. Updates are
// untrusted: a sample count above what the client registered (or
// --max-client-samples) is refused and counted in `refused_messages` by
// reason, --max-update-norm clips every update, and a trimmed mean that
// would trim nothing is refused. The coordinator never receives a training sample; it records every message kind
// each client sent so a run can prove it (`messages_from_clients`).
// Issue 18: Krum and multi-Krum (core/fed/krum.h) beside median and trimmed
// mean; client-level differential privacy (DP-FedAvg, core/fed/dp.h) with an
// RDP accountant (core/fed/accountant.h) whose epsilon is reported every
// round, and --dp-target-epsilon stops the run before a round would exceed
// it (docs/privacy.md).
// Issue 15: with a checkpoint directory every round's global weights also go
// there (core/train/checkpoint_dir.h, the newest two kept, step = rounds
// done), and `resume` continues from the newest valid one, skipping corrupt
// ones with a warning. A client that dropped out and whose daemon registers
// again during the run gets the model again and is sampled from the next
// round on (the round's "rejoined").
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/fed/dp.h"
#include "core/fed/strategy.h"
#include "core/train/train_config.h"

namespace cleave {

struct FedOptions {
  int clients = 2;                   // N: clients to wait for
  int rounds = 1;                    // R
  int local_epochs = 1;              // E: passes over each client's shard per round
  double fraction = 1.0;             // F: share of live clients sampled per round, in (0, 1]
  int min_clients = 1;               // K: acceptable updates a round needs
  double round_timeout_s = 600;      // a round closes after this long with what it has
  std::string strategy = "fedavg";   // fedavg | fedprox | median | trimmed-mean | krum | multi-krum
  double mu = 0.01;                  // FedProx proximal weight (fedprox only)
  double trim_fraction = 0.1;        // trimmed-mean: share cut from each end per coordinate
  int krum_f = 1;                    // krum, multi-krum: Byzantine clients assumed per round (--krum-f)
  int krum_m = 0;                    // multi-krum: updates averaged (--krum-m; 0: sampled - f)
  DpSettings dp;                     // --dp-clip, --dp-noise-multiplier, --dp-delta, --dp-target-epsilon
  // Secure aggregation (fed_secagg.h): the coordinator learns only the sum of each round's updates.
  bool secure_aggregation = false;   // --secure-aggregation (fedavg and fedprox only; needs CURVE)
  int secagg_threshold = 0;          // --secagg-threshold t (0: a majority of the clients sampled, at least 2)
  double secagg_range = 16;          // --secagg-range: each coordinate of an update is clamped to [-range, range]
  int secagg_bits = 24;              // --secagg-bits: fractional bits of the fixed-point encoding
  // Test hooks (fed_secagg.h: SecureRoundIo::before_delivery, before_unmask).
  std::function<void(int round, const std::vector<std::string>& u2)> on_secagg_delivery;
  std::function<void(int round, const std::vector<std::string>& survivors)> on_secagg_unmask;
  // Bounds on what one client's update may weigh (issue 13). An update's
  // sample count may never exceed local_epochs x the samples its client
  // registered; with max_client_samples > 0 not local_epochs x that either.
  int64_t max_client_samples = 0;    // --max-client-samples (0: no cap beyond the registered count)
  double max_update_norm = 0;        // --max-update-norm: > 0 clips every update's L2 distance from the global block
  std::string key_path;              // coordinator's secret key
  std::string allow_path;            // directory of admitted .pub files (or one file)
  std::string listen = "tcp://*:7000";
  bool insecure = false;
  int register_timeout_ms = 120000;  // waiting for N clients
  int peer_timeout_ms = 10000;       // a client silent this long is declared dead
  bool shutdown_clients = false;     // tell the clients to exit at the end
  // After every round the global weights go to this directory as
  // step-<rounds done>.ckpt (save_fed_state, the newest two kept); "" for none.
  std::string checkpoint_dir;
  // checkpoint_dir is a temporary one of this run's: removed when the run
  // succeeds, or fails before its first checkpoint (nothing to resume).
  bool checkpoint_dir_temporary = false;
  // Start from the newest valid checkpoint in checkpoint_dir (as --load
  // would), skipping unreadable or corrupt ones; not with --load or --init.
  bool resume = false;
  std::function<bool()> interrupted;                     // polled; true stops the run (Ctrl-C)
  std::function<void(const std::string&)> on_listening;  // called with the bound endpoint
  // Test hook: called after round `round`'s weights and control went out to the sampled clients.
  std::function<void(int round, const std::vector<std::string>& sampled)> on_round_started;

  // Throws std::invalid_argument naming the first bad setting (also a
  // trimmed mean that would trim nothing from the clients sampled per round,
  // Krum with fewer than 2f + 3 of them, DP with a strategy that is not a
  // mean, and a --dp-target-epsilon the first round alone would exceed).
  void validate() const;
  void validate_secure_aggregation(FedStrategy strategy, int per_round) const;  // part of validate()
};

// The aggregation options `o` sets, over the round's global block (DP is added by the round).
AggregateOptions aggregate_options(const FedOptions& o, const std::vector<float>* global);

// How many of `live` clients a round samples: ceil(fraction x live), at
// least min_clients, at most live.
int sampled_per_round(double fraction, int live, int min_clients);

// The threshold a round of `sampled` clients uses with secure aggregation:
// --secagg-threshold, or a majority (sampled / 2 + 1), at least 2.
int secagg_threshold(const FedOptions& o, int sampled);

// Runs the federated job described by `config` (model, optimizer, batch,
// seed, limit_test and dataset for the test set; the training split stays on
// the clients) and `options`. Returns the result JSON: mode "fed", strategy,
// clients, rounds [{round, accuracy, loss, train_loss, participating, sampled,
// dropped, rejected, clipped, clipped_count, bytes_down, bytes_up, seconds;
// krum_selected with Krum; epsilon, dp_clipped, dp_clipped_count with DP;
// rejoined: the clients that came back before the round}],
// test_accuracy, test_loss, refused_messages ({reason: count}),
// clipped_updates, messages_from_clients, devices, stopped_reason, with DP
// epsilon, dp_delta, dp_noise_multiplier, dp_clip, ..., with a checkpoint
// directory checkpoint_dir, and when resumed "resumed" {from, rounds_done,
// skipped: ["PATH: why"]}. Throws std::runtime_error with
// a clear message on failure (too few clients, a round below K updates).
nlohmann::json train_federated(const TrainConfig& config, const FedOptions& options);

}  // namespace cleave
