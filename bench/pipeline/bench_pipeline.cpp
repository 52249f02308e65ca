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
// Usage: bench_pipeline [--models cnn,mlp] [--limit-train 3200] [--limit-test 500]
//        [--epochs 1] [--schedule 1f1b|gpipe|both] [--microbatches 4]
//        [--stages 1,2,3] [--json bench-pipeline.json] [--trace-dir DIR]
//        [--cleaved PATH] [--dataset-dir DIR]
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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

#include "core/runtime/coordinator.h"
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
  int microbatches = 4;
  std::vector<int> stages = {1, 2, 3};
  std::string json_path = "bench-pipeline.json";
  std::string trace_dir;
  std::string cleaved;
  std::string dataset_dir;
  std::string models_dir = CLEAVE_SOURCE_DIR "/models";
  uint64_t seed = 1;
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
  nlohmann::json plan;
};

double load_average() {
  std::ifstream in("/proc/loadavg");
  double l = 0;
  in >> l;
  return l;
}

int64_t batch_of(const std::string& model) { return model == "mlp" ? 128 : 64; }

// fork + exec; the child gets SIGTERM when we die and logs to `log_path`.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("cannot start " + argv.front() + ": fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// SIGTERM, up to `grace_ms` to exit, then SIGKILL; reaps the child.
void terminate_child(pid_t pid, int grace_ms = 3000) {
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) return;
  kill(pid, SIGTERM);
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < std::chrono::milliseconds(grace_ms)) {
    if (waitpid(pid, &status, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
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
  nlohmann::json r = cleave::train_local(cfg);
  Row row;
  row.model = model;
  row.setup = "local " + std::to_string(threads) + "t" + (microbatches > 1 ? " m=" + std::to_string(microbatches) : "");
  row.threads = threads;
  row.samples_per_sec = r.at("samples_per_sec").get<double>();
  for (const auto& e : r.at("epoch_stats")) row.train_seconds += e.at("seconds").get<double>();
  row.accuracy = r.at("test_accuracy").get<double>();
  row.load1 = load_average();
  return row;
}

Row run_pipeline(const BenchOptions& o, const std::string& model, int stages, const std::string& schedule,
                 const std::string& cleaved) {
  char tmpl[] = "/tmp/cleave-pipebench-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("cannot create a temporary directory under /tmp");
  const std::string dir = tmpl;
  std::vector<pid_t> daemons;
  auto cleanup = [&]() {
    for (pid_t pid : daemons) terminate_child(pid);
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
    cl.shutdown_daemons = true;
    cl.register_timeout_ms = 60000;
    cl.interrupted = [] { return g_interrupted.load(); };
    if (!o.trace_dir.empty())
      cl.trace_path = o.trace_dir + "/" + model + "-p" + std::to_string(stages) + "-" + schedule + ".json";
    cl.on_listening = [&](const std::string& endpoint) {
      for (int i = 1; i <= stages; ++i) {
        const std::string name = "dev" + std::to_string(i);
        daemons.push_back(spawn({cleaved, "--coordinator", endpoint, "--key", dir + "/" + name + ".key",
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
    cleanup();

    Row row;
    row.model = model;
    row.setup = "pipe p" + std::to_string(stages) + " " + schedule;
    row.stages = stages;
    row.samples_per_sec = r.at("samples_per_sec").get<double>();
    row.train_seconds = r.at("train_seconds").get<double>();
    row.accuracy = r.at("test_accuracy").get<double>();
    row.bubble_theoretical = r.at("bubble_theoretical").get<double>();
    row.plan = r.at("plan");
    const double T = std::max(1e-9, row.train_seconds);
    double idle = 0, sum_compute = 0, max_compute = 0;
    for (const auto& st : r.at("stage_busy")) {
      const auto& b = st.at("busy_seconds");
      auto get = [&](const char* k) { return b.contains(k) ? b.at(k).get<double>() : 0.0; };
      const double c = get("forward") + get("backward") + get("optimizer");
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
                      {"load_average_1min", r.load1}};
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
  }
  return j;
}

void print_header() {
  std::printf("%-5s %-16s %9s %8s %-15s %-15s %8s %8s %9s %6s %5s\n", "model", "setup", "samples/s", "speed-up",
              "busy(compute)", "send", "bubble", "theory", "ideal s/s", "acc", "load");
}

void print_row(const Row& r) {
  char bubble[16] = "-", theory[16] = "-", ideal[16] = "-";
  if (r.stages > 0) {
    std::snprintf(bubble, sizeof bubble, "%.2f", r.bubble_measured);
    std::snprintf(theory, sizeof theory, "%.2f", r.bubble_theoretical);
    std::snprintf(ideal, sizeof ideal, "%.0f", r.ideal_samples_per_sec);
  }
  std::printf("%-5s %-16s %9.0f %7.2fx %-15s %-15s %8s %8s %9s %6.3f %5.1f\n", r.model.c_str(), r.setup.c_str(),
              r.samples_per_sec, r.speedup, fractions(r.compute, r.train_seconds).c_str(),
              fractions(r.send, r.train_seconds).c_str(), bubble, theory, ideal, r.accuracy, r.load1);
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
      o.schedule == "both" ? std::vector<std::string>{"gpipe", "1f1b"} : std::vector<std::string>{o.schedule};
  const double load_start = load_average();
  std::printf("bench_pipeline: %lld train / %lld test samples, %d epoch(s), %d micro-batches, %u CPU core(s), "
              "load average %.1f at start\n",
              static_cast<long long>(o.limit_train), static_cast<long long>(o.limit_test), o.epochs, o.microbatches,
              std::thread::hardware_concurrency(), load_start);
  print_header();
  const auto t0 = Clock::now();
  std::vector<Row> rows;
  for (const std::string& model : o.models) {
    const Row base = run_local(o, model, 1, 1);
    auto add = [&](Row r) {
      r.speedup = r.samples_per_sec / std::max(1e-9, base.samples_per_sec);
      print_row(r);
      rows.push_back(r);
    };
    add(base);
    add(run_local(o, model, 2, 1));
    if (o.microbatches > 1) add(run_local(o, model, 1, o.microbatches));
    for (int p : o.stages)
      for (const auto& sched : schedules) {
        if (g_interrupted) throw std::runtime_error("interrupted");
        add(run_pipeline(o, model, p, sched, cleaved));
      }
  }
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("total %.0f s, load average %.1f at the end\n", total, load_average());

  nlohmann::json out = {{"benchmark", "pipeline"},
                        {"limit_train", o.limit_train},
                        {"limit_test", o.limit_test},
                        {"epochs", o.epochs},
                        {"microbatches", o.microbatches},
                        {"schedules", schedules},
                        {"cpu_cores", std::thread::hardware_concurrency()},
                        {"load_average_start", load_start},
                        {"seconds", total},
                        {"rows", nlohmann::json::array()}};
  for (const Row& r : rows) out["rows"].push_back(to_json(r));
  std::ofstream f(o.json_path);
  if (!f) throw std::runtime_error("cannot write " + o.json_path);
  f << out.dump(2) << "\n";
  std::printf("wrote %s\n", o.json_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  CLI::App app{"Pipelined training over local cleaved daemons vs one process (samples/s, busy, bubble)"};
  std::string models = "cnn,mlp", stages = "1,2,3";
  app.add_option("--models", models, "Comma-separated models from models/ (batch 64 for cnn, 128 otherwise)")
      ->capture_default_str();
  app.add_option("--limit-train", o.limit_train, "Training samples")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--limit-test", o.limit_test, "Test samples")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--epochs", o.epochs, "Epochs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--schedule", o.schedule, "gpipe | 1f1b | both")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b", "both"}));
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
