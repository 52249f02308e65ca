// test_fed_privacy.cpp: issue 18, differential privacy, through the real
// `cleave fed` CLI and real cleaved clients on loopback (Fashion-MNIST):
//   - a DP-FedAvg run reports epsilon after every round (rounds[i].epsilon),
//     growing round by round, equal to the RDP accountant's for the run's
//     sampling rate and noise multiplier (the accountant itself is checked
//     against dp-accounting in tests/fed/test_accountant.cpp), and the
//     settings at the end (epsilon, dp_delta, dp_noise_multiplier, dp_clip);
//     with --fraction the sampling rate is the share of clients sampled; the
//     noise is not derived from --seed (the same flags twice differ);
//   - --dp-target-epsilon stops before the round that would exceed it, says
//     so in the log and the JSON, and keeps the last global model;
//   - DP with median / trimmed mean / Krum, a target the first round already
//     exceeds, and DP flags without --dp-clip are refused before anything runs;
//     `cleave fed --help` lists the new flags.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "core/fed/accountant.h"
#include "integration/test_fed_privacy_run.h"
#include "skip.h"

using namespace cleave;
using namespace cleave::cli_test;
using cleave::testing::FedRun;
using cleave::testing::FedRunResult;

namespace {

FedRunResult run_dp(TempDir& dir, const std::string& name, int clients, const std::string& flags) {
  const std::string model = dir.file("small.json");
  write_text(model, cleave::testing::kPrivacyMlp);
  FedRun spec;
  spec.clients = clients;
  spec.limit_train = 300 * clients;
  spec.flags = "--optimizer adam --lr 0.001 " + flags;
  FedRunResult r = cleave::testing::run_fed_clients(model, dir.file(name + ".json"), spec);
  INFO("cleave fed " << spec.flags << "\n" << r.run.output);
  REQUIRE(r.run.code == 0);
  return r;
}

double accountant_epsilon(double q, double z, int rounds, double delta) {
  RdpAccountant a;
  a.compose(q, z, rounds);
  return a.spent(delta).epsilon;
}

}  // namespace

TEST_CASE("fed: DP-FedAvg reports the accountant's epsilon after every round", "[integration][fed][privacy]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  // 4 clients, 2 sampled per round: q = 0.5.
  const nlohmann::json got =
      run_dp(dir, "dp", 4, "--rounds 3 --fraction 0.5 --dp-clip 1 --dp-noise-multiplier 1.1 --dp-delta 1e-4").json;
  INFO(got.dump(1));
  REQUIRE(got["rounds"].size() == 3);
  double previous = 0;
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& rd = got["rounds"][i];
    INFO("round " << i + 1);
    REQUIRE(rd["epsilon"].is_number());
    CHECK(rd["sampling_rate"] == 0.5);
    CHECK(rd["sampled"].size() == 2);
    const double eps = rd["epsilon"].get<double>();
    CHECK(eps > previous);
    CHECK(eps == Approx(accountant_epsilon(0.5, 1.1, static_cast<int>(i) + 1, 1e-4)).epsilon(1e-9));
    previous = eps;
    CHECK(rd["dp_clipped_count"].get<int>() <= 2);
    CHECK(std::isfinite(rd["loss"].get<double>()));
  }
  CHECK(got["epsilon"] == got["rounds"][2]["epsilon"]);
  CHECK(got["dp_delta"] == 1e-4);
  CHECK(got["dp_noise_multiplier"] == 1.1);
  CHECK(got["dp_clip"] == 1.0);
  CHECK(got["stopped_reason"] == "completed");
  // The noise is not --seed's: the same flags again give another model (the
  // runs without DP are reproducible, see test_fed.cpp's resumed run).
  const nlohmann::json again =
      run_dp(dir, "dp2", 4, "--rounds 3 --fraction 0.5 --dp-clip 1 --dp-noise-multiplier 1.1 --dp-delta 1e-4").json;
  CHECK(again["rounds"][0]["sampled"] == got["rounds"][0]["sampled"]);  // the same clients, seeded
  CHECK(again["rounds"][0]["loss"] != got["rounds"][0]["loss"]);
  CHECK(again["epsilon"] == got["epsilon"]);
}

TEST_CASE("fed: --dp-target-epsilon stops before the round that would exceed it", "[integration][fed][privacy]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  // Every client every round (q = 1), z = 2: a target between the epsilons of 2 and 3 rounds allows 2.
  const double two = accountant_epsilon(1.0, 2.0, 2, 1e-5), three = accountant_epsilon(1.0, 2.0, 3, 1e-5);
  REQUIRE(two < three);
  const std::string target = std::to_string((two + three) / 2);
  const std::string save = dir.file("global.ckpt");
  const FedRunResult r = run_dp(dir, "target", 3, "--rounds 6 --dp-clip 0.5 --dp-noise-multiplier 2 --dp-target-epsilon " +
                                                      target + " --save '" + save + "'");
  const nlohmann::json& got = r.json;
  INFO(got.dump(1));
  CHECK(got["rounds"].size() == 2);
  CHECK(got["stopped_reason"] == "dp_target_epsilon");
  CHECK(got["epsilon"].get<double>() <= std::stod(target));
  CHECK(got["epsilon"].get<double>() == Approx(two).epsilon(1e-9));
  CHECK(got["dp_target_epsilon"].get<double>() == Approx(std::stod(target)));
  CHECK_THAT(r.run.output, Catch::Contains("stopping before round 3 of 6") && Catch::Contains("--dp-target-epsilon"));
  // The model it keeps is round 2's: the final accuracy is that round's.
  CHECK(got["test_accuracy"] == got["rounds"][1]["accuracy"]);
  // Resuming the checkpoint with the same target has nothing left to spend: it stops before round 3 again.
  const FedRunResult again = run_dp(dir, "again", 3, "--rounds 6 --dp-clip 0.5 --dp-noise-multiplier 2 --dp-target-epsilon " +
                                                         target + " --load '" + save + "'");
  CHECK(again.json["rounds"].empty());
  CHECK(again.json["stopped_reason"] == "dp_target_epsilon");
  CHECK(again.json["epsilon"].get<double>() == Approx(two).epsilon(1e-9));
}

TEST_CASE("fed: clipping without noise reports an unbounded epsilon and rounds without DP are not resumed under DP",
          "[integration][fed][privacy]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  const std::string save = dir.file("plain.ckpt");
  const nlohmann::json clipped = run_dp(dir, "clip", 3, "--rounds 2 --dp-clip 0.5 --save '" + save + "'").json;
  INFO(clipped.dump(1));
  REQUIRE(clipped["rounds"].size() == 2);
  for (const auto& rd : clipped["rounds"]) CHECK(rd["epsilon"].is_null());  // JSON has no infinity
  CHECK(clipped["epsilon"].is_null());
  CHECK(clipped["test_accuracy"].get<double>() > 0.3);  // clipping alone still learns
  // Rounds trained without DP cannot be charged to an accountant.
  const std::string plain = dir.file("nodp.ckpt");
  run_dp(dir, "nodp", 3, "--rounds 1 --save '" + plain + "'");
  const std::string model = dir.file("small.json");
  cleave::testing::FedRun spec;
  spec.clients = 3;
  spec.limit_train = 900;
  spec.flags = "--rounds 3 --dp-clip 0.5 --dp-noise-multiplier 1 --load '" + plain + "'";
  const cleave::testing::FedRunResult r = cleave::testing::run_fed_clients(model, dir.file("resume.json"), spec);
  INFO(r.run.output);
  CHECK(r.run.code == kExitFailure);
  CHECK_THAT(r.run.output, Catch::Contains("trained without --dp-clip") && Catch::Contains("unbounded"));
}

TEST_CASE("fed: DP settings that cannot hold are refused before the run", "[integration][fed][privacy]") {
  const std::string base = "fed --model '" + kMlp + "' --clients 5 --insecure ";
  for (const char* s : {"median", "trimmed-mean --trim 0.2", "krum", "multi-krum"})
    require_usage_error(base + "--strategy " + s + " --dp-clip 1 --dp-noise-multiplier 1",
                        {"--dp-clip needs --strategy fedavg or fedprox", "noise would not cover"});
  require_usage_error(base + "--dp-clip 1 --dp-noise-multiplier 0.5 --dp-target-epsilon 1",
                      {"--dp-target-epsilon 1", "first round alone", "raise the noise"});
  require_usage_error(base + "--dp-noise-multiplier 1", {"--dp-noise-multiplier needs --dp-clip"});
  require_usage_error(base + "--dp-clip 1 --dp-delta 1", {"--dp-delta"});
  require_help_lists("fed", {"--dp-clip", "--dp-noise-multiplier", "--dp-delta", "--dp-target-epsilon", "--krum-f",
                             "--krum-m"});
}
