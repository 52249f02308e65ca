// strategy.h: federated aggregation over parameter blocks.
//
// A client update is its whole parameter block after local training plus the
// number of samples it trained on. Strategies are pure functions from a list of
// updates to the new global block: FedAvg (weighted by samples; FedProx uses
// the same aggregation, its proximal term lives in the clients' local
// training), coordinate-wise median, and coordinate-wise trimmed mean.
// Updates with NaN/Inf or the wrong size are rejected before aggregation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cleave {

enum class FedStrategy { fedavg, fedprox, median, trimmed_mean };

FedStrategy parse_fed_strategy(const std::string& name);  // throws std::invalid_argument
const char* fed_strategy_name(FedStrategy s);

struct ClientUpdate {
  std::string client;        // for messages
  std::vector<float> params; // whole block after local training
  int64_t samples = 0;
};

// Why an update was refused, or "" when it is acceptable.
std::string check_update(const ClientUpdate& u, size_t expected_size);

struct AggregateResult {
  std::vector<float> params;
  std::vector<std::string> accepted;              // clients whose updates were used
  std::vector<std::string> rejected;              // "client: reason"
};

// Aggregates the acceptable updates. `trim_fraction` is the share cut from each
// end per coordinate for trimmed_mean (e.g. 0.1; other strategies ignore it).
// Throws std::runtime_error when no update is acceptable, std::invalid_argument
// for a trimmed_mean trim fraction outside [0, 0.5).
AggregateResult aggregate(FedStrategy strategy, const std::vector<ClientUpdate>& updates, size_t expected_size,
                          double trim_fraction = 0.1);

}  // namespace cleave
