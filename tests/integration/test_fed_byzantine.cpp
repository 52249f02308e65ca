// test_fed_byzantine.cpp: issue 18, Byzantine robustness, with a real
// `cleave fed` and five real cleaved clients on loopback, one of them
// Byzantine (the --poison test hook of core/runtime/daemon/fed_client.cpp):
//   - it sends global + K (update - global) with K = -50 (a scaled,
//     sign-flipped step): plain FedAvg is derailed (test loss far above the
//     clean run's, accuracy far below), while median, trimmed mean, Krum,
//     multi-Krum and FedAvg with --max-update-norm stay close to the clean
//     run; Krum and multi-Krum never select the Byzantine client;
//   - a plain sign-flip (K = -1) is never selected by Krum either;
//   - Krum with fewer than 2f + 3 clients per round, and an unknown --poison,
//     are refused before anything runs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <utility>

#include "integration/test_fed_privacy_run.h"
#include "skip.h"

using namespace cleave;
using namespace cleave::cli_test;
using cleave::testing::FedRun;
using cleave::testing::FedRunResult;

namespace {

const char* const kRounds = " --rounds 3 --min-clients 5 --optimizer adam --lr 0.001 ";

FedRunResult run_case(TempDir& dir, const std::string& name, const std::string& flags, const std::string& poison) {
  const std::string model = dir.file("small.json");
  write_text(model, cleave::testing::kPrivacyMlp);
  FedRun spec;
  spec.flags = kRounds + flags;
  if (!poison.empty()) spec.client_extra[5] = {"--poison", poison};
  FedRunResult r = cleave::testing::run_fed_clients(model, dir.file(name + ".json"), spec);
  INFO("cleave fed " << spec.flags << " (dev5 --poison " << poison << ")\n" << r.run.output);
  REQUIRE(r.run.code == 0);
  return r;
}

bool selects(const nlohmann::json& round, const std::string& client) {
  for (const auto& c : round["krum_selected"])
    if (c == client) return true;
  return false;
}

}  // namespace

TEST_CASE("fed: one scaled and sign-flipped client derails FedAvg but not the robust strategies",
          "[integration][fed][byzantine]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  const nlohmann::json clean = run_case(dir, "clean", "--strategy fedavg", "").json;
  const double clean_acc = clean["test_accuracy"].get<double>(), clean_loss = clean["test_loss"].get<double>();
  REQUIRE(clean_acc > 0.4);  // the clean run learns (chance is 0.10)

  const std::string attack = "scale:-50";
  const nlohmann::json derailed = run_case(dir, "fedavg", "--strategy fedavg", attack).json;
  INFO("clean accuracy " << clean_acc << ", loss " << clean_loss << "; poisoned FedAvg accuracy "
                         << derailed["test_accuracy"] << ", loss " << derailed["test_loss"]);
  CHECK(derailed["test_accuracy"].get<double>() < clean_acc - 0.2);
  CHECK(derailed["test_loss"].get<double>() > 3 * clean_loss);

  // The robust strategies drop the outlier; --max-update-norm only bounds it
  // (it still pulls the mean back by X / 5 per round), so it may lag more.
  const std::pair<const char*, double> robust[] = {{"--strategy median", 0.1},
                                                   {"--strategy trimmed-mean --trim 0.2", 0.1},
                                                   {"--strategy krum --krum-f 1", 0.1},
                                                   {"--strategy multi-krum --krum-f 1", 0.1},
                                                   {"--strategy fedavg --max-update-norm 1", 0.25}};
  for (const auto& [flags, lag] : robust) {
    const nlohmann::json got = run_case(dir, "robust", flags, attack).json;
    INFO(flags << ": accuracy " << got["test_accuracy"] << ", loss " << got["test_loss"]);
    CHECK(got["test_accuracy"].get<double>() > clean_acc - lag);
    CHECK(got["test_loss"].get<double>() < 1.5 * clean_loss);
    for (const auto& rd : got["rounds"]) {
      if (rd.contains("krum_selected")) CHECK_FALSE(selects(rd, "dev5"));
      if (got["strategy"] == "fedavg") CHECK(std::count(rd["clipped"].begin(), rd["clipped"].end(), "dev5") == 1);
    }
  }
}

TEST_CASE("fed: Krum never selects a sign-flipping client", "[integration][fed][byzantine]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  const nlohmann::json got = run_case(dir, "flip", "--strategy krum --krum-f 1", "sign-flip").json;
  REQUIRE(got["rounds"].size() == 3);
  CHECK(got["krum_f"] == 1);
  for (const auto& rd : got["rounds"]) {
    CHECK(rd["krum_selected"].size() == 1);
    CHECK_FALSE(selects(rd, "dev5"));
  }
  CHECK(got["test_accuracy"].get<double>() > 0.4);
}

TEST_CASE("fed: Krum below 2f + 3 clients and a bad --poison are refused up front", "[integration][fed][byzantine]") {
  require_usage_error("fed --model '" + kMlp + "' --clients 4 --strategy krum --krum-f 1 --insecure",
                      {"needs at least 2f + 3 = 5", "got 4"});
  require_usage_error("fed --model '" + kMlp + "' --clients 8 --fraction 0.5 --strategy multi-krum --krum-f 1 --insecure",
                      {"2f + 3 = 5", "got 4", "--fraction"});
  require_usage_error("fed --model '" + kMlp + "' --clients 7 --strategy multi-krum --krum-f 1 --krum-m 7 --insecure",
                      {"n - f = 6", "--krum-m 7"});
  require_usage_error("fed --model '" + kMlp + "' --clients 5 --strategy median --krum-f 1 --insecure",
                      {"--krum-f applies to --strategy krum and multi-krum only"});
  require_cleaved_usage_error("--coordinator tcp://127.0.0.1:1 --dataset fashion-mnist --poison scale:x",
                              {"sign-flip or scale:K", "scale:x"});
}
