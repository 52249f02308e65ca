// test_strategy.cpp: the federated aggregation arithmetic (core/fed/strategy.h)
// on small hand-made parameter blocks: FedAvg weighted by samples, FedProx's
// server side (the same mean), coordinate-wise median and trimmed mean, each
// expected value worked out by hand in the comments; and the rejection of
// updates that must not reach the average (NaN, Inf, wrong size, no samples),
// of bad trim fractions, and of a round where nothing is acceptable.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/fed/strategy.h"

using namespace cleave;
using Catch::Contains;

namespace {

ClientUpdate update(const std::string& client, std::vector<float> params, int64_t samples) {
  ClientUpdate u;
  u.client = client;
  u.params = std::move(params);
  u.samples = samples;
  return u;
}

// Every coordinate to 1e-6 relative (the sums run in double, the result is float).
void check_block(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("parameter " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(1e-6).margin(1e-7));
  }
}

std::string error_of(FedStrategy s, const std::vector<ClientUpdate>& u, size_t size, double trim = 0.1) {
  try {
    aggregate(s, u, size, trim);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("fedavg weights each update by its samples", "[fed]") {
  // a: 1 sample, b: 3 samples -> weights 1/4 and 3/4.
  // (1, 2, -3) / 4 + 3 (4, -2, 0) / 4 = (0.25 + 3, 0.5 - 1.5, -0.75 + 0) = (3.25, -1, -0.75)
  const std::vector<ClientUpdate> u = {update("a", {1, 2, -3}, 1), update("b", {4, -2, 0}, 3)};
  const AggregateResult r = aggregate(FedStrategy::fedavg, u, 3);
  check_block(r.params, {3.25f, -1.f, -0.75f});
  CHECK(r.accepted == std::vector<std::string>{"a", "b"});
  CHECK(r.rejected.empty());

  // Equal samples: the plain mean. (1 + 4 + 7) / 3 = 4, (0 + 0 + 3) / 3 = 1.
  const std::vector<ClientUpdate> eq = {update("a", {1, 0}, 5), update("b", {4, 0}, 5), update("c", {7, 3}, 5)};
  check_block(aggregate(FedStrategy::fedavg, eq, 2).params, {4.f, 1.f});

  // Only the ratio of the samples matters: (1, 3) and (100, 300) give the same block.
  const std::vector<ClientUpdate> scaled = {update("a", {1, 2, -3}, 100), update("b", {4, -2, 0}, 300)};
  CHECK(aggregate(FedStrategy::fedavg, scaled, 3).params == r.params);

  // One update: returned unchanged.
  const std::vector<float> alone = {0.5f, -7.25f, 1e-3f};
  CHECK(aggregate(FedStrategy::fedavg, {update("a", alone, 9)}, 3).params == alone);
}

TEST_CASE("fedavg: sample counts beyond 32 bits weigh like small ones", "[fed]") {
  // 2^40 and 3 * 2^40 samples: weights 1/4 and 3/4 as for 1 and 3 -> 8 / 4 + 0 = 2.
  const int64_t big = int64_t{1} << 40;
  const std::vector<ClientUpdate> u = {update("a", {8}, big), update("b", {0}, 3 * big)};
  check_block(aggregate(FedStrategy::fedavg, u, 1).params, {2.f});
}

TEST_CASE("fedprox aggregates like fedavg on the server (its proximal term is in the clients)", "[fed]") {
  const std::vector<ClientUpdate> u = {update("a", {1, 2, -3}, 1), update("b", {4, -2, 0}, 3),
                                       update("c", {0.5f, 0.5f, 0.5f}, 4)};
  // Weights 1/8, 3/8, 4/8: (1 + 12 + 2) / 8 = 1.875, (2 - 6 + 2) / 8 = -0.25, (-3 + 0 + 2) / 8 = -0.125
  const AggregateResult prox = aggregate(FedStrategy::fedprox, u, 3);
  check_block(prox.params, {1.875f, -0.25f, -0.125f});
  CHECK(prox.params == aggregate(FedStrategy::fedavg, u, 3).params);
  CHECK(prox.accepted.size() == 3);
}

TEST_CASE("median: the middle value per coordinate, unweighted, robust to one outlier", "[fed]") {
  // Odd k = 3. Coordinate 0: {1, 5, 3} -> 3; 1: {-2, -1, 1e6} -> -1; 2: {0, 0, 0} -> 0.
  std::vector<ClientUpdate> u = {update("a", {1, -2, 0}, 1), update("b", {5, -1, 0}, 1),
                                 update("c", {3, 1e6f, 0}, 1)};
  check_block(aggregate(FedStrategy::median, u, 3).params, {3.f, -1.f, 0.f});
  // Sample counts do not weigh in.
  u[2].samples = 1000;
  check_block(aggregate(FedStrategy::median, u, 3).params, {3.f, -1.f, 0.f});

  // Even k = 4: the mean of the two middle values. {1, 2, 10, 4} -> (2 + 4) / 2 = 3; {-1, -3, -2, -4} -> -2.5.
  const std::vector<ClientUpdate> even = {update("a", {1, -1}, 1), update("b", {2, -3}, 1), update("c", {10, -2}, 1),
                                          update("d", {4, -4}, 1)};
  check_block(aggregate(FedStrategy::median, even, 2).params, {3.f, -2.5f});

  // The median ignores the trim fraction (even one trimmed-mean would refuse).
  check_block(aggregate(FedStrategy::median, even, 2, 0.75).params, {3.f, -2.5f});
}

TEST_CASE("median of two finite values near FLT_MAX stays finite", "[fed]") {
  // (FLT_MAX + FLT_MAX) / 2 overflows as a float sum; the result must be FLT_MAX.
  const std::vector<ClientUpdate> u = {update("a", {FLT_MAX, -FLT_MAX}, 1), update("b", {FLT_MAX, -FLT_MAX}, 1)};
  const AggregateResult r = aggregate(FedStrategy::median, u, 2);
  CHECK(r.params == std::vector<float>{FLT_MAX, -FLT_MAX});
  // And so does fedavg (weights sum to 1, accumulated in double).
  CHECK(aggregate(FedStrategy::fedavg, u, 2).params == std::vector<float>{FLT_MAX, -FLT_MAX});
}

TEST_CASE("trimmed mean cuts floor(T * k) values at each end per coordinate", "[fed]") {
  // k = 5. Coordinate 0: {-100, 1, 2, 3, 100}; coordinate 1: {5, 4, 3, 2, 1} (each sorted per coordinate).
  const std::vector<ClientUpdate> u = {update("a", {-100, 5}, 1), update("b", {1, 4}, 2), update("c", {2, 3}, 3),
                                       update("d", {3, 2}, 4), update("e", {100, 1}, 5)};
  // T = 0.2: floor(1.0) = 1 cut at each end -> mean of {1, 2, 3} = 2 and of {2, 3, 4} = 3.
  check_block(aggregate(FedStrategy::trimmed_mean, u, 2, 0.2).params, {2.f, 3.f});
  // T = 0.1: floor(0.5) = 0 -> the unweighted mean: (-100 + 1 + 2 + 3 + 100) / 5 = 1.2, 15 / 5 = 3.
  check_block(aggregate(FedStrategy::trimmed_mean, u, 2, 0.1).params, {1.2f, 3.f});
  // T = 0: nothing cut, the same.
  check_block(aggregate(FedStrategy::trimmed_mean, u, 2, 0.0).params, {1.2f, 3.f});
  // T = 0.4: floor(2.0) = 2 -> only the middle value is left: the median.
  check_block(aggregate(FedStrategy::trimmed_mean, u, 2, 0.4).params, {2.f, 3.f});
  CHECK(aggregate(FedStrategy::trimmed_mean, u, 2, 0.4).params == aggregate(FedStrategy::median, u, 2).params);
  // Unweighted: unlike fedavg, e's 5 samples do not pull coordinate 0 up. fedavg: (-100 + 2 + 6 + 12 + 500) / 15 = 28.
  check_block(aggregate(FedStrategy::fedavg, u, 2).params, {28.f, 35.f / 15.f});
}

TEST_CASE("trimmed mean refuses a trim fraction below 0, from 0.5 on, or NaN", "[fed]") {
  const std::vector<ClientUpdate> u = {update("a", {1}, 1), update("b", {2}, 1)};
  for (double bad : {0.5, 0.75, -0.1, std::nan(""), std::numeric_limits<double>::infinity()}) {
    INFO("trim " << bad);
    CHECK_THAT(error_of(FedStrategy::trimmed_mean, u, 1, bad), Contains("trim fraction must be in [0, 0.5)"));
  }
}

TEST_CASE("updates with NaN or Inf are rejected by every strategy, the rest aggregated", "[fed]") {
  for (FedStrategy s : {FedStrategy::fedavg, FedStrategy::fedprox, FedStrategy::median, FedStrategy::trimmed_mean}) {
    for (float bad : {kNaN, kInf, -kInf}) {
      DYNAMIC_SECTION(fed_strategy_name(s) << " with " << bad) {
        // The poisoned value sits in the last coordinate: every coordinate is checked.
        const std::vector<ClientUpdate> u = {update("good1", {1, 2, 3}, 1), update("bad", {0, 0, bad}, 1000),
                                             update("good2", {3, 4, 5}, 1)};
        const AggregateResult r = aggregate(s, u, 3, 0.1);
        CHECK(r.accepted == std::vector<std::string>{"good1", "good2"});
        REQUIRE(r.rejected.size() == 1);
        CHECK_THAT(r.rejected[0], Contains("bad:") && Contains("non-finite") && Contains("parameter 2"));
        // Two equal-weight updates: every strategy gives their mean (2, 3, 4).
        check_block(r.params, {2.f, 3.f, 4.f});
        for (float v : r.params) CHECK(std::isfinite(v));
      }
    }
  }
}

TEST_CASE("updates of the wrong size are rejected, naming both sizes", "[fed]") {
  const std::vector<ClientUpdate> u = {update("short", {1, 2}, 1), update("good", {1, 2, 3}, 1),
                                       update("long", {1, 2, 3, 4}, 1), update("empty", {}, 1)};
  for (FedStrategy s : {FedStrategy::fedavg, FedStrategy::fedprox, FedStrategy::median, FedStrategy::trimmed_mean}) {
    INFO(fed_strategy_name(s));
    const AggregateResult r = aggregate(s, u, 3);
    CHECK(r.accepted == std::vector<std::string>{"good"});
    CHECK(r.params == std::vector<float>{1, 2, 3});
    REQUIRE(r.rejected.size() == 3);
    CHECK_THAT(r.rejected[0], Contains("short:") && Contains("has 2 parameters, expected 3"));
    CHECK_THAT(r.rejected[1], Contains("long:") && Contains("has 4 parameters, expected 3"));
    CHECK_THAT(r.rejected[2], Contains("empty:") && Contains("has 0 parameters, expected 3"));
  }
}

TEST_CASE("updates without samples are rejected, so the fedavg weights never divide by zero", "[fed]") {
  std::vector<ClientUpdate> u = {update("none", {100, 100}, 0), update("negative", {-100, 7}, -5),
                                 update("good", {1, 2}, 3)};
  const AggregateResult r = aggregate(FedStrategy::fedavg, u, 2);
  CHECK(r.params == std::vector<float>{1, 2});
  REQUIRE(r.rejected.size() == 2);
  CHECK_THAT(r.rejected[0], Contains("none:") && Contains("reports 0 training samples"));
  CHECK_THAT(r.rejected[1], Contains("negative:") && Contains("reports -5 training samples"));

  // Zero samples in total: nothing to weigh, the round cannot aggregate.
  u.pop_back();
  for (FedStrategy s : {FedStrategy::fedavg, FedStrategy::fedprox, FedStrategy::median, FedStrategy::trimmed_mean}) {
    INFO(fed_strategy_name(s));
    CHECK_THAT(error_of(s, u, 2), Contains("no acceptable client update") && Contains("2 received, all rejected"));
  }
}

TEST_CASE("check_update gives the reason an update is refused, or nothing", "[fed]") {
  CHECK(check_update(update("a", {1, 2}, 1), 2).empty());
  CHECK_THAT(check_update(update("a", {1, 2}, 1), 3), Contains("expected 3"));
  CHECK_THAT(check_update(update("a", {kNaN, 2}, 1), 2), Contains("parameter 0"));
  CHECK_THAT(check_update(update("a", {1, 2}, 0), 2), Contains("0 training samples"));
  // The size is checked first: a short block is not scanned past its end.
  CHECK_THAT(check_update(update("a", {kNaN}, 0), 2), Contains("expected 2"));
}

TEST_CASE("no updates at all: nothing to aggregate", "[fed]") {
  CHECK_THAT(error_of(FedStrategy::fedavg, {}, 3), Contains("no acceptable client update") && Contains("0 received"));
}

TEST_CASE("strategy names parse and print back", "[fed]") {
  for (const char* name : {"fedavg", "fedprox", "median", "trimmed-mean"})
    CHECK(std::string(fed_strategy_name(parse_fed_strategy(name))) == name);
  CHECK_THROWS_WITH(parse_fed_strategy("mean"), Contains("unknown strategy 'mean'") && Contains("trimmed-mean"));
  CHECK_THROWS_WITH(parse_fed_strategy("trimmed_mean"), Contains("unknown strategy"));
}

TEST_CASE("refuse_update bounds the sample count by the registration and the cap, naming a reason", "[fed]") {
  const ClientUpdate u = update("liar", {1, 2}, 1'000'000'000'000);
  CHECK_FALSE(refuse_update(u, UpdateBounds{2, -1, -1}));  // no bounds: only size, values, samples > 0
  const auto registered = refuse_update(u, UpdateBounds{2, 3000, -1});
  REQUIRE(registered);
  CHECK(registered->reason == "sample_count_exceeds_registered");
  CHECK_THAT(registered->message, Contains("1000000000000 training samples") && Contains("3000"));
  const auto capped = refuse_update(u, UpdateBounds{2, int64_t{1} << 50, 5000});
  REQUIRE(capped);
  CHECK(capped->reason == "sample_count_exceeds_cap");
  CHECK_FALSE(refuse_update(update("honest", {1, 2}, 3000), UpdateBounds{2, 3000, 5000}));  // equal is fine
  CHECK(refuse_update(update("a", {1}, 1), UpdateBounds{2, -1, -1})->reason == "wrong_parameter_count");
  CHECK(refuse_update(update("a", {1, kNaN}, 1), UpdateBounds{2, -1, -1})->reason == "non_finite_values");
  CHECK(refuse_update(update("a", {1, 2}, 0), UpdateBounds{2, -1, -1})->reason == "no_samples");
}

TEST_CASE("clip_update scales the distance from the global block down to the bound", "[fed]") {
  const std::vector<float> global = {1, 1};
  std::vector<float> far = {4, 5};  // delta (3, 4): norm 5
  CHECK(clip_update(far, global, 2.5));
  check_block(far, {2.5f, 3.f});  // delta (1.5, 2): norm 2.5, same direction
  std::vector<float> near = {1.3f, 1.4f};  // norm 0.5: kept as it is
  CHECK_FALSE(clip_update(near, global, 2.5));
  CHECK(near == std::vector<float>{1.3f, 1.4f});
  std::vector<float> wrong = {1};
  CHECK_THROWS_WITH(clip_update(wrong, global, 1), Contains("1 parameters, the global block 2"));
}

TEST_CASE("every strategy clips each update to --max-update-norm and says whose", "[fed]") {
  // Global (0, 0); honest updates near it, one scaled -50x far away.
  const std::vector<float> global = {0, 0};
  const std::vector<ClientUpdate> u = {update("a", {0.1f, 0}, 10), update("b", {0, 0.1f}, 10),
                                       update("c", {0.1f, 0.1f}, 10), update("evil", {-50, -50}, 10)};
  for (FedStrategy s : {FedStrategy::fedavg, FedStrategy::fedprox, FedStrategy::median, FedStrategy::trimmed_mean}) {
    INFO(fed_strategy_name(s));
    const AggregateResult r = aggregate(s, u, 2, AggregateOptions{0.25, 1.0, &global});
    CHECK(r.clipped == std::vector<std::string>{"evil"});
    CHECK(r.accepted.size() == 4);
    // Whatever the strategy, no coordinate moved further than the bound allows.
    for (float v : r.params) CHECK(std::fabs(v) <= 1.0f);
    const AggregateResult unclipped = aggregate(s, u, 2, AggregateOptions{0.25, 0, nullptr});
    CHECK(unclipped.clipped.empty());
  }
  // fedavg without the bound is dragged to (-12.4, -12.4); with it: (0.05 - 0.707) / 4 ... ~ -0.14.
  const AggregateResult r = aggregate(FedStrategy::fedavg, u, 2, AggregateOptions{0.1, 1.0, &global});
  check_block(r.params, {(0.1f + 0.1f - 0.70710678f) / 4, (0.1f + 0.1f - 0.70710678f) / 4});
  CHECK_THROWS_WITH(aggregate(FedStrategy::fedavg, u, 2, AggregateOptions{0.1, 1.0, nullptr}),
                    Contains("needs the round's global block"));
}

TEST_CASE("a trimmed mean that trims nothing is refused, saying the smallest count and trim", "[fed]") {
  CHECK(trimmed_mean_refusal(0.1, 10).empty());
  CHECK(trimmed_mean_refusal(0.34, 3).empty());
  // The finding: the default trim 0.1 with 3 clients cuts floor(0.3) = 0.
  const std::string why = trimmed_mean_refusal(0.1, 3);
  CHECK_THAT(why, Contains("trims nothing") && Contains("floor(0.1 x 3) = 0") &&
                      Contains("--trim 0.1 needs at least 10 clients") && Contains("3 clients need --trim 0.334"));
  // What it suggests works, and one less does not.
  CHECK(trimmed_mean_refusal(0.334, 3).empty());
  CHECK_FALSE(trimmed_mean_refusal(0.1, 9).empty());
  CHECK_THAT(trimmed_mean_refusal(0.25, 3), Contains("needs at least 4 clients"));
  CHECK_THAT(trimmed_mean_refusal(0.4, 2), Contains("no --trim below 0.5 trims 2"));
  CHECK_THAT(trimmed_mean_refusal(0.0, 5), Contains("--trim 0 never trims"));
}
