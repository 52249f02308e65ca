// test_sdk_fed.cpp: an app joins a real federated run through the SDK (issue
// 14). A `cleave fed` coordinator process trains the MLP with two clients: an
// ordinary `cleaved` on shard 0/2 of Fashion-MNIST and this test process, an
// SDK client whose data callback serves shard 1/2 (loaded here with
// core/data). The run completes, the SDK client registered as a federated
// client with its samples and shard, reported every round through the progress
// callback, and the final global weights equal those of the same run with two
// `cleaved` clients (1e-6 relative): the SDK path is the same algorithm.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "cleave/cleave.h"
#include "core/data/dataset.h"
#include "core/data/shard.h"
#include "core/train/train_checkpoint.h"
#include "integration/daemon_cluster.h"
#include "sdk/fed_run.h"
#include "skip.h"

namespace {

using cleave::testing::DaemonCluster;
using namespace cleave::testing::sdk;

}  // namespace

TEST_CASE("SDK: an app serving its shard from callbacks joins a cleave fed run and matches two cleaved clients",
          "[sdk][integration][fed]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  DaemonCluster cluster(2);

  // The reference: two ordinary cleaved clients.
  FedRun reference(cluster, "reference");
  cluster.start(1, reference.endpoint, client_flags(0));
  cluster.start(2, reference.endpoint, client_flags(1));
  const int reference_code = reference.wait();
  INFO(read_text(reference.log) << cluster.log(1) << cluster.log(2));
  REQUIRE(reference_code == 0);
  cluster.stop();

  // The same run with dev2 an SDK client in this process.
  App app;
  const cleave::Dataset all = cleave::load_fashion_mnist("", /*train=*/true, kLimit);
  app.shard = cleave::subset(all, cleave::shard_indices(all, 1, 2, "iid", 11));
  FedRun run(cluster, "sdk");
  cluster.start(1, run.endpoint, client_flags(0));
  cleave_client* c = make_fed_client(cluster, run.endpoint, app, on_progress);
  REQUIRE(cleave_client_start(c) == CLEAVE_OK);
  const cleave_status s = cleave_client_wait(c, 120000);
  INFO("SDK client: " << cleave_last_error());
  const int code = run.wait();
  INFO(read_text(run.log) << cluster.log(1));
  CHECK(s == CLEAVE_OK);  // released by --shutdown-clients
  REQUIRE(code == 0);
  cleave_client_info info{};
  REQUIRE(cleave_client_get_status(c, &info) == CLEAVE_OK);
  CHECK(info.state == CLEAVE_STATE_ENDED);
  CHECK(info.jobs_done == 1);
  CHECK(info.step == kRounds - 1);
  CHECK(cleave_client_destroy(c) == CLEAVE_OK);

  // Its samples were read once to check them (chunks of 256), then batch by
  // batch as each round trained (one local epoch of batch 32): the SDK keeps no copy.
  CHECK(app.fills == (app.shard.size() + 255) / 256 + kRounds * ((app.shard.size() + 31) / 32));
  REQUIRE(app.rounds == std::vector<int64_t>{0, 1});
  for (double loss : app.losses) CHECK(std::isfinite(loss));
  CHECK(app.losses[1] < 2.3);  // below chance (ln 10) after a round

  // It registered as a federated client with its samples and shard.
  const nlohmann::json result = nlohmann::json::parse(read_text(run.json));
  bool found = false;
  for (const auto& d : result["devices"]) {
    if (d["name"] != "dev2") continue;
    found = true;
    CHECK(d["details"]["fed_client"] == true);
    CHECK(d["details"]["samples"] == app.shard.size());
    CHECK(d["details"]["shard"] == "1/2");
  }
  CHECK(found);

  // Same shards, same seed: the same global weights as two cleaved clients.
  const cleave::FedState want = cleave::load_fed_state(reference.save), got = cleave::load_fed_state(run.save);
  REQUIRE(got.rounds_done == kRounds);
  REQUIRE(got.params.size() == want.params.size());
  double worst = 0;
  for (size_t i = 0; i < got.params.size(); ++i)
    worst = std::max(worst, std::abs(double(got.params[i]) - want.params[i]) / std::max(1e-3, std::abs(double(want.params[i]))));
  INFO("largest relative difference " << worst);
  CHECK(worst <= 1e-6);
}
