// test_fed.cpp: issue 7 (federated averaging) with real cleaved client
// processes over CURVE: IID FedAvg learns, a Dirichlet(0.5) non-IID run learns,
// a client killed mid-round does not stop the round when K are left, a
// straggler is left behind at --round-timeout, NaN and
// wrong-shape updates are rejected by every strategy while the round completes,
// a round below K fails saying how many arrived, and only register / heartbeat
// / ack / weights / metrics leave a client (no training sample), and a run
// resumed from its --save checkpoint repeats the uninterrupted rounds. Plus
// unit tests of the FedProx term and the --shard parser.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/data/dataset.h"
#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/runtime/daemon/fed_client.h"
#include "core/runtime/coordinator/fed_coordinator.h"
#include "core/train/train_checkpoint.h"
#include "device/device.h"
#include "integration/daemon_cluster.h"
#include "integration/test_run.h"
#include "log_capture.h"
#include "skip.h"

using namespace cleave;
using cleave::testing::DaemonCluster;

namespace {


TrainConfig fed_config(const std::string& model, int64_t limit_test) {
  TrainConfig c = cleave::testing::test_run(model, 32, 5);
  c.limit_test = limit_test;
  return c;
}

FedOptions fed_options(const DaemonCluster& cluster, int clients) {
  FedOptions o;
  o.clients = clients;
  cluster.connect(o);
  o.round_timeout_s = 60;
  return o;
}

// cleaved flags of a federated client holding shard i (1-based device) of n.
std::vector<std::string> client_flags(int i, int n, int64_t limit, const std::string& partition = "iid") {
  return {"--dataset", "fashion-mnist", "--shard", std::to_string(i - 1) + "/" + std::to_string(n), "--partition",
          partition, "--seed", "11", "--limit-train", std::to_string(limit)};
}

int64_t param_count(const std::string& model) {
  auto cpu = open_device("cpu", DeviceOptions{});
  ModelSpec spec = ModelSpec::load(std::string(CLEAVE_SOURCE_DIR) + "/" + model);
  return Partition(*cpu, spec, 0, spec.num_layers()).param_count();
}

}  // namespace

TEST_CASE("FedProx proximal term adds mu * (w - w_global) to the gradient", "[fed]") {
  auto cpu = open_device("cpu", DeviceOptions{});
  Tensor g(*cpu, {4}), w(*cpu, {4}), w0(*cpu, {4});
  g.from_host(std::vector<float>{0.5f, -1.f, 0.f, 2.f});
  w.from_host(std::vector<float>{1.f, 2.f, 3.f, 4.f});
  w0.from_host(std::vector<float>{0.f, 2.f, 5.f, 3.5f});
  add_proximal_term(*cpu, g, w, w0, 0.1f);
  const std::vector<float> got = g.to_host(), want = {0.6f, -1.f, -0.2f, 2.05f};
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-6));
  add_proximal_term(*cpu, g, w, w0, 0.f);  // mu = 0: FedAvg
  CHECK(g.to_host() == got);
  CHECK_THROWS_WITH(add_proximal_term(*cpu, g, w, w0, -1.f), Catch::Contains("mu"));
  Tensor short_block(*cpu, {3});
  CHECK_THROWS_WITH(add_proximal_term(*cpu, g, w, short_block, 0.1f), Catch::Contains("differ in size"));
}

TEST_CASE("shard specs i/N are parsed and checked", "[fed]") {
  int s = -1, n = -1;
  parse_shard_spec("2/5", s, n);
  CHECK(s == 2);
  CHECK(n == 5);
  CHECK_THROWS_WITH(parse_shard_spec("5/5", s, n), Catch::Contains("[0, 5)"));
  CHECK_THROWS_WITH(parse_shard_spec("1", s, n), Catch::Contains("i/N"));
  CHECK_THROWS_WITH(parse_shard_spec("a/3", s, n), Catch::Contains("integers"));
  CHECK_THROWS_WITH(parse_shard_spec("1/0", s, n), Catch::Contains("number of shards"));
  CHECK_THROWS_WITH(parse_shard_spec("-1/3", s, n), Catch::Contains("[0, 3)"));
}

TEST_CASE("fed options are validated", "[fed]") {
  FedOptions o;
  o.clients = 2;
  o.min_clients = 3;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("--min-clients 3 exceeds --clients 2"));
  o.min_clients = 1;
  o.fraction = 0;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("--fraction"));
  o.fraction = 1;
  o.strategy = "mean";
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("unknown strategy"));
}

TEST_CASE("IID FedAvg over 3 client daemons learns and only weights and metrics leave a client",
          "[integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const int n = 3;
  const int64_t limit = 3000;
  DaemonCluster cluster(n);
  FedOptions o = fed_options(cluster, n);
  o.rounds = 3;
  o.min_clients = 3;
  o.on_listening = [&](const std::string& ep) {
    for (int i = 1; i <= n; ++i) cluster.start(i, ep, client_flags(i, n, limit));
  };
  nlohmann::json r = train_federated(fed_config("models/mlp.json", 1000), o);
  INFO(r.dump(1));
  CHECK(r["mode"] == "fed");
  CHECK(r["strategy"] == "fedavg");
  CHECK(r["clients"] == n);
  REQUIRE(r["rounds"].size() == 3);
  const double acc = r["test_accuracy"].get<double>();
  WARN("IID FedAvg (MLP, 3 clients x 1000 samples, 3 rounds): test accuracy " << acc);
  CHECK(acc > 0.65);  // chance is 0.10
  CHECK(r["rounds"][2]["accuracy"].get<double>() > r["rounds"][0]["accuracy"].get<double>() - 0.02);
  int64_t samples = 0;
  for (const auto& d : r["devices"]) samples += d["details"]["samples"].get<int64_t>();
  CHECK(samples == limit);  // IID shards cover the data without overlap
  for (const auto& rd : r["rounds"]) {
    CHECK(rd["participants"] == n);
    CHECK(rd["rejected_count"] == 0);
    CHECK(rd["bytes_down"].get<int64_t>() > 0);
    CHECK(rd["bytes_up"].get<int64_t>() > 0);
  }

  // The message audit: every message the coordinator received from each
  // client, by kind. Only these kinds may appear; no tensor ever does.
  const std::set<std::string> allowed = {"register", "heartbeat", "ack", "weights", "metrics"};
  for (int i = 1; i <= n; ++i) {
    const auto& kinds = r["messages_from_clients"][DaemonCluster::name(i)];
    INFO("client " << DaemonCluster::name(i) << ": " << kinds.dump());
    REQUIRE(kinds.is_object());
    for (const auto& [kind, count] : kinds.items()) CHECK(allowed.count(kind) == 1);
    CHECK(kinds.value("weights", 0) == 3);
    CHECK(kinds.value("metrics", 0) == 3);
    CHECK(kinds.count("tensor") == 0);
  }
  // And by volume: what came up is the weight blocks plus small headers and
  // heartbeats, far less than a single shard of samples (1000 x 784 floats).
  const int64_t block = param_count("models/mlp.json") * 4;
  for (const auto& rd : r["rounds"]) {
    const int64_t overhead = rd["bytes_up"].get<int64_t>() - n * block;
    CHECK(overhead >= 0);
    CHECK(overhead < 64 * 1024);
  }
}

TEST_CASE("Dirichlet(0.5) non-IID FedAvg over 4 client daemons learns", "[integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const int n = 4;
  DaemonCluster cluster(n);
  FedOptions o = fed_options(cluster, n);
  o.rounds = 4;
  o.min_clients = 2;
  o.on_listening = [&](const std::string& ep) {
    for (int i = 1; i <= n; ++i) cluster.start(i, ep, client_flags(i, n, 4000, "dirichlet:0.5"));
  };
  nlohmann::json r = train_federated(fed_config("models/mlp.json", 1000), o);
  INFO(r.dump(1));
  std::string sizes;
  for (const auto& d : r["devices"]) sizes += std::to_string(d["details"]["samples"].get<int64_t>()) + " ";
  const double acc = r["test_accuracy"].get<double>();
  WARN("Dirichlet(0.5) FedAvg (MLP, shard sizes " << sizes << ", 4 rounds): test accuracy " << acc);
  REQUIRE(r["rounds"].size() == 4);
  CHECK(acc > 0.55);  // chance is 0.10; label skew costs accuracy against IID
}

TEST_CASE("a client killed mid-round does not stop the round when K are left", "[integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const int n = 3;
  DaemonCluster cluster(n);
  FedOptions o = fed_options(cluster, n);
  o.rounds = 3;
  o.min_clients = 2;
  pid_t victim = 0;
  o.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep, client_flags(1, n, 1500));
    victim = cluster.start(2, ep, client_flags(2, n, 30000));  // a big shard: still training when killed
    cluster.start(3, ep, client_flags(3, n, 1500));
  };
  o.on_round_started = [&](int round, const std::vector<std::string>&) {
    if (round == 1) kill(victim, SIGKILL);
  };
  cleave::testing::LogCapture logs;
  nlohmann::json r = train_federated(fed_config("models/mlp.json", 500), o);
  INFO(r.dump(1));
  REQUIRE(r["rounds"].size() == 3);
  const auto& r2 = r["rounds"][1];
  CHECK(r2["participants"] == 2);
  REQUIRE(r2["dropped"].size() == 1);
  CHECK_THAT(r2["dropped"][0].get<std::string>(), Catch::Contains("dev2"));
  // The log names the dropout's round as the JSON does (the finding: "(round 1)" for JSON's round 2).
  const std::string label = "(round " + std::to_string(r2["round"].get<int>()) + ")";
  bool logged = false;
  {
    std::lock_guard lock(logs.mutex);
    for (const auto& l : logs.lines) logged |= l.find("dev2") != std::string::npos && l.find(label) != std::string::npos;
  }
  CHECK(logged);
  // Closed on the disconnect, not at the round timeout (a loaded machine may be slow, not 60 s slow).
  CHECK(r2["timed_out"] == false);
  CHECK(r2["seconds"].get<double>() < o.round_timeout_s);
  CHECK(r["rounds"][2]["sampled"].size() == 2);  // the dead client is no longer sampled
  CHECK(r["test_accuracy"].get<double>() > 0.5);
}

TEST_CASE("NaN and wrong-shape updates are rejected by every strategy and the round completes", "[integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  // Not trimmed-mean: over the 2 acceptable updates left here no trim below
  // 0.5 cuts anything, and such a trimmed mean is refused (issue 13,
  // test_hostile_fed.cpp); core/fed's unit tests reject NaN for it too.
  for (const char* strategy : {"fedavg", "fedprox", "median"}) {
    DYNAMIC_SECTION("strategy " << strategy) {
      const int n = 4;
      DaemonCluster cluster(n);
      FedOptions o = fed_options(cluster, n);
      o.rounds = 1;
      o.min_clients = 2;
      o.strategy = strategy;
      o.on_listening = [&](const std::string& ep) {
        cluster.start(1, ep, client_flags(1, n, 2000));
        cluster.start(2, ep, client_flags(2, n, 2000));
        auto nan_flags = client_flags(3, n, 2000);
        nan_flags.insert(nan_flags.end(), {"--poison", "nan"});
        cluster.start(3, ep, nan_flags);
        auto shape_flags = client_flags(4, n, 2000);
        shape_flags.insert(shape_flags.end(), {"--poison", "shape"});
        cluster.start(4, ep, shape_flags);
      };
      nlohmann::json r = train_federated(fed_config("models/mlp.json", 500), o);
      INFO(r.dump(1));
      REQUIRE(r["rounds"].size() == 1);
      const auto& rd = r["rounds"][0];
      CHECK(rd["participants"] == 2);
      CHECK(rd["rejected_count"] == 2);
      const std::string rejected = rd["rejected"].dump();
      CHECK_THAT(rejected, Catch::Contains("dev3") && Catch::Contains("non-finite"));
      CHECK_THAT(rejected, Catch::Contains("dev4") && Catch::Contains("parameters, expected"));
      CHECK(r["rejected_updates"] == 2);
      const double acc = r["test_accuracy"].get<double>();
      CHECK(std::isfinite(acc));
      CHECK(acc > 0.4);
    }
  }
}

TEST_CASE("a round with fewer than K acceptable updates fails saying how many arrived", "[integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const int n = 2;
  DaemonCluster cluster(n);
  FedOptions o = fed_options(cluster, n);
  o.rounds = 2;
  o.min_clients = 2;
  o.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep, client_flags(1, n, 1000));
    auto flags = client_flags(2, n, 1000);
    flags.insert(flags.end(), {"--poison", "inf"});
    cluster.start(2, ep, flags);
  };
  std::string message;
  try {
    train_federated(fed_config("models/mlp.json", 200), o);
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("round 1") && Catch::Contains("only 1 acceptable update") &&
                          Catch::Contains("1 rejected") && Catch::Contains("--min-clients is 2"));
}

TEST_CASE("a straggler: the round closes at --round-timeout with the K updates it has", "[integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const int n = 3;
  DaemonCluster cluster(n);
  FedOptions o = fed_options(cluster, n);
  o.rounds = 2;
  o.min_clients = 2;
  o.round_timeout_s = 4;
  o.on_listening = [&](const std::string& ep) {
    cluster.start(1, ep, client_flags(1, n, 1000));
    cluster.start(2, ep, client_flags(2, n, 60000));  // 20,000 samples: far slower than the others
    cluster.start(3, ep, client_flags(3, n, 1000));
  };
  nlohmann::json r = train_federated(fed_config("models/mlp.json", 300), o);
  INFO(r.dump(1));
  REQUIRE(r["rounds"].size() == 2);
  for (const auto& rd : r["rounds"]) {
    CHECK(rd["timed_out"] == true);
    CHECK(rd["participants"] == 2);
    REQUIRE(rd["dropped"].size() == 1);
    CHECK_THAT(rd["dropped"][0].get<std::string>(), Catch::Contains("dev2") && Catch::Contains("--round-timeout"));
    // Closed at the timeout: not before it, and long before the straggler's
    // 20,000 samples (well over 10 s of training even on an idle machine).
    CHECK(rd["seconds"].get<double>() >= 4);
    CHECK(rd["seconds"].get<double>() < 4 + 8);
  }
  CHECK(r["test_accuracy"].get<double>() > 0.4);
}

TEST_CASE("a client refuses a model that does not match its data, and the run says so", "[integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(1);
  // The coordinator's test set and model: 12 features. The client holds Fashion-MNIST (784).
  const std::string model = cluster.dir() + "/tabular.json";
  {
    std::ofstream f(model);
    f << R"({"name": "tabular", "input": [12], "loss": "cross_entropy",
             "layers": [{"type": "linear", "out_features": 3}]})";
    std::ofstream t(cluster.dir() + "/test.csv");
    for (int row = 0; row < 6; ++row) {
      t << row % 3;
      for (int c = 0; c < 12; ++c) t << "," << (row + c) * 0.1;
      t << "\n";
    }
  }
  FedOptions o = fed_options(cluster, 1);
  o.on_listening = [&](const std::string& ep) { cluster.start(1, ep, client_flags(1, 1, 200)); };
  TrainConfig cfg = fed_config("models/mlp.json", -1);
  cfg.model_path = model;
  cfg.dataset = cluster.dir() + "/train.csv";  // the test split is the sibling test.csv
  std::string message;
  try {
    train_federated(cfg, o);
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("dev1 refused the federated job") && Catch::Contains("(12)") &&
                          Catch::Contains("does not match its data"));
}

TEST_CASE("a federated run resumed from its checkpoint repeats the uninterrupted rounds", "[integration][fed][checkpoint]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  const int n = 2;
  const int64_t limit = 600;
  auto run = [&](const TrainConfig& cfg, int rounds) {
    DaemonCluster cluster(n);
    FedOptions o = fed_options(cluster, n);
    o.rounds = rounds;
    o.min_clients = n;
    o.shutdown_clients = true;
    o.on_listening = [&](const std::string& ep) {
      for (int i = 1; i <= n; ++i) cluster.start(i, ep, client_flags(i, n, limit));
    };
    return train_federated(cfg, o);
  };
  DaemonCluster scratch(0);
  const std::string ck = scratch.dir() + "/fed.ckpt";
  const TrainConfig cfg = fed_config("models/mlp.json", 300);
  const nlohmann::json whole = run(cfg, 3);
  REQUIRE(whole["rounds"].size() == 3);

  TrainConfig first = cfg;
  first.save_path = ck;
  const nlohmann::json part1 = run(first, 1);
  const FedState saved = load_fed_state(ck);
  CHECK(saved.rounds_done == 1);
  CHECK(saved.seed == cfg.seed);
  CHECK(saved.run["strategy"] == "fedavg");

  TrainConfig second = cfg;
  second.load_path = ck;
  second.save_path = ck;  // overwritten after each round, atomically
  const nlohmann::json part2 = run(second, 3);
  CHECK(part2["start_round"] == 1);
  REQUIRE(part2["rounds"].size() == 2);
  // Fresh client optimizers every round and seeded sampling and shuffles: the
  // global weights and the round number are the whole state.
  const auto same_round = [](const nlohmann::json& a, const nlohmann::json& b) {
    CHECK(a["round"] == b["round"]);
    CHECK(a["accuracy"].get<double>() == b["accuracy"].get<double>());
    CHECK(std::abs(a["loss"].get<double>() - b["loss"].get<double>()) <= 1e-6 * std::abs(b["loss"].get<double>()));
  };
  same_round(part1["rounds"][0], whole["rounds"][0]);
  same_round(part2["rounds"][0], whole["rounds"][1]);
  same_round(part2["rounds"][1], whole["rounds"][2]);
  CHECK(load_fed_state(ck).rounds_done == 3);

  // Refusals, before any client is waited for.
  TrainConfig done = cfg;
  done.load_path = ck;
  CHECK_THROWS_WITH(run(done, 3), Catch::Contains("already holds 3 round(s)"));
  TrainConfig other = fed_config("models/cnn.json", 300);
  other.load_path = ck;
  CHECK_THROWS_WITH(run(other, 4), Catch::Contains("different model"));
  CHECK_THROWS_WITH(load_training_state(ck), Catch::Contains("cleave fed --load"));
}
