// bench_train_step.cpp: training-step throughput of cleave's CPU backend against
// PyTorch, and the MLP's FLOP rate against the BLAS sgemm rate of the same run.
//
//   bench_train_step [--threads T | --threads-list 1,2] [--steps N] [--reps R]
//                    [--seconds S] [--models mlp,cnn] [--profile] [--no-torch]
//                    [--json PATH]
//
// For each thread count and model (models/mlp.json at batch 128, models/cnn.json
// at batch 64) it times the loop of core/train/local_trainer.cpp on synthetic
// data (inputs in [0, 1), random labels, fixed seed): upload, forward, softmax
// cross-entropy (grad_scale 1/batch), backward, Adam (lr 1e-3), zero_grad. Each
// repetition times N steps after a warm-up; the reported rate is the median over
// repetitions. PyTorch (bench/core/torch_train_step.py, kept running as one
// --serve subprocess) runs the same model, batch, thread count and step count,
// and its repetitions alternate with cleave's so that both see the same machine
// load. The BLAS rate is cblas_sgemm itself, in the same process and with the
// same thread count: per shape (the MLP's GEMMs and 1024^3), and as a "GEMM-only
// step" that runs exactly the MLP's GEMMs, timed right after each of cleave's
// repetitions; the MLP's fraction of sgemm is the median over repetitions of
// (GEMM-only time / cleave step time), which a noisy machine disturbs least.
//
// FLOPs: the GEMM FLOPs a training step needs, from the layer shapes: per Linear
// / Conv2d, forward 2*B*W*S, weight gradient 2*B*W*S and input gradient
// 2*B*W*S (W = weight elements, S = output positions per sample: 1 for Linear,
// oh*ow for Conv2d), except that the first weight layer needs no input
// gradient. Bias, activation, loss and optimizer FLOPs are left out.
#include <cblas.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/common/synthetic_training.h"
#include "core/io/json_file.h"
#include "device/cpu/process_env.h"
#include "bench/core/profiling_device.h"
#include "bench/common/bench_args.h"
#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/nn/layer.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"
#include "core/util/rng.h"
#include "core/util/seconds.h"
#include "device/device.h"

#ifndef CLEAVE_SOURCE_DIR
#define CLEAVE_SOURCE_DIR "."
#endif
#ifndef CLEAVE_TORCH_SCRIPT
#define CLEAVE_TORCH_SCRIPT "bench/core/torch_train_step.py"
#endif

namespace {

namespace bench = cleave::bench;

using cleave::seconds_since;
using cleave::Shape;
using cleave::Tensor;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// options

struct Options {
  std::vector<int> threads;
  std::vector<bench::ModelRun> models{{"mlp", 128}, {"cnn", 64}};
  int64_t steps = 0;  // 0 = calibrate to `seconds`
  int warmup = 3;
  int reps = 5;
  double seconds = 2.5;  // timed seconds per (model, thread count) and framework, when steps == 0
  double gemm_seconds = 0.08;
  uint64_t seed = 1;
  bool torch = true;
  bool profile = false;
  std::string models_dir = std::string(CLEAVE_SOURCE_DIR) + "/models";
  std::string torch_script = CLEAVE_TORCH_SCRIPT;
  std::string python = "python3";
  std::string json_path = "bench-train-step.json";
};

void usage(std::ostream& os) {
  os << "usage: bench_train_step [options]\n"
        "  --threads T         run with T threads only (cleave's CPU device, OpenBLAS, torch)\n"
        "  --threads-list L    comma-separated thread counts (default 1,<all cores>)\n"
        "  --models L          comma-separated: mlp, cnn, optionally NAME:BATCH (default mlp:128,cnn:64)\n"
        "  --steps N           timed steps per repetition (default: calibrated to --seconds)\n"
        "  --seconds S         timed seconds per model, thread count and framework (default 2.5)\n"
        "  --reps R            repetitions; the median is reported (default 5)\n"
        "  --warmup W          untimed steps before the first repetition (default 3)\n"
        "  --seed S            seed of the synthetic data and the weights (default 1)\n"
        "  --profile           also print where cleave's step time goes, op by op\n"
        "  --no-torch          skip the PyTorch comparison\n"
        "  --python EXE        python interpreter for the PyTorch side (default python3)\n"
        "  --torch-script P    path of torch_train_step.py\n"
        "  --models-dir D      folder holding mlp.json and cnn.json (default <source>/models)\n"
        "  --json PATH         where to write the results (default bench-train-step.json)\n";
}

[[noreturn]] void bad_args(const std::string& msg) {
  std::cerr << "bench_train_step: " << msg << "\n";
  usage(std::cerr);
  std::exit(2);
}

Options parse_options_or_throw(int argc, char** argv) {
  Options o;
  bool threads_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_args(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--threads") {
      o.threads = {static_cast<int>(bench::parse_int_arg(arg, value(), 1))};
      threads_given = true;
    } else if (arg == "--threads-list") {
      o.threads.clear();
      for (const std::string& t : bench::split_text(value(), ',')) o.threads.push_back(static_cast<int>(bench::parse_int_arg(arg, t, 1)));
      if (o.threads.empty()) bad_args("--threads-list is empty");
      threads_given = true;
    } else if (arg == "--models") {
      o.models = bench::parse_model_runs(value());
    } else if (arg == "--steps") {
      o.steps = bench::parse_int_arg(arg, value(), 1);
    } else if (arg == "--seconds") {
      o.seconds = bench::parse_positive_arg(arg, value());
    } else if (arg == "--reps") {
      o.reps = static_cast<int>(bench::parse_int_arg(arg, value(), 1));
    } else if (arg == "--warmup") {
      o.warmup = static_cast<int>(bench::parse_int_arg(arg, value(), 0));
    } else if (arg == "--seed") {
      o.seed = static_cast<uint64_t>(bench::parse_int_arg(arg, value(), 0));
    } else if (arg == "--profile") {
      o.profile = true;
    } else if (arg == "--no-torch") {
      o.torch = false;
    } else if (arg == "--python") {
      o.python = value();
    } else if (arg == "--torch-script") {
      o.torch_script = value();
    } else if (arg == "--models-dir") {
      o.models_dir = value();
    } else if (arg == "--json") {
      o.json_path = value();
    } else if (arg == "--help" || arg == "-h") {
      usage(std::cout);
      std::exit(0);
    } else {
      bad_args("unknown argument '" + arg + "'");
    }
  }
  if (!threads_given) {
    const int all = bench::online_cores();
    o.threads = all > 1 ? std::vector<int>{1, all} : std::vector<int>{1};
  }
  return o;
}

Options parse_options(int argc, char** argv) {
  try {
    return parse_options_or_throw(argc, argv);
  } catch (const std::invalid_argument& e) {
    bad_args(e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// FLOP accounting

struct GemmShape {
  bool ta, tb;
  int64_t m, n, k;
  std::string label() const {
    return std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " " + std::to_string(m) + "x" + std::to_string(n) +
           "x" + std::to_string(k);
  }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  bool operator<(const GemmShape& o) const {
    return std::tie(ta, tb, m, n, k) < std::tie(o.ta, o.tb, o.m, o.n, o.k);
  }
};

struct FlopCount {
  double required = 0;  // GEMM FLOPs a step needs (no input gradient for the first weight layer)
  double executed = 0;  // what Partition::backward(need_dx=false) runs: input gradient of every layer but layer 0
  std::vector<GemmShape> linear_gemms;  // the Linear layers' GEMMs as cleave issues them (required ones)
  // True when every required FLOP is in linear_gemms (a model of Linear layers only).
  bool all_linear() const {
    double f = 0;
    for (const GemmShape& g : linear_gemms) f += g.flops();
    return required > 0 && std::abs(f - required) < 1e-6 * required;
  }
};

FlopCount count_flops(const cleave::ModelSpec& spec, int64_t batch) {
  FlopCount fc;
  bool first_weight_layer = true;
  for (int i = 0; i < spec.num_layers(); ++i) {
    const std::string type = spec.layers[i].at("type").get<std::string>();
    if (type != "linear" && type != "conv2d") continue;
    const Shape& in = spec.shapes[i];
    const Shape& out = spec.shapes[i + 1];
    const int64_t positions = cleave::numel(out) / out.at(0);  // 1 for linear, oh*ow for conv
    // Weight elements: (out, in) for Linear, (OC, C, kh, kw) for Conv2d.
    const int64_t w_elems = cleave::numel(cleave::make_layer(spec.layers[i], in)->param_info().at(0).shape);
    const double f = 2.0 * static_cast<double>(batch) * static_cast<double>(w_elems) * static_cast<double>(positions);
    fc.required += first_weight_layer ? 2 * f : 3 * f;
    fc.executed += i == 0 ? 2 * f : 3 * f;
    if (type == "linear") {
      const int64_t in_f = in.at(0), out_f = out.at(0);
      fc.linear_gemms.push_back({false, true, batch, out_f, in_f});  // y = x W^T
      fc.linear_gemms.push_back({true, false, out_f, in_f, batch});  // dW += dy^T x
      if (!first_weight_layer) fc.linear_gemms.push_back({false, false, batch, in_f, out_f});  // dx = dy W
    }
    first_weight_layer = false;
  }
  return fc;
}

// ---------------------------------------------------------------------------------------------
// sgemm rate (cblas_sgemm directly, row-major like Device::gemm)

struct GemmRate {
  GemmShape shape;
  std::vector<double> gflops;  // one per repetition
  double median_gflops() const { return bench::median(gflops); }
};

GemmRate measure_sgemm(const GemmShape& s, int reps, double seconds) {
  const int64_t rows_a = s.ta ? s.k : s.m, cols_a = s.ta ? s.m : s.k;
  const int64_t rows_b = s.tb ? s.n : s.k, cols_b = s.tb ? s.k : s.n;
  std::vector<float> a(static_cast<size_t>(rows_a * cols_a)), b(static_cast<size_t>(rows_b * cols_b)),
      c(static_cast<size_t>(s.m * s.n), 0.f);
  cleave::Rng rng(42);
  for (float& v : a) v = rng.uniform(-1, 1);
  for (float& v : b) v = rng.uniform(-1, 1);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(),
                static_cast<int>(cols_a), b.data(), static_cast<int>(cols_b), 0.0f, c.data(), static_cast<int>(s.n));
  };
  run();  // warm up (thread pool, caches)
  GemmRate r{s, {}};
  for (int rep = 0; rep < reps; ++rep) {
    int64_t calls = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    do {
      run();
      ++calls;
      elapsed = seconds_since(t0);
    } while (elapsed < seconds);
    r.gflops.push_back(s.flops() * static_cast<double>(calls) / elapsed * 1e-9);
  }
  return r;
}

// A "perfect" training step: only cblas_sgemm, on exactly the GEMMs a model's step needs.
// Timed right next to cleave's steps, it gives the sgemm rate under the same machine load.
class GemmStep {
 public:
  explicit GemmStep(std::vector<GemmShape> shapes) : shapes_(std::move(shapes)) {
    cleave::Rng rng(43);
    for (const GemmShape& s : shapes_) {
      bufs_.push_back({std::vector<float>(static_cast<size_t>(s.m * s.k)), std::vector<float>(static_cast<size_t>(s.k * s.n)),
                       std::vector<float>(static_cast<size_t>(s.m * s.n), 0.f)});
      for (float& v : bufs_.back()[0]) v = rng.uniform(-1, 1);
      for (float& v : bufs_.back()[1]) v = rng.uniform(-1, 1);
    }
  }
  double flops() const {
    double f = 0;
    for (const GemmShape& s : shapes_) f += s.flops();
    return f;
  }
  // Wall seconds of `steps` rounds of all the GEMMs.
  double time(int64_t steps) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < steps; ++i)
      for (size_t j = 0; j < shapes_.size(); ++j) {
        const GemmShape& s = shapes_[j];
        auto& b = bufs_[j];
        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                    static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, b[0].data(),
                    static_cast<int>(s.ta ? s.m : s.k), b[1].data(), static_cast<int>(s.tb ? s.k : s.n), 0.0f,
                    b[2].data(), static_cast<int>(s.n));
      }
    return seconds_since(t0);
  }

 private:
  std::vector<GemmShape> shapes_;
  std::vector<std::array<std::vector<float>, 3>> bufs_;  // A, B, C per shape
};

// ---------------------------------------------------------------------------------------------
// cleave's training step

// cleave's side: a device this run owns plus the shared synthetic training loop.
class CleaveRun {
 public:
  CleaveRun(std::unique_ptr<cleave::Device> device, const cleave::ModelSpec& spec, int64_t batch, uint64_t seed)
      : device_(std::move(device)), training_(*device_, spec, batch, seed) {}
  cleave::Device& device() { return *device_; }
  double step() { return training_.step(); }
  double time(int64_t steps) { return training_.time(steps); }

 private:
  std::unique_ptr<cleave::Device> device_;
  cleave::bench::SyntheticTraining training_;
};

// ---------------------------------------------------------------------------------------------
// the PyTorch side: one torch_train_step.py --serve process, one JSON line per request

class TorchProcess {
 public:
  ~TorchProcess() { stop(); }

  // Starts the server and reads its hello; on failure returns false and sets error().
  bool start(const std::string& python, const std::string& script) {
    if (access(script.c_str(), R_OK) != 0) {
      error_ = "cannot read " + script;
      return false;
    }
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
      error_ = std::string("pipe: ") + std::strerror(errno);
      return false;
    }
    pid_ = fork();
    if (pid_ < 0) {
      error_ = std::string("fork: ") + std::strerror(errno);
      return false;
    }
    if (pid_ == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      close(to_child[0]);
      close(to_child[1]);
      close(from_child[0]);
      close(from_child[1]);
      execlp(python.c_str(), python.c_str(), script.c_str(), "--serve", static_cast<char*>(nullptr));
      std::fprintf(stderr, "bench_train_step: cannot run %s: %s\n", python.c_str(), std::strerror(errno));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    fcntl(to_child[1], F_SETFD, FD_CLOEXEC);
    fcntl(from_child[0], F_SETFD, FD_CLOEXEC);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
    if (!in_ || !out_) {
      error_ = "fdopen failed";
      return false;
    }
    auto hello = read_answer();
    if (!hello) {
      error_ = "could not start '" + python + " " + script + " --serve'" + (error_.empty() ? "" : ": " + error_);
      return false;
    }
    if (!hello->value("ok", false)) {
      error_ = hello->value("error", std::string("unknown error"));
      return false;
    }
    version_ = hello->value("torch", std::string("?"));
    return true;
  }

  const std::string& error() const { return error_; }
  const std::string& version() const { return version_; }

  // Sends one request; returns the answer, or nullopt (and error()) when the process is gone.
  std::optional<json> request(const json& req) {
    if (!in_) return std::nullopt;
    const std::string line = req.dump() + "\n";
    if (std::fputs(line.c_str(), in_) < 0 || std::fflush(in_) != 0) {
      error_ = "the PyTorch process went away";
      return std::nullopt;
    }
    return read_answer();
  }

  void stop() {
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
    in_ = out_ = nullptr;
    if (pid_ > 0) {
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

 private:
  std::optional<json> read_answer() {
    char* line = nullptr;
    size_t cap = 0;
    const ssize_t n = getline(&line, &cap, out_);
    std::string text = n > 0 ? std::string(line, static_cast<size_t>(n)) : std::string();
    std::free(line);
    if (n <= 0) {
      error_ = "the PyTorch process exited";
      return std::nullopt;
    }
    try {
      return json::parse(text);
    } catch (const json::exception&) {
      error_ = "unexpected output from the PyTorch process: " + text;
      return std::nullopt;
    }
  }

  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  std::string error_, version_;
};

// ---------------------------------------------------------------------------------------------
// profile: where one step's time goes, op by op

json profile_steps(const cleave::ModelSpec& spec, int64_t batch, int threads, uint64_t seed, int64_t steps) {
  cleave::DeviceOptions dopts;
  dopts.threads = threads;
  auto prof = std::make_unique<cleave::bench::ProfilingDevice>(cleave::open_device("cpu", dopts));
  cleave::bench::ProfilingDevice* p = prof.get();
  CleaveRun run(std::move(prof), spec, batch, seed);
  run.time(2);
  p->reset();
  const double total = run.time(steps);
  std::vector<std::pair<std::string, cleave::bench::OpTime>> ops(p->times().begin(), p->times().end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  json out = {{"model", spec.name}, {"threads", threads}, {"steps", steps},
              {"ms_per_step", total / static_cast<double>(steps) * 1e3}, {"ops", json::array()}};
  double in_ops = 0;
  std::printf("\nprofile: %s, batch %lld, %d thread%s: %.2f ms per step\n", spec.name.c_str(),
              static_cast<long long>(batch), threads, threads == 1 ? "" : "s", total / static_cast<double>(steps) * 1e3);
  std::printf("  %-28s %10s %8s %7s\n", "op", "ms/step", "calls", "share");
  for (const auto& [name, t] : ops) {
    const double ms = t.seconds / static_cast<double>(steps) * 1e3;
    in_ops += t.seconds;
    std::printf("  %-28s %10.3f %8.1f %6.1f%%\n", name.c_str(), ms,
                static_cast<double>(t.calls) / static_cast<double>(steps), 100.0 * t.seconds / total);
    out["ops"].push_back({{"op", name}, {"ms_per_step", ms},
                          {"calls_per_step", static_cast<double>(t.calls) / static_cast<double>(steps)}});
  }
  std::printf("  %-28s %10.3f %8s %6.1f%%\n", "(outside device ops)", (total - in_ops) / static_cast<double>(steps) * 1e3,
              "", 100.0 * (total - in_ops) / total);
  out["outside_ops_ms_per_step"] = (total - in_ops) / static_cast<double>(steps) * 1e3;
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// What the bench ran on, printed and for the JSON.
json machine_report() {
  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  const char* env_l2 = std::getenv("OPENBLAS_L2_SIZE");
  const std::vector<double> load = bench::load_averages();
  std::printf("bench_train_step: %d cores, OpenBLAS %s (core %s)%s%s, load average %.2f\n", bench::online_cores(),
              openblas_get_config(), openblas_get_corename(), env_core ? ", OPENBLAS_CORETYPE=" : "",
              env_core ? env_core : "", load.empty() ? 0.0 : load[0]);
  return {{"cores", bench::online_cores()},
          {"load_average_start", load},
          {"openblas_config", openblas_get_config()},
          {"openblas_core", openblas_get_corename()},
          {"OPENBLAS_CORETYPE", env_core ? env_core : ""},
          {"OPENBLAS_L2_SIZE", env_l2 ? env_l2 : ""}};
}

// The distinct GEMMs of the all-linear (MLP-like) models, for the "same
// GEMMs" sgemm rate: conv GEMMs depend on im2col, so other models have none.
std::vector<GemmShape> model_gemm_shapes(const std::vector<bench::ModelRun>& models,
                                         const std::map<std::string, FlopCount>& flops) {
  std::vector<GemmShape> shapes;
  for (const bench::ModelRun& m : models) {
    const FlopCount& fc = flops.at(m.name + ":" + std::to_string(m.batch));
    if (!fc.all_linear()) continue;
    for (const GemmShape& g : fc.linear_gemms)
      if (std::find_if(shapes.begin(), shapes.end(), [&](const GemmShape& s) { return !(s < g) && !(g < s); }) ==
          shapes.end())
        shapes.push_back(g);
  }
  return shapes;
}

// Repetitions of each sgemm shape (each Options::gemm_seconds long; docs/benchmarks.md
// says "median GFLOP/s of 3"), independent of --reps.
constexpr int kGemmReps = 3;

// sgemm at `threads` on each shape: median GFLOP/s by label, printed, and the JSON.
json measure_sgemm_rates(int threads, const std::vector<GemmShape>& shapes, const Options& opt,
                         std::map<std::string, double>& rate) {
  openblas_set_num_threads(threads);
  json sj = {{"threads", threads}, {"shapes", json::array()}};
  std::printf("\nsgemm, %d thread%s (median GFLOP/s of %d):\n", threads, threads == 1 ? "" : "s", kGemmReps);
  for (const GemmShape& g : shapes) {
    GemmRate r = measure_sgemm(g, kGemmReps, opt.gemm_seconds);
    rate[g.label()] = r.median_gflops();
    std::printf("  %-22s %8.1f\n", g.label().c_str(), r.median_gflops());
    sj["shapes"].push_back({{"gemm", g.label()}, {"gflops", r.gflops}, {"median_gflops", r.median_gflops()}});
  }
  return sj;
}

// --steps, or (0) enough steps for --seconds over all repetitions.
int64_t steps_per_rep(CleaveRun& run, const Options& opt) {
  if (opt.steps != 0) return opt.steps;
  int64_t n = 0;
  const auto t0 = Clock::now();
  do {
    run.step();
    ++n;
  } while (seconds_since(t0) < 0.3 || n < 2);
  const double per_step = seconds_since(t0) / static_cast<double>(n);
  return std::clamp<int64_t>(static_cast<int64_t>(opt.seconds / opt.reps / per_step + 0.5), 2, 1000000);
}

struct Row {
  std::string model;
  int threads;
  int64_t batch, steps;
  double cleave, torch, gflops, frac_square, frac_shapes;
};

// One model at one thread count: cleave, sgemm on its GEMMs, PyTorch, the
// repetitions interleaved; `torch` off from the first failure on.
struct ModelMeasurement {
  std::vector<double> cleave, torch, gemm_gflops, fractions;
  std::string torch_error;
};

// PyTorch's samples/s for one repetition, or nothing (the error kept).
void torch_repetition(TorchProcess& torch, bool& have_torch, const json& req, ModelMeasurement& mm) {
  auto ans = torch.request(req);
  if (!ans) {
    mm.torch_error = torch.error();
    have_torch = false;
  } else if (!ans->value("ok", false)) {
    mm.torch_error = ans->value("error", std::string("unknown error"));
  } else {
    mm.torch.push_back(ans->value("samples_per_sec", 0.0));
  }
}

ModelMeasurement measure_model(CleaveRun& run, const bench::ModelRun& m, const FlopCount& fc, int threads,
                               int64_t steps, const Options& opt, TorchProcess& torch, bool& have_torch) {
  ModelMeasurement mm;
  std::unique_ptr<GemmStep> gemm_step;
  if (fc.all_linear()) gemm_step = std::make_unique<GemmStep>(fc.linear_gemms);
  for (int rep = 0; rep < opt.reps; ++rep) {
    run.time(1);  // re-warm after the other framework ran
    const double c_secs = run.time(steps);
    mm.cleave.push_back(static_cast<double>(steps * m.batch) / c_secs);
    if (gemm_step) {  // the same GEMMs through sgemm alone, right after: same load
      gemm_step->time(1);
      const double g_secs = gemm_step->time(steps);
      mm.gemm_gflops.push_back(gemm_step->flops() * static_cast<double>(steps) / g_secs * 1e-9);
      mm.fractions.push_back(g_secs / c_secs);
    }
    if (have_torch && mm.torch_error.empty())
      torch_repetition(torch, have_torch,
                       {{"model", opt.models_dir + "/" + m.name + ".json"},
                        {"batch", m.batch},
                        {"threads", threads},
                        {"steps", steps},
                        {"warmup", rep == 0 ? opt.warmup : 1},
                        {"seed", opt.seed}},
                       mm);
  }
  if (!mm.torch_error.empty()) std::printf("note: PyTorch failed on %s: %s\n", m.name.c_str(), mm.torch_error.c_str());
  return mm;
}

// The JSON of one row, with every repetition.
json row_json(const Row& row, const ModelMeasurement& mm, const FlopCount& fc, double square_rate, int reps) {
  json rj = {{"model", row.model},
             {"batch", row.batch},
             {"threads", row.threads},
             {"steps_per_rep", row.steps},
             {"reps", reps},
             {"cleave_samples_per_sec", mm.cleave},
             {"cleave_median_samples_per_sec", row.cleave},
             {"gemm_flops_per_step_required", fc.required},
             {"gemm_flops_per_step_executed", fc.executed},
             {"cleave_gflops", row.gflops},
             {"sgemm_square_1024_gflops", square_rate},
             {"fraction_of_sgemm_square", row.frac_square}};
  if (fc.all_linear()) {
    rj["sgemm_same_gemms_gflops"] = mm.gemm_gflops;
    rj["sgemm_same_gemms_median_gflops"] = bench::median(mm.gemm_gflops);
    rj["fractions_of_sgemm_same_gemms"] = mm.fractions;
    rj["fraction_of_sgemm_same_gemms"] = row.frac_shapes;
  }
  if (!mm.torch.empty()) {
    rj["torch_samples_per_sec"] = mm.torch;
    rj["torch_median_samples_per_sec"] = row.torch;
    rj["cleave_over_torch"] = row.cleave / row.torch;
  } else {
    rj["torch_median_samples_per_sec"] = nullptr;
    if (!mm.torch_error.empty()) rj["torch_error"] = mm.torch_error;
  }
  return rj;
}

void print_table(const std::vector<Row>& rows) {
  std::printf("\n%-5s %7s %5s %14s %14s %8s %9s %12s %12s\n", "model", "threads", "batch", "cleave samp/s",
              "torch samp/s", "ratio", "GFLOP/s", "%sgemm1024", "%sgemm-same");
  for (const Row& r : rows) {
    const bool t = r.torch > 0;
    std::printf("%-5s %7d %5lld %14.0f %14s %8s %9.1f %11.1f%% %12s\n", r.model.c_str(), r.threads,
                static_cast<long long>(r.batch), r.cleave, t ? fmt("%.0f", r.torch).c_str() : "-",
                t ? fmt("%.2f", r.cleave / r.torch).c_str() : "-", r.gflops, 100 * r.frac_square,
                r.frac_shapes > 0 ? fmt("%.1f%%", 100 * r.frac_shapes).c_str() : "-");
  }
  std::printf("ratio = cleave / torch (medians); GFLOP/s counts the GEMM FLOPs a step needs; %%sgemm1024 = that\n"
              "rate over cblas_sgemm 1024^3 at the same thread count; %%sgemm-same = time of cblas_sgemm alone on\n"
              "exactly the model's GEMMs over cleave's step time, each repetition right after cleave's\n"
              "(median; MLP only).\n");
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  const Options opt = parse_options(argc, argv);
  signal(SIGPIPE, SIG_IGN);  // a dead PyTorch process must not kill the bench
  const auto t_start = Clock::now();

  std::map<std::string, cleave::ModelSpec> specs;
  std::map<std::string, FlopCount> flops;  // by "name:batch"
  for (const bench::ModelRun& m : opt.models) {
    try {
      if (!specs.count(m.name)) specs[m.name] = cleave::ModelSpec::load(opt.models_dir + "/" + m.name + ".json");
    } catch (const std::exception& e) {
      std::cerr << "bench_train_step: " << e.what() << " (use --models-dir)\n";
      return 1;
    }
    try {
      flops[m.name + ":" + std::to_string(m.batch)] = count_flops(specs.at(m.name), m.batch);
    } catch (const std::exception& e) {
      std::cerr << "bench_train_step: cannot count the FLOPs of " << m.name << " at batch " << m.batch << ": "
                << e.what() << "\n";
      return 1;
    }
  }

  json report;
  report["machine"] = machine_report();
  report["settings"] = {{"threads", opt.threads}, {"reps", opt.reps},     {"warmup", opt.warmup},
                        {"seconds", opt.seconds}, {"steps", opt.steps},   {"seed", opt.seed},
                        {"optimizer", "adam lr 1e-3"}};

  TorchProcess torch;
  bool have_torch = false;
  if (opt.torch) {
    have_torch = torch.start(opt.python, opt.torch_script);
    if (have_torch)
      std::printf("PyTorch %s via %s\n", torch.version().c_str(), opt.torch_script.c_str());
    else
      std::printf("note: skipping the PyTorch comparison: %s\n", torch.error().c_str());
  } else {
    std::printf("note: PyTorch comparison off (--no-torch)\n");
  }
  report["torch"] = have_torch ? json(torch.version()) : json(nullptr);

  std::vector<GemmShape> gemm_shapes = model_gemm_shapes(opt.models, flops);
  const GemmShape square{false, false, 1024, 1024, 1024};
  gemm_shapes.push_back(square);

  json results = json::array(), sgemm_json = json::array(), profiles = json::array();
  std::vector<Row> rows;
  try {
    for (int threads : opt.threads) {
      std::map<std::string, double> rate;  // label -> median GFLOP/s
      json sj = measure_sgemm_rates(threads, gemm_shapes, opt, rate);
      const double square_rate = rate.at(square.label());
      sj["square_1024_gflops"] = square_rate;
      sgemm_json.push_back(sj);
      for (const bench::ModelRun& m : opt.models) {
        const cleave::ModelSpec& spec = specs.at(m.name);
        const FlopCount& fc = flops.at(m.name + ":" + std::to_string(m.batch));
        cleave::DeviceOptions dopts;
        dopts.threads = threads;
        CleaveRun run(cleave::open_device("cpu", dopts), spec, m.batch, opt.seed);
        run.time(opt.warmup);
        const int64_t steps = steps_per_rep(run, opt);
        const ModelMeasurement mm = measure_model(run, m, fc, threads, steps, opt, torch, have_torch);
        const double c_med = bench::median(mm.cleave), t_med = bench::median(mm.torch);
        const double gflops = c_med / static_cast<double>(m.batch) * fc.required * 1e-9;
        // sgemm alone on exactly the model's GEMMs (interleaved with cleave's repetitions):
        // the fraction is the median over repetitions of (sgemm-only time / cleave step time).
        const Row row{m.name, threads, m.batch, steps, c_med, t_med, gflops, gflops / square_rate,
                      fc.all_linear() ? bench::median(mm.fractions) : 0.0};
        rows.push_back(row);
        results.push_back(row_json(row, mm, fc, square_rate, opt.reps));
        std::printf("%s batch %lld, %d thread%s: cleave %.0f samples/s%s  (%lld steps x %d reps)\n", m.name.c_str(),
                    static_cast<long long>(m.batch), threads, threads == 1 ? "" : "s", c_med,
                    mm.torch.empty() ? "" : (", torch " + fmt("%.0f", t_med) + " samples/s").c_str(),
                    static_cast<long long>(steps), opt.reps);
        if (opt.profile) profiles.push_back(profile_steps(spec, m.batch, threads, opt.seed, std::max<int64_t>(steps, 10)));
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_train_step: " << e.what() << "\n";
    return 1;
  }
  torch.stop();
  print_table(rows);

  report["sgemm"] = sgemm_json;
  report["results"] = results;
  if (opt.profile) report["profile"] = profiles;
  report["machine"]["load_average_end"] = bench::load_averages();
  report["wall_seconds"] = seconds_since(t_start);
  try {
    cleave::write_json_file(opt.json_path, report);
  } catch (const std::exception& e) {
    std::cerr << "bench_train_step: cannot write the results: " << e.what() << "\n";
    return 1;
  }
  std::printf("wrote %s (%.0f s)\n", opt.json_path.c_str(), seconds_since(t_start));
  return 0;
}
