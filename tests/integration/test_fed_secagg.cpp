// test_fed_secagg.cpp: issue 18, secure aggregation (`cleave fed
// --secure-aggregation`) with real cleaved clients over CURVE on loopback
// (Fashion-MNIST):
//   - 5 clients: one secure round's global weights equal plain FedAvg's within
//     the quantization bound the round reports; again when one client drops
//     after sharing its keys and before masking, and another after sending its
//     masked update (compared with plain FedAvg over the same four updates);
//     three rounds end at plain FedAvg's model up to float32 rounding;
//   - the message audit: no client ever sent weights in the clear, and for no
//     client did the coordinator hold shares of both its self-mask seed and
//     its mask key (the pair that would unmask its update);
//   - fewer than t clients left to reveal stops the run with the error, and
//     the checkpoint keeps the previous round's global model;
//   - with DP the clients add their shares of the noise and epsilon is
//     reported per round; strategies that need each update and --insecure are
//     refused before anything runs.
// The protocol itself (every message, tampering, refusals) is tested in memory
// in tests/runtime/test_secagg_round.cpp.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "apps/cli_util.h"
#include "core/runtime/coordinator/fed_coordinator.h"
#include "core/train/train_checkpoint.h"
#include "integration/daemon_cluster.h"
#include "integration/test_fed_privacy_run.h"
#include "skip.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

namespace {

constexpr int kClients = 5;

TrainConfig secagg_config(const std::string& model, const std::string& save) {
  TrainConfig c;
  c.model_path = model;
  c.batch = 32;
  c.seed = 5;
  c.limit_test = 300;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 1e-3f;
  c.threads = 1;
  c.progress = false;
  c.save_path = save;
  return c;
}

// One federated run over 5 fresh clients; `kill_at` maps a client (1-based)
// to the point it is SIGKILLed: "start" (round 1 begins), "delivery"
// (secure: after sharing keys, before masking) or "unmask" (secure: after its
// masked update). Returns the result JSON (throws what train_federated throws).
nlohmann::json run(cleave::test::TempDir& dir, const std::string& name, bool secure, int rounds,
                   const std::map<int, std::string>& kill_at = {}, const std::string& save = "",
                   const std::string& strategy = "fedavg") {
  const std::string model = dir.file("small.json");
  cli_test::write_text(model, cleave::testing::kPrivacyMlp);
  DaemonCluster cluster(kClients);
  FedOptions o;
  o.clients = kClients;
  cluster.connect(o);
  o.rounds = rounds;
  o.round_timeout_s = 60;
  o.peer_timeout_ms = 3000;
  o.secure_aggregation = secure;
  o.strategy = strategy;
  o.mu = 0.1;
  std::map<int, pid_t> pids;
  o.on_listening = [&](const std::string& ep) {
    for (int i = 1; i <= kClients; ++i)
      pids[i] = cluster.start(i, ep, {"--dataset", "fashion-mnist", "--shard", std::to_string(i - 1) + "/5", "--seed",
                                      "11", "--limit-train", std::to_string(300 * kClients)});
  };
  auto kill_those = [&](const std::string& when) {
    for (const auto& [i, at] : kill_at)
      if (at == when) kill(pids.at(i), SIGKILL);
  };
  o.on_round_started = [&](int round, const std::vector<std::string>&) { if (round == rounds - 1) kill_those("start"); };
  o.on_secagg_delivery = [&](int round, const std::vector<std::string>&) { if (round == rounds - 1) kill_those("delivery"); };
  o.on_secagg_unmask = [&](int round, const std::vector<std::string>&) { if (round == rounds - 1) kill_those("unmask"); };
  o.min_clients = 1;
  return train_federated(secagg_config(model, save.empty() ? dir.file(name + ".ckpt") : save), o);
}

std::vector<float> saved_params(cleave::test::TempDir& dir, const std::string& name) {
  return load_fed_state(dir.file(name + ".ckpt")).params;
}

// |secure - plain| <= bound (+ float32 rounding of either aggregate) everywhere.
void check_within_bound(const std::vector<float>& secure, const std::vector<float>& plain, double bound) {
  REQUIRE(secure.size() == plain.size());
  double worst = 0;
  size_t differ = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double d = std::fabs(static_cast<double>(secure[i]) - plain[i]);
    const double allowed = bound + 2.0 * std::fabs(plain[i]) * 1.2e-7;
    worst = std::max(worst, d - allowed);
    if (d > allowed) ++differ;
  }
  INFO("coordinates beyond the bound: " << differ << " of " << plain.size() << ", worst excess " << worst);
  CHECK(differ == 0);
}

void check_audit(const nlohmann::json& r) {
  for (const auto& [client, kinds] : r["messages_from_clients"].items()) {
    INFO(client << ": " << kinds.dump());
    CHECK(!kinds.contains("weights"));  // never an update in the clear
  }
  for (const auto& round : r["rounds"]) {
    const auto& a = round["secagg"];
    INFO(a.dump(1));
    for (const auto& [client, k] : a["seed_shares"].items()) CHECK(!a["mask_key_shares"].contains(client));
    for (const auto& [client, k] : a["mask_key_shares"].items())
      CHECK(k.get<int>() >= a["threshold"].get<int>());  // asked for only to remove a dropped client's masks
  }
}

}  // namespace

TEST_CASE("fed: a secure round equals plain FedAvg within the quantization bound", "[integration][fed][secagg]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  cleave::test::TempDir dir;
  const nlohmann::json plain = run(dir, "plain", false, 1);
  const nlohmann::json secure = run(dir, "secure", true, 1);
  INFO(secure.dump(1));
  const auto& a = secure["rounds"][0]["secagg"];
  CHECK(a["threshold"] == 3);  // a majority of 5
  CHECK(a["survivors"].size() == kClients);
  CHECK(a["dropped_before_masking"].empty());
  CHECK(a["mask_key_shares"].empty());  // nobody dropped: no mask key was ever revealed
  const double bound = a["quantization_bound"].get<double>();
  CHECK(bound > 0);
  CHECK(bound < 1e-7);
  check_within_bound(saved_params(dir, "secure"), saved_params(dir, "plain"), bound);
  check_audit(secure);
  CHECK(secure["rounds"][0]["participants"] == kClients);
  CHECK(plain["rounds"][0]["participants"] == kClients);
  // FedProx: the same sample-weighted mean of updates trained with the proximal term.
  run(dir, "plain-prox", false, 1, {}, "", "fedprox");
  const nlohmann::json prox = run(dir, "secure-prox", true, 1, {}, "", "fedprox");
  CHECK(prox["strategy"] == "fedprox");
  check_within_bound(saved_params(dir, "secure-prox"), saved_params(dir, "plain-prox"),
                     prox["rounds"][0]["secagg"]["quantization_bound"].get<double>());
  // and not the FedAvg model: the proximal term changed the training
  CHECK(saved_params(dir, "secure-prox") != saved_params(dir, "secure"));
}

TEST_CASE("fed: three secure rounds end at plain FedAvg's model up to float32 rounding", "[integration][fed][secagg]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  cleave::test::TempDir dir;
  const nlohmann::json plain = run(dir, "plain", false, 3);
  const nlohmann::json secure = run(dir, "secure", true, 3);
  // Each round differs by at most its quantization bound (above); local
  // training from two globals that differ in the last bits can move them
  // apart by a few float32 ulps, not more (measured: 1.9e-8 at most).
  const std::vector<float> a = saved_params(dir, "secure"), b = saved_params(dir, "plain");
  REQUIRE(a.size() == b.size());
  size_t beyond = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::fabs(static_cast<double>(a[i]) - b[i]) > 1e-5 * (std::fabs(b[i]) + 1e-2)) ++beyond;
  CHECK(beyond == 0);
  CHECK(secure["test_accuracy"].get<double>() == Approx(plain["test_accuracy"].get<double>()).margin(0.01));
}

TEST_CASE("fed: secure aggregation survives a client dropping before masking and another after",
          "[integration][fed][secagg]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  cleave::test::TempDir dir;
  // Plain FedAvg over the same four updates: dev1 never sends one.
  const nlohmann::json plain = run(dir, "plain", false, 1, {{1, "start"}});
  REQUIRE(plain["rounds"][0]["participants"] == kClients - 1);
  // Secure: dev1 dies after sharing its keys (its mask key is reconstructed to
  // remove its pairwise masks); dev2 dies after its masked update (it still
  // counts: its self-mask seed is reconstructed from the others' shares).
  const nlohmann::json secure = run(dir, "secure", true, 1, {{1, "delivery"}, {2, "unmask"}});
  INFO(secure.dump(1));
  const auto& a = secure["rounds"][0]["secagg"];
  CHECK(a["share_senders"].size() == kClients);
  CHECK(a["dropped_before_masking"] == nlohmann::json::array({"dev1"}));
  CHECK(a["dropped_after_masking"] == nlohmann::json::array({"dev2"}));
  CHECK(a["survivors"].size() == kClients - 1);
  CHECK(a["mask_key_shares"].contains("dev1"));
  CHECK(a["seed_shares"].contains("dev2"));
  check_within_bound(saved_params(dir, "secure"), saved_params(dir, "plain"), a["quantization_bound"].get<double>());
  check_audit(secure);
}

TEST_CASE("fed: fewer than t clients left to reveal stop the run and keep the previous global model",
          "[integration][fed][secagg]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  cleave::test::TempDir dir;
  const std::string save = dir.file("kept.ckpt");
  // Round 2: three of five die after masking; t = 3, two are left to reveal.
  try {
    run(dir, "kept", true, 2, {{1, "unmask"}, {2, "unmask"}, {3, "unmask"}}, save);
    FAIL("the run should have stopped");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK_THAT(what, Catch::Contains("round 2 of 2") && Catch::Contains("only 2 of the t=3") &&
                         Catch::Contains("previous global model kept"));
  }
  const FedState st = load_fed_state(save);
  CHECK(st.rounds_done == 1);  // round 1's model, not a half-unmasked one
}

TEST_CASE("fed: secure aggregation with DP reports epsilon, and bad combinations are refused",
          "[integration][fed][secagg][privacy]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  cleave::test::TempDir dir;
  const std::string model = dir.file("small.json");
  cli_test::write_text(model, cleave::testing::kPrivacyMlp);
  cleave::testing::FedRun spec;
  spec.clients = 3;
  spec.limit_train = 900;
  spec.flags = "--rounds 2 --secure-aggregation --dp-clip 1 --dp-noise-multiplier 1.1";
  const auto r = cleave::testing::run_fed_clients(model, dir.file("dp.json"), spec);
  INFO(r.run.output);
  REQUIRE(r.run.code == 0);
  REQUIRE(r.json["rounds"].size() == 2);
  CHECK(r.json["rounds"][1]["epsilon"].get<double>() > r.json["rounds"][0]["epsilon"].get<double>());
  CHECK(r.json["rounds"][1]["secagg"]["survivors"].size() == 3);
  CHECK(std::isfinite(r.json["test_loss"].get<double>()));

  const std::string base = "fed --model '" + model + "' --clients 3 --secure-aggregation --no-progress ";
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--strategy median --key k --allow a", "fedavg and fedprox only"},
           {"--strategy krum --key k --allow a", "fedavg and fedprox only"},
           {"--insecure", "without --insecure"},
           {"--secagg-threshold 1 --key k --allow a", "--secagg-threshold 1"},
           {"--secagg-threshold 4 --key k --allow a", "--secagg-threshold 4"}}) {
    INFO(flags);
    const auto bad = cli_test::run_cleave(base + flags);
    CHECK(bad.code == 2);
    CHECK_THAT(bad.output, Catch::Contains(says));
  }
  const auto stray = cli_test::run_cleave("fed --model '" + model + "' --clients 3 --secagg-bits 20 --insecure");
  CHECK(stray.code == 2);
  CHECK_THAT(stray.output, Catch::Contains("--secagg-bits applies with --secure-aggregation only"));
}
