// fed_secagg.h: the coordinator's side of a secure-aggregation round (`cleave
// fed --secure-aggregation`, issue 18; the protocol is in
// core/runtime/common/secagg_round.h and docs/privacy.md).
//
// After the round's global block and FedRound command (with its SecAggSetup)
// went out, the sampled clients train and then, instead of sending weights,
// run four exchanges with the coordinator: keys -> roster, shares -> delivery,
// masked update -> unmask, reveal. Each exchange waits until every client
// still in the round answered, dropped out (PeerPool's liveness) or the
// round's deadline passed; whoever is missing is left out of the sets that
// follow. A client's message that does not belong (wrong phase, round or
// size, a sample count beyond its bound, weights in the clear) is refused,
// counted by reason and changes nothing. The coordinator learns the weighted
// sum of the surviving clients' updates, and never one update alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/runtime/coordinator/session.h"
#include "transport/message.h"

namespace cleave {

// What the federated driver lends a secure round.
struct SecureRoundIo {
  Session& session;
  int round = 0;                          // 0-based, as on the wire
  std::vector<std::string> sampled;       // roster order (setup.clients[i].name == sampled[i])
  transport::SecAggSetup setup;
  size_t num_elements = 0;                // the global block's size
  uint64_t request_id = 0;                // the round's request id (every reply carries it)
  std::chrono::steady_clock::time_point deadline;  // the round's --round-timeout
  // "" when a client may weigh its masked update with `sample_count`, else why not (refused, counted).
  std::function<std::string(const std::string& client, int64_t sample_count)> refuse_samples;
  // Test hooks (a test kills a client in them): before_delivery is called
  // with U2 (clients whose shares arrived) before the shares are delivered,
  // so a client killed there drops after sharing keys and before masking;
  // before_unmask with U3 (masked updates that count) before the reveals are
  // asked for, so a client killed there drops after sending its masked update.
  std::function<void(int round, const std::vector<std::string>& u2)> before_delivery;
  std::function<void(int round, const std::vector<std::string>& survivors)> before_unmask;
};

struct SecureRoundResult {
  std::vector<double> weighted_sum;  // sum over survivors of w x clamp(update), w = samples or 1
  double total_weight = 0;
  std::vector<std::string> survivors;            // whose masked update counted
  std::vector<std::string> dropped;              // "name: why", sampled clients whose update did not count
  std::vector<std::string> dropped_after_masking;  // survivors that did not reveal (their update still counts)
  std::map<std::string, transport::MetricsMsg> metrics;  // the survivors' local loss
  nlohmann::json audit;  // threshold, sets, the shares of each client's secrets the coordinator held
};

// Runs the exchange. Throws std::runtime_error naming the round when it
// cannot finish (fewer than t clients left at any point): the caller keeps
// the previous global model.
SecureRoundResult run_secure_round(const SecureRoundIo& io);

}  // namespace cleave
