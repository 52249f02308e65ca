// bench_pipeline: pipelined training across local cleaved daemons against
// training in one process, for the CNN and the MLP on a Fashion-MNIST slice.
//
// Per model, in one run:
//   local 1t        train_local, 1 CPU thread (the baseline of every speed-up)
//   local 2t        train_local, 2 CPU threads
//   local 1t m=M    train_local, 1 thread, M micro-batches of gradient
//                   accumulation (the compute a pipeline does, without a pipeline)
//   pipe pN SCHED   train_pipeline over N local `cleaved` processes (one CPU
//                   thread each, CURVE encryption on, loopback), M micro-batches
//
// Definitions (all from the daemons' traces, summed per stage as `stage_busy`,
// over the coordinator's training time T = `train_seconds`):
//   compute_s  = forward + backward + optimizer seconds of stage s
//   send_s     = send seconds of stage s (encode + encrypt + hand to ZeroMQ)
//   idle_s     = T - compute_s - send_s (waiting in receive, gaps between steps)
//   busy fraction of stage s       = compute_s / T
//   measured bubble                = sum_s idle_s / (p * T)
//   theoretical bubble             = (p - 1) / (m + p - 1)
//   ideal samples/s                = samples / ((m-1)/m * max_s compute_s + sum_s compute_s / m),
//       the synchronous-pipeline time with the measured per-stage compute and
//       free communication: what the layer split and the bubble allow.
//   cpu s          = CPU seconds (user + system) of this process over the run
//       plus, for pipelines, of the reaped daemons: the work the setup costs,
//       independent of how busy the rest of the machine is.
// Every configuration runs --reps times, interleaved, after a short unmeasured
// warm-up; each row is its fastest repetition (the one other load on the
// machine disturbed least). The 1-minute load average is printed per row.
// Usage: bench_pipeline [--models cnn,mlp] [--limit-train 3200] [--limit-test 500]
//        [--epochs 1] [--schedule 1f1b|gpipe|zb1|both|all] [--microbatches 4]
//        [--stages 1,2,3] [--json bench-pipeline.json] [--trace-dir DIR]
//        [--reps 2] [--cleaved PATH] [--dataset-dir DIR]
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/common/bench_args.h"
#include "device/cpu/openmp_policy.h"
#include "core/io/json_file.h"
#include "core/runtime/coordinator/pipeline.h"
#include "apps/common/processes.h"
#include "core/train/local_trainer.h"
#include "core/train/train_config.h"
#include "transport/keys.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }

struct BenchOptions {
  std::vector<std::string> models = {"cnn", "mlp"};
  int64_t limit_train = 3200;
  int64_t limit_test = 500;
  int epochs = 1;
  std::string schedule = "1f1b";
  std::string planner = "balance";  // balance: exactly p stages; auto: the planner may use fewer
  int microbatches = 4;
  std::vector<int> stages = {1, 2, 3};
  std::string json_path = "bench-pipeline.json";
  std::string trace_dir;
  std::string cleaved;
  std::string dataset_dir;
  std::string models_dir = CLEAVE_SOURCE_DIR "/models";
  uint64_t seed = 1;
  int reps = 2;
};

// One measured configuration.
struct Row {
  std::string model, setup;
  int stages = 0;  // 0 for single-process runs
  int threads = 1;
  double samples_per_sec = 0;
  double train_seconds = 0;
  double speedup = 0;  // vs local 1 thread of the same model
  double accuracy = 0;
  std::vector<double> compute, send;  // per stage, seconds
  double bubble_measured = -1, bubble_theoretical = -1;
  double ideal_samples_per_sec = 0;
  double load1 = 0;
  double cpu_self = 0, cpu_daemons = 0;  // CPU seconds of this process / of the daemons over the run
  nlohmann::json plan;
  nlohmann::json prediction;  // planner's predicted vs measured batch time (--planner auto)
  std::vector<double> rep_samples_per_sec;  // every repetition (the row is the best one)
};

using cleave::bench::load_average;

// CPU seconds (user + system) of this process or of its reaped children.
double cpu_seconds(int who) {
  rusage u{};
  getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int64_t batch_of(const std::string& model) { return model == "mlp" ? 128 : 64; }

// CPU seconds a daemon spends starting up (libraries, backend probe, compute
// rate measurement) and idling for `idle_ms` while it cannot reach a
// coordinator: the fixed part of a pipeline run's daemon CPU.
double daemon_startup_cpu(const std::string& cleaved, int idle_ms) {
  char tmpl[] = "/tmp/cleave-pipebench-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("cannot create a temporary directory under /tmp");
  const std::string dir = tmpl;
  cleave::transport::write_keypair(dir, "coordinator", cleave::transport::generate_keypair(), true);
  cleave::transport::write_keypair(dir, "dev1", cleave::transport::generate_keypair(), true);
  const pid_t pid = cleave::spawn({cleaved, "--coordinator", "tcp://127.0.0.1:9", "--key", dir + "/dev1.key",
                           "--coordinator-key", dir + "/coordinator.pub", "--name", "dev1", "--backend", "cpu",
                           "--threads", "1", "--max-jobs", "1"},
                          dir + "/dev1.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
  double cpu = -1;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close_paren = text.rfind(')');
  if (close_paren != std::string::npos) {
    std::istringstream fields(text.substr(close_paren + 2));
    std::string f;
    std::vector<std::string> v;
    while (fields >> f) v.push_back(f);
    // Fields after the command: state is v[0]; utime and stime are v[11], v[12].
    if (v.size() > 12) cpu = (std::stod(v[11]) + std::stod(v[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  cleave::terminate(pid);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return cpu;
}

std::string find_cleaved(const std::string& given) {
  if (!given.empty()) {
    if (!fs::exists(given)) throw std::runtime_error("--cleaved " + given + ": no such file");
    return given;
  }
  const fs::path built = fs::path(CLEAVE_BUILD_DIR) / "apps" / "cleaved" / "cleaved";
  if (fs::exists(built)) return built.string();
  throw std::runtime_error("cannot find cleaved at " + built.string() +
                           ": build it (ninja cleaved) or pass --cleaved PATH");
}

cleave::TrainConfig base_config(const BenchOptions& o, const std::string& model) {
  cleave::TrainConfig cfg;
  cfg.model_path = o.models_dir + "/" + model + ".json";
  cfg.dataset_dir = o.dataset_dir;
  cfg.epochs = o.epochs;
  cfg.batch = batch_of(model);
  cfg.seed = o.seed;
  cfg.limit_train = o.limit_train;
  cfg.limit_test = o.limit_test;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 1e-3f;
  cfg.backend = "cpu";
  cfg.progress = false;
  return cfg;
}

Row run_local(const BenchOptions& o, const std::string& model, int threads, int microbatches) {
  cleave::TrainConfig cfg = base_config(o, model);
  cfg.threads = threads;
  cfg.microbatches = microbatches;
  const double cpu0 = cpu_seconds(RUSAGE_SELF);
  nlohmann::json r = cleave::train_local(cfg);
  const double cpu1 = cpu_seconds(RUSAGE_SELF);
  Row row;
  row.model = model;
  row.setup = "local " + std::to_string(threads) + "t" + (microbatches > 1 ? " m=" + std::to_string(microbatches) : "");
  row.threads = threads;
  row.samples_per_sec = r.at("samples_per_sec").get<double>();
  for (const auto& e : r.at("epoch_stats")) row.train_seconds += e.at("seconds").get<double>();
  row.accuracy = r.at("test_accuracy").get<double>();
  row.cpu_self = cpu1 - cpu0;
  row.load1 = load_average();
  return row;
}

Row run_pipeline(const BenchOptions& o, const std::string& model, int stages, const std::string& schedule,
                 const std::string& cleaved) {
  char tmpl[] = "/tmp/cleave-pipebench-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("cannot create a temporary directory under /tmp");
  const std::string dir = tmpl;
  std::vector<pid_t> daemons;
  const double self0 = cpu_seconds(RUSAGE_SELF), children0 = cpu_seconds(RUSAGE_CHILDREN);
  auto cleanup = [&]() {
    for (pid_t pid : daemons) cleave::terminate(pid);
    daemons.clear();
    std::error_code ec;
    fs::remove_all(dir, ec);
  };
  try {
    fs::create_directories(fs::path(dir) / "allow");
    cleave::transport::write_keypair(dir, "coordinator", cleave::transport::generate_keypair(), true);
    for (int i = 1; i <= stages; ++i) {
      const std::string name = "dev" + std::to_string(i);
      auto files = cleave::transport::write_keypair(dir, name, cleave::transport::generate_keypair(), true);
      fs::copy_file(files.public_, fs::path(dir) / "allow" / (name + ".pub"), fs::copy_options::overwrite_existing);
    }
    cleave::TrainConfig cfg = base_config(o, model);
    cfg.microbatches = o.microbatches;
    cfg.threads = 1;
    cleave::ClusterOptions cl;
    cl.devices = stages;
    cl.key_path = dir + "/coordinator.key";
    cl.allow_path = dir + "/allow";
    cl.listen = "tcp://127.0.0.1:*";
    cl.schedule = schedule;
    cl.planner = o.planner;
    cl.shutdown_daemons = true;
    cl.register_timeout_ms = 60000;
    cl.interrupted = [] { return g_interrupted.load(); };
    if (!o.trace_dir.empty())
      cl.trace_path = o.trace_dir + "/" + model + "-p" + std::to_string(stages) + "-" + schedule + ".json";
    cl.on_listening = [&](const std::string& endpoint) {
      for (int i = 1; i <= stages; ++i) {
        const std::string name = "dev" + std::to_string(i);
        daemons.push_back(cleave::spawn({cleaved, "--coordinator", endpoint, "--key", dir + "/" + name + ".key",
                                 "--coordinator-key", dir + "/coordinator.pub", "--name", name, "--backend", "cpu",
                                 "--threads", "1", "--max-jobs", "1"},
                                dir + "/" + name + ".log"));
      }
    };
    nlohmann::json r;
    try {
      r = cleave::train_pipeline(cfg, cl);
    } catch (const std::exception& e) {
      std::string logs;
      for (int i = 1; i <= stages; ++i) {
        std::ifstream in(dir + "/dev" + std::to_string(i) + ".log");
        std::stringstream ss;
        ss << in.rdbuf();
        logs += "\n--- dev" + std::to_string(i) + ".log ---\n" + ss.str();
      }
      throw std::runtime_error(std::string(e.what()) + logs);
    }
    const double self1 = cpu_seconds(RUSAGE_SELF);
    cleanup();

    Row row;
    row.cpu_self = self1 - self0;
    row.cpu_daemons = cpu_seconds(RUSAGE_CHILDREN) - children0;
    row.model = model;
    row.setup = "pipe p" + std::to_string(stages) + " " + schedule;
    row.stages = stages;
    row.samples_per_sec = r.at("samples_per_sec").get<double>();
    row.train_seconds = r.at("train_seconds").get<double>();
    row.accuracy = r.at("test_accuracy").get<double>();
    row.bubble_theoretical = r.at("bubble_theoretical").get<double>();
    row.plan = r.at("plan");
    if (r.contains("prediction")) row.prediction = r.at("prediction");
    const double T = std::max(1e-9, row.train_seconds);
    double idle = 0, sum_compute = 0, max_compute = 0;
    for (const auto& st : r.at("stage_busy")) {
      const auto& b = st.at("busy_seconds");
      auto get = [&](const char* k) { return b.contains(k) ? b.at(k).get<double>() : 0.0; };
      // zb1's backward is two slices, B (input gradient) and W (weight gradient).
      const double c = get("forward") + get("backward") + get("B") + get("W") + get("optimizer");
      const double s = get("send");
      row.compute.push_back(c);
      row.send.push_back(s);
      idle += std::max(0.0, T - c - s);
      sum_compute += c;
      max_compute = std::max(max_compute, c);
    }
    row.bubble_measured = idle / (static_cast<double>(stages) * T);
    const double m = o.microbatches;
    const double ideal_seconds = (m - 1) / m * max_compute + sum_compute / m;
    const double samples = row.samples_per_sec * row.train_seconds;
    row.ideal_samples_per_sec = samples / std::max(1e-9, ideal_seconds);
    row.load1 = load_average();
    return row;
  } catch (...) {
    cleanup();
    throw;
  }
}

std::string fractions(const std::vector<double>& v, double T) {
  std::string s;
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.2f", i ? "/" : "", v[i] / std::max(1e-9, T));
    s += buf;
  }
  return s.empty() ? "-" : s;
}

nlohmann::json to_json(const Row& r) {
  nlohmann::json j = {{"model", r.model},
                      {"setup", r.setup},
                      {"stages", r.stages},
                      {"samples_per_sec", r.samples_per_sec},
                      {"speedup_vs_local_1t", r.speedup},
                      {"train_seconds", r.train_seconds},
                      {"test_accuracy", r.accuracy},
                      {"load_average_1min", r.load1},
                      {"samples_per_sec_each_rep", r.rep_samples_per_sec},
                      {"cpu_seconds_coordinator_or_local", r.cpu_self},
                      {"cpu_seconds_daemons", r.cpu_daemons}};
  if (r.stages > 0) {
    j["stage_compute_seconds"] = r.compute;
    j["stage_send_seconds"] = r.send;
    std::vector<double> frac;
    for (double c : r.compute) frac.push_back(c / std::max(1e-9, r.train_seconds));
    j["stage_compute_fraction"] = frac;
    j["bubble_measured"] = r.bubble_measured;
    j["bubble_theoretical"] = r.bubble_theoretical;
    j["ideal_samples_per_sec"] = r.ideal_samples_per_sec;
    j["plan"] = r.plan;
    if (!r.prediction.is_null()) j["prediction"] = r.prediction;
  }
  return j;
}

void print_header() {
  std::printf("%-5s %-16s %9s %8s %-15s %-15s %6s %6s %9s %6s %5s %5s\n", "model", "setup", "samples/s", "speed-up",
              "busy(compute)", "send", "bubble", "theory", "ideal s/s", "cpu s", "acc", "load");
}

void print_row(const Row& r) {
  char bubble[16] = "-", theory[16] = "-", ideal[16] = "-";
  if (r.stages > 0) {
    std::snprintf(bubble, sizeof bubble, "%.2f", r.bubble_measured);
    std::snprintf(theory, sizeof theory, "%.2f", r.bubble_theoretical);
    std::snprintf(ideal, sizeof ideal, "%.0f", r.ideal_samples_per_sec);
  }
  std::printf("%-5s %-16s %9.0f %7.2fx %-15s %-15s %6s %6s %9s %6.1f %5.3f %5.1f\n", r.model.c_str(),
              r.setup.c_str(), r.samples_per_sec, r.speedup, fractions(r.compute, r.train_seconds).c_str(),
              fractions(r.send, r.train_seconds).c_str(), bubble, theory, ideal, r.cpu_self + r.cpu_daemons,
              r.accuracy, r.load1);
  if (!r.prediction.is_null())
    std::printf("      planner: %zu stage(s), predicted %.1f ms/batch, measured %.1f ms/batch (measured/predicted %.2f)\n",
                r.plan.size(), 1000 * r.prediction.value("batch_seconds", 0.0),
                1000 * r.prediction.value("measured_batch_seconds", 0.0), r.prediction.value("measured_over_predicted", 0.0));
  std::fflush(stdout);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int run(const BenchOptions& o) {
  const std::string cleaved = find_cleaved(o.cleaved);
  if (!o.trace_dir.empty()) fs::create_directories(o.trace_dir);
  std::vector<std::string> schedules =
      o.schedule == "both"  ? std::vector<std::string>{"gpipe", "1f1b"}
      : o.schedule == "all" ? std::vector<std::string>{"gpipe", "1f1b", "zb1"}
                            : std::vector<std::string>{o.schedule};
  const double load_start = load_average();
  std::printf("bench_pipeline: %lld train / %lld test samples, %d epoch(s), %d micro-batches, best of %d, "
              "%u CPU core(s), load average %.1f at start\n",
              static_cast<long long>(o.limit_train), static_cast<long long>(o.limit_test), o.epochs, o.microbatches,
              o.reps, std::thread::hardware_concurrency(), load_start);
  const double startup_cpu = daemon_startup_cpu(cleaved, 1500);
  std::printf("a cleaved daemon spends %.2f CPU s starting up (probe included) and idling 1.5 s\n", startup_cpu);
  const auto t0 = Clock::now();

  // The configurations, in the order they run within one repetition.
  struct Config {
    std::string model;
    int threads = 1, microbatches = 1, stages = 0;
    std::string schedule;
  };
  std::vector<Config> configs;
  for (const std::string& model : o.models) {
    configs.push_back({model, 1, 1, 0, ""});
    configs.push_back({model, 2, 1, 0, ""});
    if (o.microbatches > 1) configs.push_back({model, 1, o.microbatches, 0, ""});
    for (int p : o.stages)
      for (const auto& sched : schedules) configs.push_back({model, 1, o.microbatches, p, sched});
  }
  // Warm-up (not measured): page in the dataset, the BLAS and the allocator.
  for (const std::string& model : o.models) {
    BenchOptions w = o;
    w.limit_train = std::min<int64_t>(o.limit_train, 4 * batch_of(model));
    w.limit_test = std::min<int64_t>(o.limit_test, 100);
    w.epochs = 1;
    (void)run_local(w, model, 1, 1);
  }
  // Repetitions interleave the configurations so slow phases of other load
  // spread over all of them; each row keeps its fastest repetition.
  std::vector<Row> best(configs.size());
  for (int rep = 0; rep < o.reps; ++rep) {
    for (size_t i = 0; i < configs.size(); ++i) {
      if (g_interrupted) throw std::runtime_error("interrupted");
      const Config& c = configs[i];
      Row r = c.stages == 0 ? run_local(o, c.model, c.threads, c.microbatches)
                            : run_pipeline(o, c.model, c.stages, c.schedule, cleaved);
      std::fprintf(stderr, "  rep %d/%d  %-5s %-16s %8.0f samples/s  (load %.1f)\n", rep + 1, o.reps, r.model.c_str(),
                   r.setup.c_str(), r.samples_per_sec, r.load1);
      std::vector<double> reps = best[i].rep_samples_per_sec;
      reps.push_back(r.samples_per_sec);
      if (rep == 0 || r.samples_per_sec > best[i].samples_per_sec) best[i] = r;
      best[i].rep_samples_per_sec = reps;
    }
  }
  print_header();
  std::map<std::string, double> baseline;
  for (size_t i = 0; i < configs.size(); ++i)
    if (configs[i].stages == 0 && configs[i].threads == 1 && configs[i].microbatches == 1)
      baseline[configs[i].model] = best[i].samples_per_sec;
  for (Row& r : best) {
    r.speedup = r.samples_per_sec / std::max(1e-9, baseline[r.model]);
    print_row(r);
  }
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("total %.0f s, load average %.1f at the end\n", total, load_average());

  nlohmann::json out = {{"benchmark", "pipeline"},
                        {"limit_train", o.limit_train},
                        {"limit_test", o.limit_test},
                        {"epochs", o.epochs},
                        {"microbatches", o.microbatches},
                        {"reps", o.reps},
                        {"schedules", schedules},
                        {"cpu_cores", std::thread::hardware_concurrency()},
                        {"load_average_start", load_start},
                        {"daemon_startup_cpu_seconds", startup_cpu},
                        {"seconds", total},
                        {"rows", nlohmann::json::array()}};
  for (const Row& r : best) out["rows"].push_back(to_json(r));
  cleave::write_json_file(o.json_path, out);
  std::printf("wrote %s\n", o.json_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cleave::prefer_passive_openmp(argv);  // before any OpenMP/BLAS threads start
  BenchOptions o;
  CLI::App app{"Pipelined training over local cleaved daemons vs one process (samples/s, busy, bubble)"};
  std::string models = "cnn,mlp", stages = "1,2,3";
  app.add_option("--models", models, "Comma-separated models from models/ (batch 64 for cnn, 128 otherwise)")
      ->capture_default_str();
  app.add_option("--limit-train", o.limit_train, "Training samples")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--limit-test", o.limit_test, "Test samples")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--epochs", o.epochs, "Epochs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--schedule", o.schedule, "gpipe | 1f1b | zb1 | both (gpipe and 1f1b) | all (the three)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b", "zb1", "both", "all"}));
  app.add_option("--planner", o.planner,
                 "balance (every daemon gets a stage) | auto (profile + planner; prints predicted vs measured)")
      ->capture_default_str()
      ->check(CLI::IsMember({"balance", "auto"}));
  app.add_option("--microbatches", o.microbatches, "Micro-batches per batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--stages", stages, "Comma-separated pipeline sizes (daemons)")->capture_default_str();
  app.add_option("--json", o.json_path, "Write the results here")->capture_default_str();
  app.add_option("--trace-dir", o.trace_dir, "Write each pipeline run's Chrome trace into this directory");
  app.add_option("--cleaved", o.cleaved, "Path of the cleaved binary (default: this build's)");
  app.add_option("--dataset-dir", o.dataset_dir, "Where Fashion-MNIST lives");
  app.add_option("--models-dir", o.models_dir, "Where the model JSON files live")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed")->capture_default_str();
  app.add_option("--reps", o.reps, "Repetitions of every configuration (the fastest is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  CLI11_PARSE(app, argc, argv);
  try {
    o.models = split_list(models);
    if (o.models.empty()) throw std::runtime_error("--models: give at least one model");
    for (const auto& m : o.models)
      if (!fs::exists(o.models_dir + "/" + m + ".json"))
        throw std::runtime_error("--models: no " + o.models_dir + "/" + m + ".json");
    o.stages.clear();
    for (const auto& s : split_list(stages)) {
      size_t used = 0;
      int p = 0;
      try {
        p = std::stoi(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != s.size() || p < 1 || p > 16) throw std::runtime_error("--stages: '" + s + "' is not a number in 1..16");
      o.stages.push_back(p);
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
}
