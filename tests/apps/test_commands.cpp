// test_commands.cpp: end-to-end tests of the `cleave` commands test_cli.cpp
// does not cover — keygen, plan, profile, fed, demo — and of `cleaved`'s own
// flags. Each runs the real binaries. Every bad command line must exit with
// status 2 and say what is wrong and where the flags are documented; a run
// that fails (a missing file, an impossible plan) exits with status 1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "apps/cli_util.h"
#include "apps/common/processes.h"
#include "core/model/model_spec.h"
#include "device/cpu/blas_kernels.h"
#include "integration/daemon_cluster.h"
#include "skip.h"
#include "transport/keys.h"

using namespace cleave::cli_test;
using cleave::testing::DaemonCluster;

namespace {

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice).
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(s);
  return ntohs(a.sin_port);
}

// Checks a plan's stages: contiguous, covering [0, layers), each within its
// device's memory, each on a distinct device of `devices`.
void check_plan_stages(const nlohmann::json& plan, int layers, const std::set<std::string>& devices) {
  const auto& stages = plan.at("stages");
  REQUIRE(!stages.empty());
  int covered = 0;
  std::set<std::string> used;
  for (const auto& st : stages) {
    INFO(st.dump());
    CHECK(st.at("layers")[0].get<int>() == covered);
    covered = st.at("layers")[1].get<int>();
    CHECK(st.at("memory_bytes").get<int64_t>() <= st.at("memory_available").get<int64_t>());
    const std::string device = st.at("device").get<std::string>();
    CHECK(devices.count(device) == 1);
    CHECK(used.insert(device).second);
  }
  CHECK(covered == layers);
}

int num_layers(const std::string& model) { return cleave::ModelSpec::load(model).num_layers(); }

// A devices file of "small" (24 MiB, fast) and "big" (4 GiB, slow) on a 1 Gbit/s link.
std::string two_devices(const TempDir& dir) {
  const std::string devices = dir.file("devices.json");
  write_text(devices, R"({"devices": [{"name": "small", "memory": "24M", "gflops": 200},
                                      {"name": "big", "memory": "4G", "gflops": 20}],
                          "default_link": {"mbps": 1000, "latency_ms": 0.5}})");
  return devices;
}

}  // namespace

TEST_CASE("bad command lines exit 2 and name the command's --help", "[cli]") {
  require_usage_error("", {"A subcommand is required", "cleave --help"});
  require_usage_error("frobnicate", {"unknown command 'frobnicate'", "keygen", "cleave --help"});
  require_usage_error("train --local", {"--model is required", "cleave train --help"});
  require_usage_error("train --local --model '" + kMlp + "' --bogus", {"--bogus", "cleave train --help"});
  require_usage_error("train --local --model '" + kMlp + "' --batch 0", {"--batch", "must be positive, got 0"});
  require_usage_error("train --local --model '" + kMlp + "' --epochs two", {"--epochs", "'two'"});
  require_usage_error("train --local --model '" + kMlp + "' --threads -1", {"--threads", "0 or more"});
  require_usage_error("train --model '" + kMlp + "' --devices 2", {"--key and --allow", "--local"});
  require_usage_error("train --model '" + kMlp + "' --devices 2 --recompute some",
                      {"--recompute", "'some'", "none", "all", "auto"});
  require_usage_error("train --local --model '" + kMlp + "' --recompute all", {"--recompute", "pipeline", "--local"});
  // A flag the command parses but the run then cannot use is a run failure, exit 1.
  require_failure("train --local --model /nonexistent/model.json", {"/nonexistent/model.json"});
  // --help and --version are not errors.
  CHECK(run_cleave("--help").code == 0);
  const RunResult v = run_cleave("--version");
  CHECK(v.code == 0);
  CHECK(v.output.find("cleave ") != std::string::npos);
}

TEST_CASE("cleave keygen writes a CURVE key pair and will not replace it without --force", "[cli][keygen]") {
  TempDir dir;
  const std::string keys = dir.file("keys");  // created by keygen
  const RunResult r = run_cleave("keygen --out '" + keys + "' --name dev-1.a");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string secret = keys + "/dev-1.a.key", pub = keys + "/dev-1.a.pub";
  REQUIRE(fs::exists(secret));
  REQUIRE(fs::exists(pub));
  // The secret key is the owner's alone, and the public key is the one it derives.
  struct stat st {};
  REQUIRE(stat(secret.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(stat(keys.c_str(), &st) == 0);
  CHECK((st.st_mode & 077) == 0);  // the directory it created: no group / other access
  const cleave::transport::KeyPair pair = cleave::transport::load_secret_key(secret);
  CHECK(pair.public_key == cleave::transport::load_public_key(pub));
  CHECK(pair.public_key.size() == 40);

  // Again: refused, exit 1, the key is unchanged; with --force a new key replaces it.
  const std::string before = read_bytes(secret);
  const RunResult again = run_cleave("keygen --out '" + keys + "' --name dev-1.a");
  INFO(again.output);
  require_exit(again, kExitFailure, {secret, "already exists", "--force"});
  CHECK(read_bytes(secret) == before);
  REQUIRE(run_cleave("keygen --out '" + keys + "' --name dev-1.a --force").code == 0);
  CHECK(read_bytes(secret) != before);
  CHECK(cleave::transport::load_secret_key(secret).public_key == cleave::transport::load_public_key(pub));

  // Another name, another key.
  REQUIRE(run_cleave("keygen --out '" + keys + "' --name other").code == 0);
  CHECK(cleave::transport::load_public_key(keys + "/other.pub") != cleave::transport::load_public_key(pub));

  // Bad command lines.
  require_usage_error("keygen --name x", {"--out is required"});
  require_usage_error("keygen --out '" + keys + "'", {"--name is required"});
  for (const char* bad : {"a/b", "../up", "has space", "semi;colon"}) {
    INFO(bad);
    require_usage_error("keygen --out '" + keys + "' --name '" + bad + "'", {"--name", "letters, digits"});
  }
  CHECK_FALSE(fs::exists(dir.file("up.key")));
  // A file where the directory should be: the run fails naming it.
  write_text(dir.file("plain"), "x");
  require_failure("keygen --out '" + dir.file("plain") + "' --name k", {dir.file("plain"), "not a directory"});
}

TEST_CASE("cleave plan places a model on a devices file within each device's memory", "[cli][plan]") {
  TempDir dir;
  // "small" cannot hold the whole MLP with Adam (2.9M parameters x 16 bytes = 47 MB),
  // so the plan must split it and keep small's share under 24 MiB.
  const std::string devices = two_devices(dir);
  const std::string out = dir.file("plan.json");
  const RunResult r = run_cleave("plan --model '" + kMlp + "' --devices '" + devices + "' --microbatches 2 --json '" +
                                 out + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("plan written to " + out) != std::string::npos);
  const nlohmann::json plan = read_json(out);
  check_plan_stages(plan, num_layers(kMlp), {"small", "big"});
  for (const auto& st : plan.at("stages"))
    if (st.at("device") == "small") CHECK(st.at("memory_bytes").get<int64_t>() <= int64_t{24} << 20);
  CHECK(plan.at("microbatches") == 2);
  CHECK(plan.at("devices_file") == devices);
  // The table on stdout names both devices.
  CHECK(r.output.find("small") != std::string::npos);
  CHECK(r.output.find("big") != std::string::npos);

  // --max-stages 1 on a device that holds everything: one stage, the whole model.
  const std::string one = dir.file("one.json");
  REQUIRE(run_cleave("plan --model '" + kMlp + "' --devices '" + devices + "' --max-stages 1 --json '" + one + "'")
              .code == 0);
  const nlohmann::json single = read_json(one);
  REQUIRE(single.at("stages").size() == 1);
  CHECK(single.at("stages")[0].at("device") == "big");

  // --schedule zb1: the plan says so and predicts no more bubble than 1F1B for
  // the same stages (here none: the light last stage returns each gradient
  // before the heavy first one needs it, so both run at the bottleneck).
  const std::string zb = dir.file("zb1.json");
  REQUIRE(run_cleave("plan --model '" + kMlp + "' --devices '" + devices + "' --microbatches 2 --schedule zb1 --json '" +
                     zb + "'")
              .code == 0);
  const nlohmann::json zplan = read_json(zb);
  CHECK(zplan.at("schedule") == "zb1");
  check_plan_stages(zplan, num_layers(kMlp), {"small", "big"});
  REQUIRE(zplan.at("stages").size() == plan.at("stages").size());
  CHECK(zplan.at("predicted_batch_seconds").get<double>() <= plan.at("predicted_batch_seconds").get<double>() * (1 + 1e-9));
  CHECK(zplan.at("predicted_batch_seconds").get<double>() >= zplan.at("bottleneck_seconds").get<double>());
  // --recompute all: every stage recomputes its activations, in the JSON and the table.
  const std::string recomputed = dir.file("recomputed.json");
  const RunResult rc = run_cleave("plan --model '" + kMlp + "' --devices '" + devices +
                                  "' --microbatches 2 --recompute all --json '" + recomputed + "'");
  INFO(rc.output);
  REQUIRE(rc.code == 0);
  CHECK(rc.output.find("recompute") != std::string::npos);
  const nlohmann::json all = read_json(recomputed);
  CHECK(all.at("recompute") == "all");
  for (const auto& st : all.at("stages")) CHECK(st.at("recompute") == true);
  for (const auto& st : plan.at("stages")) CHECK(st.at("recompute") == false);  // the default: none
  CHECK(plan.at("recompute") == "none");

  // Nothing fits: the run fails naming the model and the devices file.
  const std::string tiny = dir.file("tiny.json");
  write_text(tiny, R"({"devices": [{"name": "a", "memory": "1M", "gflops": 1}, {"name": "b", "memory": "1M", "gflops": 1}]})");
  require_failure("plan --model '" + kMlp + "' --devices '" + tiny + "'", {kMlp, tiny});
  // Unreadable inputs are run failures naming the file.
  require_failure("plan --model '" + kMlp + "' --devices '" + dir.file("missing.json") + "'", {dir.file("missing.json")});
  write_text(dir.file("broken.json"), "{\"devices\": [");
  require_failure("plan --model '" + kMlp + "' --devices '" + dir.file("broken.json") + "'", {dir.file("broken.json")});
  // Bad command lines.
  require_usage_error("plan --model '" + kMlp + "'", {"--devices is required"});
  require_usage_error("plan --devices '" + devices + "'", {"--model is required"});
  require_usage_error("plan --model '" + kMlp + "' --devices '" + devices + "' --schedule zigzag", {"--schedule", "zigzag"});
  require_usage_error("plan --model '" + kMlp + "' --devices '" + devices + "' --microbatches 0",
                      {"--microbatches", "must be positive"});
  require_usage_error("plan --model '" + kMlp + "' --devices '" + devices + "' --encoding f64", {"--encoding", "f64"});
  require_usage_error("plan --model '" + kMlp + "' --devices '" + devices + "' --recompute sometimes",
                      {"--recompute", "'sometimes'", "auto"});
  require_usage_error("plan --model '" + kMlp + "' --devices '" + devices + "' --max-stages -1",
                      {"--max-stages", "0 or more"});
  // `cleave train --devices N` is a count; plan's --devices is a file, and says so.
  require_usage_error("plan --model '" + kMlp + "' --devices 2",
                      {"--devices", "expected a devices file, got the count 2", "cleave profile --devices 2"});
}

TEST_CASE("cleave profile refuses bad flags before it listens", "[cli][profile]") {
  require_help_lists("profile", {"--model", "--devices", "--key", "--allow", "--listen", "--register-timeout",
                                 "--insecure", "--batch", "--microbatches", "--schedule", "--dataset-dir", "--json"});
  require_usage_error("profile --devices 2 --insecure", {"--model is required"});
  require_usage_error("profile --model '" + kMlp + "' --devices 2", {"cleave profile needs --key and --allow"});
  require_usage_error("profile --model '" + kMlp + "' --devices 0 --insecure", {"--devices", "must be positive"});
  require_usage_error("profile --model '" + kMlp + "' --insecure --batch -4", {"--batch", "must be positive"});
  require_usage_error("profile --model '" + kMlp + "' --insecure --register-timeout 0",
                      {"--register-timeout", "must be positive"});
  require_usage_error("profile --model '" + kMlp + "' --insecure --schedule zigzag", {"--schedule", "zigzag"});
}

// A profile times the layers on synthetic inputs, so it needs no dataset: this
// runs where Fashion-MNIST is absent.
TEST_CASE("cleave profile measures live daemons and writes a devices file cleave plan reads", "[cli][profile]") {
  DaemonCluster cluster(2);
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  cluster.start(1, endpoint);  // they dial until the coordinator listens
  cluster.start(2, endpoint);
  TempDir dir;
  const std::string devices = dir.file("devices.json");
  const RunResult r = run_cleave("profile --model '" + kMlp + "' --devices 2 --key '" + cluster.coordinator_key() +
                                 "' --allow '" + cluster.allow() + "' --listen " + endpoint +
                                 " --register-timeout 30000 --json '" + devices + "'");
  cluster.stop();
  INFO(r.output << "\ndev1 log:\n" << cluster.log(1));
  REQUIRE(r.code == 0);
  const nlohmann::json d = read_json(devices);
  REQUIRE(d.at("devices").size() == 2);
  std::set<std::string> names;
  const int layers = num_layers(kMlp);
  for (const auto& dev : d.at("devices")) {
    names.insert(dev.at("name").get<std::string>());
    CHECK(dev.at("memory").get<double>() > 0);
    CHECK(dev.at("gflops").get<double>() > 0);
    REQUIRE(dev.at("layer_seconds").size() == static_cast<size_t>(layers));  // one time per layer
    for (const auto& t : dev.at("layer_seconds")) CHECK(t.get<double>() >= 0);
  }
  CHECK(names == std::set<std::string>{"dev1", "dev2"});
  // Both directions of the one link were measured.
  std::set<std::string> links;
  for (const auto& l : d.at("links")) {
    CHECK(l.at("mbps").get<double>() > 0);
    links.insert(l.at("from").get<std::string>() + ">" + l.at("to").get<std::string>());
  }
  CHECK(links == std::set<std::string>{"dev1>dev2", "dev2>dev1"});

  // What profile wrote is what plan reads.
  const std::string plan = dir.file("plan.json");
  const RunResult p = run_cleave("plan --model '" + kMlp + "' --devices '" + devices + "' --json '" + plan + "'");
  INFO(p.output);
  REQUIRE(p.code == 0);
  check_plan_stages(read_json(plan), layers, names);
}

// A language model needs a --text to train on, but not to be profiled; a zb1
// profile times every layer's backward as B then W.
TEST_CASE("cleave profile times gpt-tiny for zb1 without a text to train on", "[cli][profile]") {
  const std::string gpt = CLEAVE_SOURCE_DIR "/models/gpt-tiny.json";
  DaemonCluster cluster(1);
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  cluster.start(1, endpoint);
  TempDir dir;
  const std::string devices = dir.file("devices.json");
  const RunResult r = run_cleave("profile --model '" + gpt + "' --devices 1 --key '" + cluster.coordinator_key() +
                                 "' --allow '" + cluster.allow() + "' --listen " + endpoint +
                                 " --register-timeout 30000 --batch 8 --microbatches 4 --schedule zb1 --json '" +
                                 devices + "'");
  cluster.stop();
  INFO(r.output << "\ndev1 log:\n" << cluster.log(1));
  REQUIRE(r.code == 0);
  const nlohmann::json d = read_json(devices);
  REQUIRE(d.at("devices").size() == 1);
  INFO(d.dump());
  // profile times two micro-batch sizes (here 2 samples and 1) and fits a
  // fixed time per micro-batch plus a time per sample; a cheap layer whose
  // time did not grow from 1 sample to 2 (noise on a loaded machine) is all
  // fixed time, with 0 per sample. What must hold is that every layer costs
  // something at the micro-batch size profiled, and nothing costs less than 0.
  const auto& per_sample = d.at("devices").at(0).at("layer_seconds");
  const auto& fixed = d.at("devices").at(0).at("layer_microbatch_seconds");
  const auto layers = static_cast<size_t>(num_layers(gpt));
  const double microbatch = 8.0 / 4;  // --batch 8, --microbatches 4
  REQUIRE(per_sample.size() == layers);
  REQUIRE(fixed.size() == layers);
  for (size_t l = 0; l < layers; ++l) {
    INFO("layer " << l);
    CHECK(per_sample[l].get<double>() >= 0);
    CHECK(fixed[l].get<double>() >= 0);
    CHECK(fixed[l].get<double>() + microbatch * per_sample[l].get<double>() > 0);
  }
  CHECK_THAT(d.at("description").get<std::string>(), Catch::Contains("zb1") && Catch::Contains("gpt-tiny"));
}

TEST_CASE("cleave fed documents its flags and refuses bad ones before it listens", "[cli][fed]") {
  require_help_lists("fed", {"--model", "--clients", "--rounds", "--local-epochs", "--fraction", "--min-clients",
                             "--round-timeout", "--strategy", "--mu", "--trim", "--key", "--allow", "--listen",
                             "--insecure", "--register-timeout", "--peer-timeout", "--shutdown-clients", "--json",
                             "--save", "--load", "--init", "--optimizer", "--lr", "--batch", "--seed"});
  const std::string fed = "fed --model '" + kMlp + "' --insecure ";
  // The clients own the training data.
  for (const char* flag : {"--epochs 2", "--limit-train 100", "--max-steps 5", "--microbatches 2"}) {
    INFO(flag);
    require_usage_error(fed + flag, {std::string(flag).substr(0, std::string(flag).find(' ')), "does not apply",
                                     "cleaved --dataset"});
  }
  require_usage_error(fed + "--strategy mean", {"--strategy", "mean"});
  require_usage_error(fed + "--mu 0.1", {"--mu applies to --strategy fedprox only"});
  require_usage_error(fed + "--strategy fedprox --mu -1", {"--mu", "0 or more"});
  require_usage_error(fed + "--strategy trimmed-mean --trim 0.5", {"--trim", "[0, 0.5)"});
  require_usage_error(fed + "--clients 2 --min-clients 3", {"--min-clients 3 exceeds --clients 2"});
  require_usage_error(fed + "--fraction 0", {"--fraction"});
  require_usage_error(fed + "--fraction 1.5", {"--fraction", "[0, 1]"});
  require_usage_error(fed + "--rounds 0", {"--rounds", "must be positive"});
  require_usage_error(fed + "--round-timeout -3", {"--round-timeout", "must be positive"});
  require_usage_error(fed + "--optimizer sgd --nesterov", {"nesterov", "momentum"});
  require_usage_error("fed --model '" + kMlp + "'", {"cleave fed needs --key and --allow"});
  require_usage_error("fed --insecure", {"--model is required"});
}

TEST_CASE("cleave demo refuses bad flags before it starts a daemon", "[cli][demo]") {
  require_help_lists("demo", {"--devices", "--epochs", "--model", "--schedule", "--planner", "--microbatches", "--batch",
                              "--threads", "--seed", "--limit-train", "--limit-test", "--dataset-dir", "--json",
                              "--trace", "--keep-keys"});
  require_usage_error("demo --devices 0", {"--devices", "[1, 16]"});
  require_usage_error("demo --devices 17", {"--devices", "[1, 16]"});
  require_usage_error("demo --epochs 0", {"--epochs", "must be positive"});
  require_usage_error("demo --schedule zigzag", {"--schedule", "zigzag"});
  require_usage_error("demo --planner best", {"--planner", "best"});
  require_usage_error("demo --microbatches 0", {"--microbatches", "must be positive"});
  require_usage_error("demo --batch x", {"--batch", "'x'"});
  require_usage_error("demo --limit-train 0", {"--limit-train", "must be positive"});
}

TEST_CASE("cleave demo: a short real run trains a pipeline and stops its daemons", "[cli][demo]") {
  CLEAVE_SKIP_UNLESS_FASHION_MNIST();
  TempDir dir;
  const std::string keep = dir.file("demo-keys"), json = dir.file("demo.json");
  // 512 samples in batches of 64: 8 steps over 2 stages, a few seconds on one core each.
  const RunResult r = run_cleave("demo --devices 2 --epochs 1 --limit-train 512 --limit-test 500 --model '" + kCnn +
                                 "' --keep-keys '" + keep + "' --json '" + json + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const nlohmann::json j = read_json(json);
  CHECK(j.at("mode") == "demo");
  CHECK(j.at("steps") == 8);
  // Two stages on the two daemons, contiguous over all layers, parameters adding up.
  const auto& plan = j.at("plan");
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].at("layers")[0] == 0);
  CHECK(plan[0].at("layers")[1] == plan[1].at("layers")[0]);
  CHECK(plan[1].at("layers")[1] == num_layers(kCnn));
  CHECK(plan[0].at("device") != plan[1].at("device"));
  CHECK(plan[0].at("parameters").get<int64_t>() + plan[1].at("parameters").get<int64_t>() ==
        j.at("parameters").get<int64_t>());
  // It trained: finite losses, the later ones below the first, better than chance (0.1) on the test images.
  const auto losses = j.at("losses").get<std::vector<double>>();
  REQUIRE(losses.size() == 8);
  for (double l : losses) CHECK(std::isfinite(l));
  CHECK(losses.back() < losses.front());
  CHECK(j.at("test_accuracy").get<double>() > 0.2);
  // The keys it made and the daemons' logs are kept; the daemons themselves are gone.
  CHECK(fs::exists(keep + "/coordinator.key"));
  CHECK(fs::exists(keep + "/allow/dev1.pub"));
  CHECK(fs::exists(keep + "/dev2.log"));
  // Its daemons run the kernels this CPU has: where OpenBLAS would pick lesser
  // ones (a VM hiding the CPU model) cleave restarts itself with the better
  // OPENBLAS_CORETYPE and says so, the daemons inherit it, and none warns of
  // slow kernels (a core type set by whoever runs the tests is theirs: then
  // nothing is checked; test_process_env.cpp fakes such a VM).
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    for (const char* log : {"/dev1.log", "/dev2.log"}) {
      const std::string text = cleave::read_text(keep + log);
      INFO(log << ":\n" << text);
      CHECK(text.find("OpenBLAS chose its") == std::string::npos);
    }
    const std::string core = cleave::openblas_better_coretype();
    if (!core.empty()) CHECK(r.output.find("restarting with OPENBLAS_CORETYPE=" + core) != std::string::npos);
  }
  // "de[v]": the pattern matches the daemons' command lines, not the shell running pgrep.
  const RunResult left = run_shell("pgrep -f '" + keep + "/de[v]'");
  INFO("still running:\n" << left.output);
  CHECK(left.code == 1);  // pgrep: no process matched
}

TEST_CASE("cleaved refuses bad flags with status 2, and a daemon that cannot start fails with 1", "[cli][cleaved]") {
  require_help_lists("cleaved", {"--coordinator", "--key", "--coordinator-key", "--name", "--backend",
                                 "--memory-limit", "--threads", "--peer-bind", "--bandwidth-limit", "--max-jobs",
                                 "--coordinator-timeout", "--insecure", "--verbose", "--dataset", "--data",
                                 "--dataset-dir", "--shard", "--partition", "--seed", "--limit-train"});
  const std::string base = "--coordinator tcp://127.0.0.1:9 --insecure --name dev ";
  require_cleaved_usage_error("", {"--coordinator is required"});
  require_cleaved_usage_error("--coordinator tcp://127.0.0.1:9", {"--key and --coordinator-key are required"});
  // No key to take the name from: the daemon's flag, not the SDK's cleave_options_set_name.
  require_cleaved_usage_error("--coordinator tcp://127.0.0.1:9 --insecure", {"--name is required without --key"});
  require_cleaved_usage_error(base + "--bogus", {"--bogus"});
  require_cleaved_usage_error(base + "--backend tpu", {"--backend", "tpu"});
  require_cleaved_usage_error(base + "--memory-limit 12Q", {"--memory-limit", "12Q"});
  require_cleaved_usage_error(base + "--bandwidth-limit fast", {"--bandwidth-limit", "fast"});
  require_cleaved_usage_error(base + "--threads -2", {"--threads", "0 or more"});
  require_cleaved_usage_error(base + "--max-jobs 0", {"--max-jobs", "must be positive"});
  require_cleaved_usage_error(base + "--coordinator-timeout 0", {"--coordinator-timeout", "must be positive"});
  require_cleaved_usage_error(base + "--shard 1/2", {"--shard needs --dataset or --data"});
  require_cleaved_usage_error(base + "--dataset fashion-mnist --shard 4/4", {"--shard 4/4", "[0, 4)"});
  require_cleaved_usage_error(base + "--dataset fashion-mnist --shard two", {"--shard"});
  require_cleaved_usage_error(base + "--dataset fashion-mnist --partition random", {"--partition", "random"});
  require_cleaved_usage_error(base + "--dataset fashion-mnist --data /tmp/x.csv", {"--dataset or --data, not both"});
  require_cleaved_usage_error(base + "--limit-train 0", {"--limit-train", "must be positive"});
  // Well-formed flags, but the key file is not there: the daemon fails to start, exit 1.
  const RunResult r = run_cleaved("--coordinator tcp://127.0.0.1:9 --key /nonexistent/dev.key --coordinator-key "
                                  "/nonexistent/coordinator.pub --max-jobs 1");
  INFO(r.output);
  require_exit(r, kExitFailure, {"/nonexistent/dev.key"});
}

TEST_CASE("an unwritable --save, --json or --trace is refused before any work, and nothing is left behind", "[cli]") {
  TempDir dir;
  const std::string base = "train --local --model '" + kMlp + "' --epochs 1 --limit-train 64 --limit-test 64 --no-progress";
  // /proc takes no new files, even from root; a directory is not a file.
  for (const std::string& bad : {std::string("/proc/cleave-save.ckpt"), dir.file("no-such-dir") + "/x.ckpt", dir.str()}) {
    INFO(bad);
    require_usage_error(base + " --save '" + bad + "'", {"--save cannot be written", bad});
    require_usage_error(base + " --json '" + bad + "'", {"--json cannot be written", bad});
  }
  require_usage_error("fed --model '" + kMlp + "' --clients 1 --insecure --save /proc/cleave-fed.ckpt",
                      {"--save cannot be written"});
  require_usage_error("train --model '" + kMlp + "' --devices 2 --insecure --save /proc/cleave-pipe.ckpt",
                      {"--save cannot be written"});
  require_usage_error("train --model '" + kMlp + "' --devices 2 --insecure --trace /proc/cleave-trace.json",
                      {"--trace cannot be written"});
  CHECK(fs::is_empty(dir.str()));  // the probe's temporary file is gone again
  // A writable path is still fine, and the check leaves no file where none was.
  const RunResult ok = run_cleave(base + " --max-steps 1 --save '" + dir.file("ok.ckpt") + "'");
  INFO(ok.output);
  CHECK(ok.code == 0);
  CHECK(fs::exists(dir.file("ok.ckpt")));
}

TEST_CASE("cleave plan --microbatches auto writes the count it chose", "[cli][plan][microbatches]") {
  TempDir dir;
  const std::string devices = two_devices(dir);
  const std::string out = dir.file("plan.json");
  const RunResult r = run_cleave("plan --model '" + kMlp + "' --devices '" + devices +
                                 "' --batch 32 --microbatches auto --json '" + out + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("(--microbatches auto)") != std::string::npos);
  const nlohmann::json plan = read_json(out);
  CHECK(plan.at("microbatches_auto") == true);
  const int m = plan.at("microbatches").get<int>();
  CHECK(m >= 1);
  CHECK(m <= 32);
  // A number stays a number, and says it was not chosen.
  REQUIRE(run_cleave("plan --model '" + kMlp + "' --devices '" + devices + "' --microbatches 3 --json '" + out + "'")
              .code == 0);
  CHECK(read_json(out).at("microbatches") == 3);
  CHECK(read_json(out).at("microbatches_auto") == false);

  for (const std::string& base : {"plan --model '" + kMlp + "' --devices '" + devices + "'",
                                  "train --model '" + kMlp + "' --devices 2"}) {
    require_usage_error(base + " --microbatches 0", {"--microbatches", "must be positive"});
    require_usage_error(base + " --microbatches foo", {"--microbatches", "'foo'", "auto"});
    require_usage_error(base + " --microbatches 2.5", {"--microbatches", "whole number"});
  }
  require_usage_error("train --local --model '" + kMlp + "' --microbatches auto", {"--microbatches auto", "--local"});
  require_usage_error("train --model '" + kMlp + "' --devices 2 --planner balance --microbatches auto",
                      {"--microbatches auto", "--planner auto"});
}
