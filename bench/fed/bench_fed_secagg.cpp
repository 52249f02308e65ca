// bench_fed_secagg: what secure aggregation costs (issue 18). For 4, 8 and 16
// real cleaved clients on loopback (CURVE keys, allow-list, IID shards of
// Fashion-MNIST) it runs the same federated rounds with plain FedAvg and with
// --secure-aggregation, interleaved, and reports per run:
//   - client CPU seconds per round (user + system of each client process,
//     from /proc/PID/stat before it is stopped, median over the clients), so
//     the difference is the cost of the masking protocol on top of training;
//   - bytes per client per round, up and down (the coordinator's endpoint
//     counters, divided by the clients);
//   - coordinator CPU seconds and wall seconds per round.
// The model is small on purpose (the protocol's cost grows with clients and
// parameters, training's with samples): --model and --samples-per-client
// change that.
//
// Usage: bench_fed_secagg [--clients 4,8,16] [--rounds 3] [--repeats 1]
//                         [--samples-per-client 300] [--model FILE] [--json bench-fed-secagg.json]
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/common/bench_args.h"
#include "bench/common/local_daemons.h"
#include "core/io/json_file.h"
#include "core/runtime/coordinator/fed_coordinator.h"
#include "device/cpu/process_env.h"
#include "transport/log.h"

using namespace cleave;

namespace {

// user + system CPU seconds of process `pid` so far (/proc/PID/stat fields 14 and 15), or -1.
double process_cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double self_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

using cleave::bench::median;

using cleave::bench::load_average;

struct Settings {
  std::string model;
  int rounds = 3;
  int64_t per_client = 300;
};

nlohmann::json run_one(const Settings& s, int clients, bool secure) {
  std::vector<std::string> names;
  for (int i = 0; i < clients; ++i) names.push_back("client" + std::to_string(i));
  bench::LocalDaemons daemons(names, std::string(CLEAVE_BUILD_DIR) + "/apps/cleaved/cleaved");
  TrainConfig cfg = bench::bench_run_config(s.model);
  cfg.threads = 1;
  FedOptions o;
  o.clients = clients;
  o.rounds = s.rounds;
  o.secure_aggregation = secure;
  daemons.connect(o);
  std::vector<double> cpu_at_start;
  o.on_listening = [&](const std::string& ep) {
    for (int i = 0; i < clients; ++i)
      daemons.start(names[static_cast<size_t>(i)], ep,
                    bench::LocalDaemons::data_client_flags(i, clients, s.per_client * clients));
  };
  // Client CPU from the first round on (their start-up, data loading and GFLOP/s probe excluded).
  o.on_round_started = [&](int round, const std::vector<std::string>&) {
    if (round != 0) return;
    for (pid_t p : daemons.pids()) cpu_at_start.push_back(process_cpu_seconds(p));
  };
  const double coordinator_cpu_before = self_cpu_seconds();
  const nlohmann::json r = train_federated(cfg, o);
  const double coordinator_cpu = self_cpu_seconds() - coordinator_cpu_before;
  std::vector<double> client_cpu;
  for (size_t i = 0; i < daemons.pids().size() && i < cpu_at_start.size(); ++i)
    client_cpu.push_back((process_cpu_seconds(daemons.pids()[i]) - cpu_at_start[i]) / s.rounds);
  daemons.stop();
  double round_wall = 0;
  for (const auto& rd : r["rounds"]) round_wall += rd["seconds"].get<double>();
  const double per = static_cast<double>(clients) * s.rounds;
  return {{"clients", clients},
          {"secure_aggregation", secure},
          {"client_cpu_seconds_per_round", median(client_cpu)},
          {"bytes_up_per_client_per_round", r["bytes_up"].get<double>() / per},
          {"bytes_down_per_client_per_round", r["bytes_down"].get<double>() / per},
          {"coordinator_cpu_seconds_per_round", coordinator_cpu / s.rounds},
          {"round_wall_seconds", round_wall / s.rounds},
          {"test_accuracy", r["test_accuracy"]},
          {"parameters", r["parameters"]},
          {"load_average_after", load_average()}};
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  CLI::App app{"bench_fed_secagg: the cost of secure aggregation against plain FedAvg"};
  Settings s;
  s.model = std::string(CLEAVE_SOURCE_DIR) + "/models/mlp.json";
  std::vector<int> counts = {4, 8, 16};
  int repeats = 1;
  std::string json_path;
  app.add_option("--clients", counts, "Client counts to run")->delimiter(',')->capture_default_str();
  app.add_option("--rounds", s.rounds, "Rounds per run")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "Interleaved plain/secure repetitions (medians reported)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--samples-per-client", s.per_client, "Training samples each client holds")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--model", s.model, "Model JSON")->capture_default_str();
  app.add_option("--json", json_path, "Write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    transport::set_log_level(transport::LogLevel::kWarning);
    nlohmann::json results = nlohmann::json::array();
    std::printf("%-8s %-8s %-14s %-14s %-14s %-14s %-10s %-6s\n", "clients", "secagg", "client cpu s", "up B/client",
                "down B/client", "coord cpu s", "round s", "load");
    for (int n : counts) {
      std::vector<nlohmann::json> rows[2];
      for (int rep = 0; rep < repeats; ++rep)
        for (int secure = 0; secure < 2; ++secure) rows[secure].push_back(run_one(s, n, secure == 1));
      for (int secure = 0; secure < 2; ++secure) {
        auto med = [&](const char* key) {
          std::vector<double> v;
          for (const auto& row : rows[secure]) v.push_back(row[key].get<double>());
          return median(v);
        };
        nlohmann::json row = rows[secure].back();
        for (const char* key : {"client_cpu_seconds_per_round", "bytes_up_per_client_per_round",
                                "bytes_down_per_client_per_round", "coordinator_cpu_seconds_per_round",
                                "round_wall_seconds"})
          row[key] = med(key);
        row["repeats"] = repeats;
        results.push_back(row);
        std::printf("%-8d %-8s %-14.3f %-14.0f %-14.0f %-14.3f %-10.3f %-6.2f\n", n, secure ? "on" : "off",
                    row["client_cpu_seconds_per_round"].get<double>(), row["bytes_up_per_client_per_round"].get<double>(),
                    row["bytes_down_per_client_per_round"].get<double>(),
                    row["coordinator_cpu_seconds_per_round"].get<double>(), row["round_wall_seconds"].get<double>(),
                    row["load_average_after"].get<double>());
        std::fflush(stdout);
      }
    }
    nlohmann::json doc = {{"benchmark", "fed_secagg"}, {"model", s.model}, {"rounds", s.rounds},
                          {"samples_per_client", s.per_client}, {"results", results},
                          {"machine", {{"cores", sysconf(_SC_NPROCESSORS_ONLN)}}}};
    write_json_file(json_path, doc);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fed_secagg: error: %s\n", e.what());
    return 1;
  }
}
