// test_krum.cpp: Krum and multi-Krum (core/fed/krum.h, strategy.h) on small
// hand-made blocks: the scores pick the update among its honest neighbours,
// an outlier (scaled or sign-flipped) is never selected, multi-Krum averages
// the m best, too few updates for f are refused with the numbers, and
// --max-update-norm clips before Krum scores.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/fed/krum.h"
#include "core/fed/strategy.h"

using namespace cleave;
using Catch::Contains;

namespace {

ClientUpdate update(const std::string& client, std::vector<float> params) {
  ClientUpdate u;
  u.client = client;
  u.params = std::move(params);
  u.samples = 10;
  return u;
}

// Four honest updates near (1, 1) and one far away.
std::vector<ClientUpdate> with_outlier(std::vector<float> bad) {
  return {update("a", {1.0f, 1.0f}), update("b", {1.1f, 0.9f}), update("c", {0.9f, 1.1f}),
          update("d", {1.05f, 1.0f}), update("evil", std::move(bad))};
}

}  // namespace

TEST_CASE("krum: scores by the n - f - 2 nearest and keeps the lowest", "[fed][krum]") {
  // n = 5, f = 1: each score sums the 2 smallest squared distances.
  // a: to d 0.0025, to b 0.02, to c 0.02 -> 0.0225; d: to a 0.0025, to b 0.0125 -> 0.015 (lowest).
  const std::vector<ClientUpdate> u = with_outlier({100.f, 100.f});
  std::vector<const std::vector<float>*> blocks;
  for (const auto& x : u) blocks.push_back(&x.params);
  const std::vector<size_t> best = krum_select(blocks, 1, 1);
  REQUIRE(best.size() == 1);
  CHECK(best[0] == 3);
  const AggregateResult r = aggregate(FedStrategy::krum, u, 2, AggregateOptions{});
  CHECK(r.selected == std::vector<std::string>{"d"});
  CHECK(r.params == u[3].params);
}

TEST_CASE("krum: a scaled or sign-flipped update is never selected", "[fed][krum]") {
  for (const std::vector<float>& bad : {std::vector<float>{-1.f, -1.f}, std::vector<float>{30.f, -30.f},
                                        std::vector<float>{1e6f, 1e6f}}) {
    INFO("outlier " << bad[0] << ", " << bad[1]);
    const std::vector<ClientUpdate> u = with_outlier(bad);
    for (FedStrategy s : {FedStrategy::krum, FedStrategy::multi_krum}) {
      const AggregateResult r = aggregate(s, u, 2, AggregateOptions{});
      for (const auto& name : r.selected) CHECK(name != "evil");
      CHECK(r.params[0] == Approx(1.0).margin(0.1));
      CHECK(r.params[1] == Approx(1.0).margin(0.1));
    }
  }
}

TEST_CASE("multi-krum averages the m best, n - f by default", "[fed][krum]") {
  const std::vector<ClientUpdate> u = with_outlier({100.f, 100.f});
  const AggregateResult all = aggregate(FedStrategy::multi_krum, u, 2, AggregateOptions{});
  CHECK(all.selected.size() == 4);  // n - f = 4: every honest update, uniformly averaged
  CHECK(all.params[0] == Approx((1.0 + 1.1 + 0.9 + 1.05) / 4));
  CHECK(all.params[1] == Approx((1.0 + 0.9 + 1.1 + 1.0) / 4));
  AggregateOptions two;
  two.krum_m = 2;
  const AggregateResult r = aggregate(FedStrategy::multi_krum, u, 2, two);
  CHECK(r.selected == std::vector<std::string>{"d", "a"});
  CHECK(r.params[0] == Approx((1.05 + 1.0) / 2));
}

TEST_CASE("krum refuses fewer than 2f + 3 updates and an m outside [1, n - f]", "[fed][krum]") {
  CHECK(krum_refusal(5, 1, 1).empty());
  CHECK_THAT(krum_refusal(4, 1, 1), Contains("2f + 3 = 5") && Contains("got 4") && Contains("at most 0"));
  CHECK_THAT(krum_refusal(6, 2, 1), Contains("2f + 3 = 7") && Contains("at most 1 for 6"));
  CHECK_THAT(krum_refusal(5, 1, 5), Contains("n - f = 4") && Contains("--krum-m 5"));
  CHECK_THAT(krum_refusal(5, -1, 1), Contains("--krum-f must be >= 0"));
  std::vector<ClientUpdate> u = with_outlier({5.f, 5.f});
  u.pop_back();
  CHECK_THROWS_WITH(aggregate(FedStrategy::krum, u, 2, AggregateOptions{}), Contains("needs at least 2f + 3"));
  AggregateOptions o;
  CHECK(strategy_refusal(FedStrategy::krum, o, 4) == krum_refusal(4, 1, 1));
  CHECK(strategy_refusal(FedStrategy::multi_krum, o, 5).empty());
  CHECK(strategy_refusal(FedStrategy::median, o, 1).empty());
}

TEST_CASE("krum: --max-update-norm clips before the scores", "[fed][krum]") {
  // Global (1, 1); the outlier's step (99, 99) is clipped to norm 0.05: it then
  // sits among the honest ones and is clipped, whatever Krum picks.
  const std::vector<float> global{1.f, 1.f};
  AggregateOptions o;
  o.max_update_norm = 0.05;
  o.global = &global;
  const AggregateResult r = aggregate(FedStrategy::krum, with_outlier({100.f, 100.f}), 2, o);
  CHECK(std::find(r.clipped.begin(), r.clipped.end(), "evil") != r.clipped.end());
  const double dx = r.params[0] - 1.0, dy = r.params[1] - 1.0;
  CHECK(std::sqrt(dx * dx + dy * dy) <= 0.05 + 1e-6);
  CHECK(parse_fed_strategy("krum") == FedStrategy::krum);
  CHECK(parse_fed_strategy("multi-krum") == FedStrategy::multi_krum);
  CHECK(std::string(fed_strategy_name(FedStrategy::multi_krum)) == "multi-krum");
}
