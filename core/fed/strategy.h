// strategy.h: federated aggregation over parameter blocks.
//
// A client update is its whole parameter block after local training plus the
// number of samples it trained on. Strategies are pure functions from a list of
// updates to the new global block: FedAvg (weighted by samples; FedProx uses
// the same aggregation, its proximal term lives in the clients' local
// training), coordinate-wise median, coordinate-wise trimmed mean, Krum and
// multi-Krum (krum.h), and with differential privacy DP-FedAvg (dp.h).
//
// An update is untrusted: before any strategy sees it, it is refused for the
// wrong size, NaN/Inf, no samples, or a sample count beyond what its client
// registered (or a coordinator's cap) — each refusal a short snake_case
// reason for counting plus a message. With a maximum update norm, every
// accepted update's difference from the global block is scaled down to that
// L2 norm, whatever the strategy (issue 13; the privacy work reuses it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cleave {

enum class FedStrategy { fedavg, fedprox, median, trimmed_mean, krum, multi_krum };

struct DpSettings;  // dp.h
class NoiseSource;

FedStrategy parse_fed_strategy(const std::string& name);  // throws std::invalid_argument
const char* fed_strategy_name(FedStrategy s);

struct ClientUpdate {
  std::string client;        // for messages
  std::vector<float> params; // whole block after local training
  int64_t samples = 0;
};

// What an update may be, besides finite values and at least one sample.
struct UpdateBounds {
  size_t expected_size = 0;  // parameters in the block
  int64_t registered_samples = -1;  // the most samples the client's registration allows (-1: no bound)
  int64_t cap_samples = -1;         // the coordinator's cap on samples (-1: none)
};

// Why an update was refused: `reason` for counting ("wrong_parameter_count",
// "non_finite_values", "no_samples", "sample_count_exceeds_registered",
// "sample_count_exceeds_cap"), `message` for people.
struct UpdateRefusal {
  std::string reason;
  std::string message;
};

std::optional<UpdateRefusal> refuse_update(const ClientUpdate& u, const UpdateBounds& bounds);
// Why an update was refused (size, values, samples), or "" when it is acceptable.
std::string check_update(const ClientUpdate& u, size_t expected_size);

// Scales `params - global` down to L2 norm `max_norm` when it is longer (the
// update then lies on the sphere of that radius around `global`). Returns
// whether it scaled. Throws std::invalid_argument for blocks of different sizes.
bool clip_update(std::vector<float>& params, const std::vector<float>& global, double max_norm);

// "" when a trimmed mean with `trim_fraction` over `clients` updates cuts at
// least one value per end; otherwise why not, with the smallest client count
// for that trim and the smallest trim for that count.
std::string trimmed_mean_refusal(double trim_fraction, int64_t clients);

struct AggregateOptions {
  double trim_fraction = 0.1;           // trimmed_mean: share cut from each end per coordinate
  double max_update_norm = 0;           // > 0: clip every update to this L2 distance from `global`
  const std::vector<float>* global = nullptr;  // the round's global block; needed with max_update_norm and dp
  int krum_f = 1;                       // krum, multi_krum: Byzantine updates assumed among them
  int krum_m = 0;                       // multi_krum: updates averaged (0: n - f)
  // DP-FedAvg (dp.h), fedavg and fedprox only: with `dp` set, the mean is
  // dp_average over `dp_denominator` (the clients sampled) with `dp_noise`.
  const DpSettings* dp = nullptr;
  int dp_denominator = 0;
  NoiseSource* dp_noise = nullptr;
};

// "" when `strategy` can aggregate `updates` acceptable updates with these
// options; otherwise why not (a trimmed mean that trims nothing, Krum below
// 2f + 3 updates or with an --krum-m outside [1, n - f]).
std::string strategy_refusal(FedStrategy strategy, const AggregateOptions& options, int64_t updates);

struct AggregateResult {
  std::vector<float> params;
  std::vector<std::string> accepted;              // clients whose updates were used
  std::vector<std::string> rejected;              // "client: reason"
  std::vector<std::string> clipped;               // clients whose update was scaled to max_update_norm
  std::vector<std::string> selected;              // krum, multi_krum: the clients whose updates were averaged, best first
  std::vector<std::string> dp_clipped;            // dp: clients whose difference was scaled to the DP clip
};

// Aggregates the acceptable updates (check_update). Throws std::runtime_error
// when no update is acceptable, std::invalid_argument for a trimmed_mean trim
// fraction outside [0, 0.5), a max_update_norm or dp without a global block,
// dp with a strategy other than fedavg / fedprox, or what strategy_refusal says.
AggregateResult aggregate(FedStrategy strategy, const std::vector<ClientUpdate>& updates, size_t expected_size,
                          const AggregateOptions& options);
// The same without clipping; `trim_fraction` for trimmed_mean (other strategies ignore it).
AggregateResult aggregate(FedStrategy strategy, const std::vector<ClientUpdate>& updates, size_t expected_size,
                          double trim_fraction = 0.1);

}  // namespace cleave
