// fed_client.h: the client side of federated averaging, run inside `cleaved`.
//
// A federated client is a daemon started with its own data (`--dataset ...
// --shard i/N --partition iid|dirichlet:ALPHA`). It loads its shard once at
// start, says so when it registers ({"fed_client": true, "samples": n} in the
// register details), and then serves federated jobs: an `assign` carrying a
// FedJob hands the connection to FedClient::run, which for every round
// receives the global parameter block (`weights`), then a FedRound command
// (round, local epochs, batch, mu), trains the whole model on its shard for
// E local epochs (FedProx: with the proximal term), and answers with its new
// block (`weights`, sample_count = samples trained on) and a `metrics` message
// (local loss). It never sends a training sample: only register, heartbeat,
// ack, error, weights and metrics leave it. See docs/federated.md and the
// "Federated rounds" section of docs/protocol.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/data/dataset.h"
#include "device/device.h"
#include "core/runtime/daemon/job_channel.h"
#include "transport/endpoint.h"
#include "transport/keys.h"
#include "transport/message.h"

namespace cleave {

// What a federated client trains on (cleaved flags).
struct FedClientOptions {
  std::string dataset;           // fashion-mnist | CSV file | IDX directory ("" = not a federated client)
  std::string dataset_dir;       // where fashion-mnist lives
  int shard = 0;                 // this client's shard in [0, num_shards)
  int num_shards = 1;
  std::string partition = "iid";  // iid | dirichlet:ALPHA
  uint64_t seed = 1;             // partition seed: every client of a run must use the same
  int64_t limit = -1;            // use only the first N samples of the training split before sharding
  std::string poison;            // test hook: "" | nan | inf | shape | sign-flip | scale:K (corrupts every update sent)
  // Data an embedding app supplies (the SDK fills it from the app's callbacks,
  // include/cleave/cleave.h): this client's shard itself, already in memory.
  // When set, `dataset`, `dataset_dir`, `partition` and `limit` are unused;
  // shard / num_shards are what the app says it holds ("i/N" in the register
  // details).
  std::shared_ptr<const Dataset> supplied;
  // The app's test samples (optional): what a split client evaluates on
  // instead of the test split of `dataset` (the job's limit_test keeps the first N).
  std::shared_ptr<const Dataset> supplied_test;

  bool enabled() const { return !dataset.empty() || supplied != nullptr; }
};

// Called after each federated round a client trained: (round, mean local loss).
using FedRoundHook = std::function<void(int64_t round, double loss)>;

// Parses "i/N" (0 <= i < N) into shard and num_shards; throws std::invalid_argument
// naming the problem ("--shard 4/4: shard index must be below 4").
void parse_shard_spec(const std::string& text, int& shard, int& num_shards);

// "" when `poison` is a valid value of the --poison test hook, else why not:
// nan | inf | shape (the update's values or size), sign-flip (sends
// global - (update - global)), scale:K (sends global + K (update - global), K finite).
std::string fed_poison_refusal(const std::string& poison);

// True when an assignment starts a federated job (it carries a FedJob).
bool is_fed_assign(const transport::AssignMsg& assign);

// FedProx proximal term: grads += mu * (params - global). All three (param_count)
// on the same device; mu == 0 leaves grads unchanged. Throws std::invalid_argument
// on a size mismatch or a negative / non-finite mu.
void add_proximal_term(Device& device, const Tensor& grads, const Tensor& params, const Tensor& global, float mu);

class FedClient {
 public:
  // Loads the training split and keeps shard `options.shard` (or takes
  // `options.supplied` as it is, after check_dataset). Throws
  // std::runtime_error / std::invalid_argument for bad data, shard or partition.
  explicit FedClient(FedClientOptions options);

  const Dataset& data() const { return data_; }
  // {"fed_client": true, "samples": n, "shard": "i/N", "partition": ..., "dataset": ...}.
  nlohmann::json register_details() const;

  // Serves one federated job on `channel` (the daemon's connection) until the coordinator stops it
  // (finished), asks the daemon to exit (shutdown), falls silent for
  // `coordinator_timeout_ms` or `stop` is set (abandoned). Acknowledges the
  // assignment (`assign_request_id`) first, or answers `error` Refused when the
  // model does not fit the data or the device (refused: no job ran). Errors
  // within a round are reported to the coordinator as `error` messages; the
  // job goes on with the next round.
  // `keys`: this daemon's CURVE keys (secure aggregation binds its round keys to them).
  JobEnd run(JobChannel& channel, Device& device, const transport::AssignMsg& assign,
             uint64_t assign_request_id, const transport::KeyPair& keys, const std::string& name,
             int coordinator_timeout_ms, const std::atomic<bool>& stop, const FedRoundHook& on_round = {});

 private:
  FedClientOptions options_;
  Dataset data_;
};

}  // namespace cleave
