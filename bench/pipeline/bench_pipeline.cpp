// bench_pipeline: pipelined training across local cleaved daemons against
// training in one process and against PyTorch's pipeline
// (torch.distributed.pipelining), for the CNN and the MLP on a Fashion-MNIST
// slice and for gpt-tiny (or any GPT model file) on a text.
//
// Per model, in one run:
//   local 1t        train_local, 1 CPU thread (the baseline of every speed-up)
//   local 2t        train_local, 2 CPU threads
//   local 1t m=M    train_local, 1 thread, M micro-batches of gradient
//                   accumulation (the compute a pipeline does, without a pipeline)
//   pipe pN SCHED   train_pipeline over N local `cleaved` processes (one CPU
//                   thread each, CURVE encryption on, loopback), M micro-batches,
//                   for every --schedule; " rc=all" rows recompute activations
//                   in backward (--recompute all|both)
//   torch pN SCHED  GPT models only: bench/pipeline/torch_pipeline.py, the same
//                   model cut at the same layer boundaries as the cleave row
//                   before it, one gloo process per stage (1 thread each),
//                   PyTorch's ScheduleGPipe / Schedule1F1B /
//                   ScheduleInterleavedZeroBubble (one stage per rank) for
//                   gpipe / 1f1b / zb1; rows say "skipped" without PyTorch.
// GPT models train on a text (default: Debian's fortunes, concatenated) with
// batch 32, AdamW lr 1e-3 (weight decay 0.01), --max-steps steps per run
// (default 24), and report tokens/s = samples/s x context; the others report
// samples/s (batch 64 for the CNN, 128 for the MLP, Adam lr 1e-3, one epoch).
//
// Definitions (all from the daemons' traces, summed per stage as `stage_busy`,
// over the coordinator's training time T = `train_seconds`):
//   compute_s  = forward + backward (B + W) + optimizer seconds of stage s
//   send_s     = send seconds of stage s (encode + encrypt + hand to ZeroMQ)
//   idle_s     = T - compute_s - send_s (waiting in receive, gaps between steps)
//   busy fraction of stage s       = compute_s / T
//   measured bubble                = sum_s idle_s / (p * T)
//   theoretical bubble             = bubble_fraction(schedule, p, M)
//       (core/pipeline/schedule.h): (p-1)/(M+p-1) for gpipe and 1f1b,
//       (p-1)/(3M+p-1) for zb1
//   ideal samples/s                = samples / the time simulate_pipeline
//       (core/pipeline/simulate.h) gives the run's schedule with each stage's
//       measured forward, B and W (or fused backward) and optimizer seconds and
//       free links: what the layer split and the schedule allow.
//   split bubble                   = 1 - sum_s compute_s / (p * that time): the
//       schedule's bubble for this run's stages, their imbalance and W share
//       included (bubble_fraction's theory assumes equal stages).
//   split per step (--trace-dir)   = the median over the run's steps of the
//       same with each step's own per-stage times, from the trace
//       (`bubble_split_per_step`): the stages' relative speed moves from step
//       to step on a shared machine; measured - it is what the pipeline adds.
//   limit          = "model" when the pipeline reaches >= 85% of that ideal
//       (the split of the model's layers is what caps it), else "pipeline"
//   vs torch       = cleave's rate over PyTorch's row of the same stages and
//       schedule, whose rate is the batch over its median step: cleave's
//       whole-run rate / its steady rate (the batch over the median time
//       between consecutive steps, `median_step_seconds` of the run's JSON)
//   cpu s          = CPU seconds (user + system) of this process over the run
//       plus, for pipelines, of the reaped daemons: the work the setup costs,
//       independent of how busy the rest of the machine is.
//   memory         = per stage, the daemon's measured peak device memory
//       (`stages[i].peak_memory_bytes` of the run's JSON) and the memory
//       model's estimate (`estimated_memory_bytes`); rc=all rows also give
//       their peak and batch time relative to the same row without recomputing.
// Every configuration runs --reps times, interleaved (PyTorch's rows among
// cleave's), after a short unmeasured warm-up; each row reports the median of
// its repetitions (the details, such as busy and bubble, of the repetition
// nearest the median) and keeps every repetition in the JSON. The 1-minute load
// average is printed per row.
// Usage: bench_pipeline [--models cnn,mlp,gpt-tiny] [--limit-train 3200] [--limit-test 500]
//        [--epochs 1] [--max-steps N] [--schedule 1f1b|gpipe|zb1|both|all] [--microbatches 8]
//        [--recompute none|all|auto|both] [--stages 1,2,3] [--planner balance|auto]
//        [--json bench-pipeline.json] [--trace-dir DIR] [--reps 2] [--cleaved PATH]
//        [--dataset-dir DIR] [--text FILE] [--python PY] [--no-torch]
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
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

#include "apps/common/processes.h"
#include "bench/common/bench_args.h"
#include "bench/common/python_script.h"
#include "core/data/dataset.h"
#include "core/io/json_file.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/simulate.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"
#include "core/train/train_config.h"
#include "device/cpu/process_env.h"
#include "transport/keys.h"
#include "transport/log.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }

struct BenchOptions {
  std::vector<std::string> models = {"cnn", "mlp"};
  int64_t limit_train = 3200;
  int64_t limit_test = 500;
  int epochs = 1;
  int64_t max_steps = 0;  // 0: 24 for GPT models, the whole --epochs for the others
  std::string schedule = "1f1b";
  std::string planner = "balance";  // balance: exactly p stages; auto: the planner may use fewer
  std::string recompute = "none";   // none | all | auto | both (rows with none and with all)
  int microbatches = 8;
  std::vector<int> stages = {1, 2, 3};
  std::string json_path = "bench-pipeline.json";
  std::string trace_dir;
  std::string cleaved;
  std::string bandwidth_limit;  // each daemon's --bandwidth-limit (its links' throttle), "" for none
  std::string dataset_dir;
  std::string text;  // GPT models' text ("": the fortunes)
  std::string fortunes_dir = cleave::kFortunesDir;
  std::string models_dir = CLEAVE_SOURCE_DIR "/models";
  std::string python;
  bool torch = true;
  std::string torch_script = CLEAVE_SOURCE_DIR "/bench/pipeline/torch_pipeline.py";
  uint64_t seed = 1;
  int reps = 2;
};

// What the bench needs to know of a model file.
struct ModelInfo {
  std::string name;
  bool text = false;    // a byte-level language model (first layer an embedding): trains on --text
  int64_t context = 1;  // tokens per sample (GPT), 1 otherwise
  int64_t batch = 64;
};

ModelInfo model_info(const BenchOptions& o, const std::string& name) {
  std::ifstream in(o.models_dir + "/" + name + ".json");
  const json doc = json::parse(in, nullptr, false);
  if (!doc.is_object() || !doc.contains("layers") || !doc.contains("input"))
    throw std::runtime_error("--models: " + o.models_dir + "/" + name + ".json is not a model file");
  ModelInfo m;
  m.name = name;
  const json& layers = doc.at("layers");
  m.text = !layers.empty() && layers[0].value("type", "") == "embedding";
  m.context = m.text ? doc.at("input").at(0).get<int64_t>() : 1;
  m.batch = m.text ? 32 : name == "mlp" ? 128 : 64;
  return m;
}

// One measured configuration (one repetition, or the median of them).
struct Row {
  std::string model, setup;
  std::string kind;  // local | pipe | torch
  std::string schedule, recompute;
  int stages = 0;  // 0 for single-process runs
  int threads = 1;
  int microbatches = 1;
  int64_t context = 1;  // tokens per sample: rates of GPT rows are tokens/s
  double samples_per_sec = 0;
  double train_seconds = 0;
  double speedup = 0;   // vs local 1 thread of the same model
  double vs_torch = 0;  // vs PyTorch's row of the same model, stages and schedule (0: none)
  // Pipeline rows: the batch over the median time between consecutive steps
  // (the statistic of PyTorch's rows), and that against PyTorch's row.
  double steady_samples_per_sec = 0;
  double vs_torch_steady = 0;
  double accuracy = -1, val_loss = -1;
  std::vector<double> compute, send;  // per stage, seconds
  double bubble_measured = -1, bubble_theoretical = -1;
  double bubble_split = -1;  // the schedule's bubble with this run's measured per-stage compute (take_stage_busy)
  double bubble_split_per_step = -1;  // its median over the steps of the run's trace (--trace-dir; split_per_step)
  double ideal_samples_per_sec = 0;
  double load1 = 0;
  double cpu_self = 0, cpu_daemons = 0;  // CPU seconds of this process / of the daemons over the run
  json plan;
  json prediction;  // planner's predicted vs measured batch time (--planner auto)
  json stage_memory = json::array();  // per stage: layers, recompute, peak / estimated memory bytes
  double recompute_time_ratio = 0, recompute_peak_ratio = 0;  // rc=all rows: vs the same row without
  std::string note;  // why a PyTorch row has no number
  json torch;        // torch_pipeline.py's answer
  std::vector<double> rep_samples_per_sec;  // every repetition (the row is their median)
  json reps = json::array();                // every repetition's measurements
};

using cleave::bench::load_average;
using cleave::bench::median;
using cleave::bench::shell_quote;

// CPU seconds (user + system) of this process or of its reaped children.
double cpu_seconds(int who) {
  rusage u{};
  getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

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

// GPT models: the text, batch 32, AdamW lr 1e-3 with weight decay 0.01 (bench_gpt's),
// --max-steps steps (24 by default); the others: Fashion-MNIST, Adam lr 1e-3.
cleave::TrainConfig base_config(const BenchOptions& o, const ModelInfo& m, const std::string& text) {
  cleave::TrainConfig cfg;
  cfg.model_path = o.models_dir + "/" + m.name + ".json";
  cfg.epochs = o.epochs;
  cfg.batch = m.batch;
  cfg.seed = o.seed;
  cfg.limit_test = o.limit_test;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 1e-3f;
  cfg.backend = "cpu";
  cfg.progress = false;
  cfg.max_steps = o.max_steps > 0 ? o.max_steps : -1;
  if (m.text) {
    cfg.text_path = text;
    cfg.limit_test = 32;
    cfg.optimizer.kind = "adamw";
    cfg.optimizer.weight_decay = 0.01f;
    cfg.epochs = 1000;  // --max-steps ends the run
    cfg.max_steps = o.max_steps > 0 ? o.max_steps : 24;
  } else {
    cfg.dataset_dir = o.dataset_dir;
    cfg.limit_train = o.limit_train;
  }
  return cfg;
}

// The fields every row takes from a training result.
void take_result(Row& row, const json& r) {
  row.samples_per_sec = r.at("samples_per_sec").get<double>();
  row.accuracy = r.value("test_accuracy", -1.0);
  row.val_loss = r.value("val_loss", -1.0);
}

Row run_local(const BenchOptions& o, const ModelInfo& m, const std::string& text, int threads, int microbatches) {
  cleave::TrainConfig cfg = base_config(o, m, text);
  cfg.threads = threads;
  cfg.microbatches = microbatches;
  const double cpu0 = cpu_seconds(RUSAGE_SELF);
  json r = cleave::train_local(cfg);
  const double cpu1 = cpu_seconds(RUSAGE_SELF);
  Row row;
  row.model = m.name;
  row.kind = "local";
  row.setup = "local " + std::to_string(threads) + "t" + (microbatches > 1 ? " m=" + std::to_string(microbatches) : "");
  row.threads = threads;
  row.microbatches = microbatches;
  row.context = m.context;
  take_result(row, r);
  for (const auto& e : r.at("epoch_stats")) row.train_seconds += e.at("seconds").get<double>();
  row.cpu_self = cpu1 - cpu0;
  row.load1 = load_average();
  return row;
}

// Adds `seconds` of the trace slices named `name` to a stage's times: per
// micro-batch (of `microbatches`) for the passes, per batch for the optimizer
// step; zb1's backward is two slices, B (input gradient) and W (weight
// gradient), gpipe's and 1f1b's one, `backward`. Other slices are not compute.
void add_slice(cleave::StageTimes& t, const std::string& name, double seconds, double microbatches) {
  if (name == "forward") t.forward += seconds / microbatches;
  if (name == "backward" || name == "B") t.backward_input += seconds / microbatches;
  if (name == "W") t.backward_weight += seconds / microbatches;
  if (name == "optimizer") t.optimizer += seconds;
}

// Busy, send, bubble and the ideal rate from a pipeline run's `stage_busy`.
// The ideal is the run's schedule with its stages' measured compute and free
// links: simulate_pipeline (core/pipeline/simulate.h) runs the action lists
// with each stage's forward, B, W (or fused backward) and optimizer seconds of
// the whole run, as if it were one batch of M micro-batches (the times scale
// together, so the bubble is a batch's), so that `bubble_split` is the bubble
// the schedule allows for this run's cut, its stages' imbalance included.
void take_stage_busy(Row& row, const json& r) {
  const double T = std::max(1e-9, row.train_seconds);
  const double mb = std::max(1, row.microbatches);
  double idle = 0, sum_compute = 0;
  std::vector<cleave::StageTimes> times;
  for (const auto& st : r.at("stage_busy")) {
    const auto& b = st.at("busy_seconds");
    auto get = [&](const char* k) { return b.contains(k) ? b.at(k).get<double>() : 0.0; };
    times.emplace_back();
    for (const auto& [name, seconds] : b.items()) add_slice(times.back(), name, seconds.get<double>(), mb);
    const double c = get("forward") + get("backward") + get("B") + get("W") + get("optimizer");
    const double s = get("send");
    row.compute.push_back(c);
    row.send.push_back(s);
    idle += std::max(0.0, T - c - s);
    sum_compute += c;
  }
  const int p = std::max<int>(1, static_cast<int>(row.compute.size()));
  const cleave::ScheduleKind kind = cleave::parse_schedule(row.schedule);
  row.bubble_measured = idle / (static_cast<double>(p) * T);
  row.bubble_theoretical = cleave::bubble_fraction(kind, p, row.microbatches);
  if (times.empty()) return;
  const cleave::SimulatedPipeline ideal = cleave::simulate_pipeline(kind, static_cast<int>(mb), times);
  const double samples = row.samples_per_sec * row.train_seconds;
  row.ideal_samples_per_sec = samples / std::max(1e-9, ideal.batch_seconds);
  row.bubble_split = 1 - sum_compute / (static_cast<double>(p) * std::max(1e-9, ideal.batch_seconds));
}

// The median over a run's steps (its first, the warm-up, left out) of the
// bubble simulate_pipeline gives each step's own per-stage forward, B, W and
// optimizer seconds, read from the run's Chrome trace: on a shared machine the
// stages' relative speed moves from step to step, which the whole run's totals
// (`bubble_split`) average away. -1 without a readable trace.
double split_per_step(const std::string& trace_path, cleave::ScheduleKind kind, int microbatches) {
  std::ifstream in(trace_path);
  const json trace = in ? json::parse(in, nullptr, false) : json();
  if (trace.is_discarded() || !trace.is_object() || !trace.contains("traceEvents")) return -1;
  std::map<int64_t, std::map<int, cleave::StageTimes>> steps;  // step -> stage -> its times
  const double mb = std::max(1, microbatches);
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || !e.contains("args")) continue;
    add_slice(steps[e.at("args").value("step", int64_t{-1})][e.value("tid", 0)], e.value("name", ""),
              e.value("dur", 0.0) * 1e-6, mb);
  }
  size_t p = 0;
  for (const auto& [step, stages] : steps) p = std::max(p, stages.size());
  std::vector<double> bubbles;
  for (const auto& [step, stages] : steps) {
    if (step < 1 || stages.size() != p) continue;  // the warm-up, or a step some stage's trace lacks
    std::vector<cleave::StageTimes> times;
    for (const auto& [stage, t] : stages) times.push_back(t);
    bubbles.push_back(cleave::simulate_pipeline(kind, std::max(1, microbatches), times).bubble);
  }
  return bubbles.empty() ? -1 : median(bubbles);
}

// The cluster options of one pipeline run over daemons keyed in `dir`.
cleave::ClusterOptions pipeline_options(const BenchOptions& o, const std::string& dir, int stages,
                                        const std::string& schedule, const std::string& recompute,
                                        const std::string& model) {
  cleave::ClusterOptions cl;
  cl.devices = stages;
  cl.key_path = dir + "/coordinator.key";
  cl.allow_path = dir + "/allow";
  cl.listen = "tcp://127.0.0.1:*";
  cl.schedule = schedule;
  cl.planner = o.planner;
  cl.recompute = recompute;
  cl.shutdown_daemons = true;
  cl.register_timeout_ms = 60000;
  cl.interrupted = [] { return g_interrupted.load(); };
  if (!o.trace_dir.empty())
    cl.trace_path = o.trace_dir + "/" + model + "-p" + std::to_string(stages) + "-" + schedule +
                    (recompute == "none" ? "" : "-rc" + recompute) + ".json";
  return cl;
}

Row run_pipeline(const BenchOptions& o, const ModelInfo& m, const std::string& text, int stages,
                 const std::string& schedule, const std::string& recompute, const std::string& cleaved) {
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
    cleave::TrainConfig cfg = base_config(o, m, text);
    cfg.microbatches = o.microbatches;
    cfg.threads = 1;
    cleave::ClusterOptions cl = pipeline_options(o, dir, stages, schedule, recompute, m.name);
    cl.on_listening = [&](const std::string& endpoint) {
      for (int i = 1; i <= stages; ++i) {
        const std::string name = "dev" + std::to_string(i);
        std::vector<std::string> argv = {cleaved, "--coordinator", endpoint, "--key", dir + "/" + name + ".key",
                                         "--coordinator-key", dir + "/coordinator.pub", "--name", name, "--backend",
                                         "cpu", "--threads", "1", "--max-jobs", "1"};
        if (!o.bandwidth_limit.empty()) argv.insert(argv.end(), {"--bandwidth-limit", o.bandwidth_limit});
        daemons.push_back(cleave::spawn(argv, dir + "/" + name + ".log"));
      }
    };
    json r;
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
    row.model = m.name;
    row.kind = "pipe";
    row.schedule = schedule;
    row.recompute = recompute;
    row.setup = "pipe p" + std::to_string(stages) + " " + schedule + (recompute == "none" ? "" : " rc=" + recompute);
    row.stages = stages;
    row.microbatches = o.microbatches;
    row.context = m.context;
    take_result(row, r);
    row.train_seconds = r.at("train_seconds").get<double>();
    row.steady_samples_per_sec = static_cast<double>(m.batch) / std::max(1e-9, r.at("median_step_seconds").get<double>());
    row.plan = r.at("plan");
    if (r.contains("stages")) row.stage_memory = r.at("stages");
    if (r.contains("prediction")) {
      row.prediction = r.at("prediction");
      // How much slower each daemon computed beside the others (measured while profiling; absent: not measured).
      const json profile = r.value("cluster_profile", json::object());
      json contention = json::array();
      for (const auto& d : profile.value("devices", json::array())) contention.push_back(d.value("host_contention", json()));
      row.prediction["host_contention"] = contention;
      // The links the planner costed (mbps, latency_ms, cpu_mbps where a throttle set it).
      row.prediction["links"] = profile.value("links", json::array());
    }
    take_stage_busy(row, r);
    if (!cl.trace_path.empty())
      row.bubble_split_per_step = split_per_step(cl.trace_path, cleave::parse_schedule(schedule), o.microbatches);
    row.load1 = load_average();
    return row;
  } catch (...) {
    cleanup();
    throw;
  }
}

// The layer ranges of a cleave run's stages, as torch_pipeline.py's --cut ("0:4,4:8").
std::string cut_of(const Row& pipe) {
  std::string cut;
  for (const auto& st : pipe.stage_memory) {
    const auto& l = st.at("layers");
    cut += (cut.empty() ? "" : ",") + std::to_string(l.at(0).get<int>()) + ":" + std::to_string(l.at(1).get<int>());
  }
  return cut;
}

// PyTorch's pipeline of the same model and cut as the cleave row `pipe`; a row
// with a note instead of a number when PyTorch is missing or its run fails.
Row run_torch(const BenchOptions& o, const ModelInfo& m, const std::string& text, const Row& pipe,
              const cleave::bench::TorchPython& torch) {
  Row row;
  row.model = m.name;
  row.kind = "torch";
  row.schedule = pipe.schedule;
  row.recompute = "none";
  row.stages = pipe.stages;  // the daemons; the cut has the plan's stages (fewer under --planner auto)
  row.setup = "torch p" + std::to_string(row.stages) + " " + pipe.schedule;
  row.microbatches = o.microbatches;
  row.context = m.context;
  if (!torch.available()) {
    row.note = "skipped: " + torch.missing();
    return row;
  }
  const int64_t steps = o.max_steps > 0 ? o.max_steps : 24;
  const std::string args = "--model " + shell_quote(o.models_dir + "/" + m.name + ".json") + " --text " +
                           shell_quote(text) + " --cut " + cut_of(pipe) + " --schedule " + pipe.schedule +
                           " --microbatches " + std::to_string(o.microbatches) + " --batch " +
                           std::to_string(m.batch) + " --steps " + std::to_string(steps) +
                           " --warmup 3 --lr 0.001 --seed " + std::to_string(o.seed);
  const double children0 = cpu_seconds(RUSAGE_CHILDREN);
  try {
    row.torch = torch.run(o.torch_script, args);
    row.samples_per_sec = row.torch.at("tokens_per_sec").get<double>() / static_cast<double>(m.context);
    row.train_seconds = 0;
    for (const auto& s : row.torch.at("step_seconds")) row.train_seconds += s.get<double>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    row.note = "failed (see stderr)";
  }
  row.cpu_daemons = cpu_seconds(RUSAGE_CHILDREN) - children0;
  row.load1 = load_average();
  return row;
}

// One repetition's measurements, for the JSON.
json rep_json(const Row& r) {
  json j = {{"samples_per_sec", r.samples_per_sec}, {"train_seconds", r.train_seconds},
            {"load_average_1min", r.load1}, {"cpu_seconds_coordinator_or_local", r.cpu_self},
            {"cpu_seconds_daemons", r.cpu_daemons}};
  if (r.context > 1) j["tokens_per_sec"] = r.samples_per_sec * static_cast<double>(r.context);
  if (r.kind == "pipe") {
    j["steady_samples_per_sec"] = r.steady_samples_per_sec;
    j["stage_compute_seconds"] = r.compute;
    j["stage_send_seconds"] = r.send;
    j["bubble_measured"] = r.bubble_measured;
    j["bubble_split"] = r.bubble_split;
    if (r.bubble_split_per_step >= 0) j["bubble_split_per_step"] = r.bubble_split_per_step;
    j["stages"] = r.stage_memory;
    if (!r.prediction.is_null()) j["prediction"] = r.prediction;
  }
  if (!r.torch.is_null()) j["torch"] = r.torch;
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

// The repetitions of one configuration as one row: the median rate, the other
// measurements those of the repetition nearest it, every repetition kept.
Row median_row(const std::vector<Row>& reps) {
  std::vector<double> rates;
  for (const Row& r : reps) rates.push_back(r.samples_per_sec);
  const double med = median(rates);
  size_t nearest = 0;
  for (size_t i = 1; i < reps.size(); ++i)
    if (std::fabs(reps[i].samples_per_sec - med) < std::fabs(reps[nearest].samples_per_sec - med)) nearest = i;
  Row row = reps[nearest];
  row.samples_per_sec = med;
  row.rep_samples_per_sec = rates;
  std::vector<double> steady;
  for (const Row& r : reps) steady.push_back(r.steady_samples_per_sec);
  row.steady_samples_per_sec = median(steady);
  row.reps = json::array();
  for (const Row& r : reps) row.reps.push_back(rep_json(r));
  return row;
}

double max_peak(const Row& r) {
  double peak = 0;
  for (const auto& st : r.stage_memory) peak = std::max(peak, st.value("peak_memory_bytes", 0.0));
  return peak;
}

// Speed-ups against local 1t, PyTorch's same schedule and (rc=all rows) the same run without recomputing.
void compare_rows(std::vector<Row>& rows) {
  auto find = [&](const Row& like, const std::string& kind, const std::string& recompute) -> const Row* {
    for (const Row& r : rows)
      if (r.model == like.model && r.kind == kind && r.stages == like.stages && r.schedule == like.schedule &&
          r.recompute == recompute && r.samples_per_sec > 0)
        return &r;
    return nullptr;
  };
  std::map<std::string, double> baseline;
  for (const Row& r : rows)
    if (r.kind == "local" && r.threads == 1 && r.microbatches == 1) baseline[r.model] = r.samples_per_sec;
  for (Row& r : rows) {
    r.speedup = r.samples_per_sec / std::max(1e-9, baseline[r.model]);
    if (r.kind != "pipe") continue;
    if (r.recompute == "none")
      if (const Row* t = find(r, "torch", "none")) {
        r.vs_torch = r.samples_per_sec / t->samples_per_sec;
        r.vs_torch_steady = r.steady_samples_per_sec / t->samples_per_sec;
      }
    if (r.recompute != "none")
      if (const Row* n = find(r, "pipe", "none")) {
        r.recompute_time_ratio = n->samples_per_sec / std::max(1e-9, r.samples_per_sec);
        r.recompute_peak_ratio = max_peak(*n) > 0 ? max_peak(r) / max_peak(*n) : 0;
      }
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

// Which caps a pipeline row: the model's split (the row is within 85% of what
// its measured per-stage compute allows) or the pipeline.
std::string limit_of(const Row& r, double baseline) {
  if (r.kind != "pipe" || r.stages < 2 || r.ideal_samples_per_sec <= 0) return "";
  char s[96];
  const double of_ideal = r.samples_per_sec / r.ideal_samples_per_sec;
  if (of_ideal >= 0.85)
    std::snprintf(s, sizeof s, "model (its split allows %.2fx)", r.ideal_samples_per_sec / std::max(1e-9, baseline));
  else
    std::snprintf(s, sizeof s, "pipeline (%.0f%% of the split's %.2fx)", 100 * of_ideal,
                  r.ideal_samples_per_sec / std::max(1e-9, baseline));
  return s;
}

json to_json(const Row& r) {
  json j = {{"model", r.model},
            {"setup", r.setup},
            {"kind", r.kind},
            {"schedule", r.schedule},
            {"recompute", r.recompute},
            {"stages", r.stages},
            {"microbatches", r.microbatches},
            {"samples_per_sec", r.samples_per_sec},
            {"speedup_vs_local_1t", r.speedup},
            {"train_seconds", r.train_seconds},
            {"test_accuracy", r.accuracy},
            {"load_average_1min", r.load1},
            {"samples_per_sec_each_rep", r.rep_samples_per_sec},
            {"reps", r.reps},
            {"cpu_seconds_coordinator_or_local", r.cpu_self},
            {"cpu_seconds_daemons", r.cpu_daemons}};
  if (r.context > 1) {
    j["context"] = r.context;
    j["tokens_per_sec"] = r.samples_per_sec * static_cast<double>(r.context);
    j["val_loss"] = r.val_loss;
  }
  if (!r.note.empty()) j["note"] = r.note;
  if (r.kind != "pipe") return j;
  j["stage_compute_seconds"] = r.compute;
  j["stage_send_seconds"] = r.send;
  std::vector<double> frac;
  for (double c : r.compute) frac.push_back(c / std::max(1e-9, r.train_seconds));
  j["stage_compute_fraction"] = frac;
  j["bubble_measured"] = r.bubble_measured;
  j["bubble_theoretical"] = r.bubble_theoretical;
  j["bubble_split"] = r.bubble_split;
  if (r.bubble_split_per_step >= 0) j["bubble_split_per_step"] = r.bubble_split_per_step;
  j["ideal_samples_per_sec"] = r.ideal_samples_per_sec;
  j["plan"] = r.plan;
  j["stage_memory"] = r.stage_memory;
  j["steady_samples_per_sec"] = r.steady_samples_per_sec;
  if (r.vs_torch > 0) j["speedup_vs_torch_same_schedule"] = r.vs_torch;
  if (r.vs_torch_steady > 0) j["speedup_vs_torch_steady"] = r.vs_torch_steady;
  if (r.recompute_time_ratio > 0) j["recompute_time_ratio"] = r.recompute_time_ratio;
  if (r.recompute_peak_ratio > 0) j["recompute_peak_memory_ratio"] = r.recompute_peak_ratio;
  if (!r.prediction.is_null()) j["prediction"] = r.prediction;
  return j;
}

void print_header() {
  std::printf("%-8s %-20s %9s %-5s %8s %9s %-15s %-15s %6s %6s %6s %9s %9s %6s %6s %5s %s\n", "model", "setup", "rate",
              "unit", "speed-up", "vs torch", "busy(compute)", "send", "bubble", "theory", "split", "ideal", "meas/pred",
              "cpu s", "acc", "load", "limit");
}

void print_row(const Row& r, double baseline) {
  char bubble[16] = "-", theory[16] = "-", split[16] = "-", ideal[16] = "-", vs[16] = "-", pred[16] = "-", acc[16] = "-";
  const double scale = static_cast<double>(r.context);
  if (r.kind == "pipe") {
    std::snprintf(bubble, sizeof bubble, "%.2f", r.bubble_measured);
    std::snprintf(theory, sizeof theory, "%.2f", r.bubble_theoretical);
    std::snprintf(split, sizeof split, "%.2f", r.bubble_split);
    std::snprintf(ideal, sizeof ideal, "%.0f", r.ideal_samples_per_sec * scale);
  }
  if (r.vs_torch > 0) std::snprintf(vs, sizeof vs, "%.2f/%.2f", r.vs_torch, r.vs_torch_steady);
  if (!r.prediction.is_null()) std::snprintf(pred, sizeof pred, "%.2f", r.prediction.value("measured_over_predicted", 0.0));
  if (r.context > 1 && r.val_loss >= 0) std::snprintf(acc, sizeof acc, "%.2f", r.val_loss);
  else if (r.context == 1 && r.accuracy >= 0) std::snprintf(acc, sizeof acc, "%.3f", r.accuracy);
  if (r.kind == "torch" && r.samples_per_sec <= 0) {
    std::printf("%-8s %-20s %9s %-5s  %s\n", r.model.c_str(), r.setup.c_str(), "-", r.context > 1 ? "tok/s" : "smp/s",
                r.note.c_str());
    return;
  }
  std::printf("%-8s %-20s %9.0f %-5s %7.2fx %9s %-15s %-15s %6s %6s %6s %9s %9s %6.1f %6s %5.1f %s\n", r.model.c_str(),
              r.setup.c_str(), r.samples_per_sec * scale, r.context > 1 ? "tok/s" : "smp/s", r.speedup, vs,
              fractions(r.compute, r.train_seconds).c_str(), fractions(r.send, r.train_seconds).c_str(), bubble, theory,
              split, ideal, pred, r.cpu_self + r.cpu_daemons, acc, r.load1, limit_of(r, baseline).c_str());
}

// Per pipeline row: each stage's measured peak and estimated memory, and what recomputing costs and saves.
void print_memory(const std::vector<Row>& rows) {
  std::printf("\nstage memory (MB, measured peak / estimated, per stage); rc rows: peak and batch time vs rc=none\n");
  for (const Row& r : rows) {
    if (r.kind != "pipe") continue;
    std::string stages;
    char buf[64];
    for (const auto& st : r.stage_memory) {
      std::snprintf(buf, sizeof buf, "%s%.1f/%.1f", stages.empty() ? "" : "  ",
                    st.value("peak_memory_bytes", 0.0) / 1e6, st.value("estimated_memory_bytes", 0.0) / 1e6);
      stages += buf;
    }
    std::string vs;
    if (r.recompute_time_ratio > 0) {
      std::snprintf(buf, sizeof buf, "   peak %.2fx, time %.2fx", r.recompute_peak_ratio, r.recompute_time_ratio);
      vs = buf;
    }
    std::printf("%-8s %-20s %s%s\n", r.model.c_str(), r.setup.c_str(), stages.c_str(), vs.c_str());
  }
}

// With --trace-dir: per pipeline row, the measured bubble beside the split's,
// whole-run and per step (split_per_step), so that measured - per step is what
// the pipeline itself adds.
void print_split_per_step(const std::vector<Row>& rows) {
  if (std::none_of(rows.begin(), rows.end(), [](const Row& r) { return r.bubble_split_per_step >= 0; })) return;
  std::printf("\nbubble: measured / split (whole run) / split per step (median of the trace's steps)\n");
  for (const Row& r : rows)
    if (r.kind == "pipe" && r.bubble_split_per_step >= 0)
      std::printf("%-8s %-20s %.3f / %.3f / %.3f\n", r.model.c_str(), r.setup.c_str(), r.bubble_measured,
                  r.bubble_split, r.bubble_split_per_step);
}

void print_rows(const std::vector<Row>& rows) {
  std::map<std::string, double> baseline;
  for (const Row& r : rows)
    if (r.kind == "local" && r.threads == 1 && r.microbatches == 1) baseline[r.model] = r.samples_per_sec;
  print_header();
  bool vs_torch = false;
  for (const Row& r : rows) {
    print_row(r, baseline[r.model]);
    vs_torch = vs_torch || r.vs_torch > 0;
  }
  if (vs_torch)
    std::printf("vs torch: cleave's whole-run rate / its steady rate (batch over its median step), each over "
                "PyTorch's (its median step)\n");
  for (const Row& r : rows)
    if (!r.prediction.is_null()) {
      // Each stage's compute per batch, measured over predicted: a wrong layer
      // profile shows here, a wrong bubble only in the batch time.
      std::string stages, link_cpu;
      for (const auto& st : r.prediction.value("stages", json::array())) {
        char v[16];
        std::snprintf(v, sizeof v, "%s%.2f", stages.empty() ? "" : "/", st.value("measured_over_predicted", 0.0));
        stages += v;
        std::snprintf(v, sizeof v, "%s%.1f", link_cpu.empty() ? "" : "/", 1000 * st.value("link_cpu_seconds", 0.0));
        link_cpu += v;
      }
      std::string contention;
      for (const auto& c : r.prediction.value("host_contention", json::array())) {
        char v[16];
        std::snprintf(v, sizeof v, "%s%.2f", contention.empty() ? "" : "/", c.is_number() ? c.get<double>() : 0.0);
        contention += c.is_number() ? v : (contention.empty() ? "-" : "/-");
      }
      std::printf("%-8s %-20s planner: %zu stage(s), predicted %.1f ms/batch, measured %.1f ms/batch "
                  "(measured/predicted %.2f; stage compute %s; host contention %s; links' CPU %s ms)\n",
                  r.model.c_str(), r.setup.c_str(), r.plan.size(), 1000 * r.prediction.value("batch_seconds", 0.0),
                  1000 * r.prediction.value("measured_batch_seconds", 0.0),
                  r.prediction.value("measured_over_predicted", 0.0), stages.empty() ? "-" : stages.c_str(),
                  contention.empty() ? "-" : contention.c_str(), link_cpu.empty() ? "-" : link_cpu.c_str());
    }
  print_memory(rows);
  print_split_per_step(rows);
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

// One configuration; the order of `configs` is the order within a repetition.
struct Config {
  ModelInfo model;
  std::string kind;  // local | pipe | torch (after the pipe config it copies the cut of)
  int threads = 1, microbatches = 1, stages = 0;
  std::string schedule, recompute;
};

std::vector<Config> make_configs(const BenchOptions& o, const std::vector<ModelInfo>& models,
                                 const std::vector<std::string>& schedules) {
  const std::vector<std::string> recomputes =
      o.recompute == "both" ? std::vector<std::string>{"none", "all"} : std::vector<std::string>{o.recompute};
  std::vector<Config> configs;
  for (const ModelInfo& m : models) {
    configs.push_back({m, "local", 1, 1, 0, "", ""});
    configs.push_back({m, "local", 2, 1, 0, "", ""});
    if (o.microbatches > 1) configs.push_back({m, "local", 1, o.microbatches, 0, "", ""});
    for (int p : o.stages)
      for (const auto& sched : schedules) {
        for (const auto& rc : recomputes) configs.push_back({m, "pipe", 1, o.microbatches, p, sched, rc});
        if (m.text && p >= 2) configs.push_back({m, "torch", 1, o.microbatches, p, sched, "none"});
      }
  }
  return configs;
}

// --reps repetitions of every configuration, interleaved; one median row per configuration.
std::vector<Row> measure(const BenchOptions& o, const std::vector<Config>& configs, const std::string& text,
                         const std::string& cleaved, const cleave::bench::TorchPython& torch) {
  std::vector<std::vector<Row>> reps(configs.size());
  for (int rep = 0; rep < o.reps; ++rep) {
    const Row* last_pipe = nullptr;
    for (size_t i = 0; i < configs.size(); ++i) {
      if (g_interrupted) throw std::runtime_error("interrupted");
      const Config& c = configs[i];
      Row r = c.kind == "local" ? run_local(o, c.model, text, c.threads, c.microbatches)
              : c.kind == "pipe" ? run_pipeline(o, c.model, text, c.stages, c.schedule, c.recompute, cleaved)
                                 : run_torch(o, c.model, text, *last_pipe, torch);
      std::fprintf(stderr, "  rep %d/%d  %-8s %-20s %8.0f %s  (load %.1f)%s%s\n", rep + 1, o.reps, r.model.c_str(),
                   r.setup.c_str(), r.samples_per_sec * static_cast<double>(r.context),
                   r.context > 1 ? "tokens/s" : "samples/s", r.load1, r.note.empty() ? "" : "  ", r.note.c_str());
      reps[i].push_back(std::move(r));
      if (c.kind == "pipe") last_pipe = &reps[i].back();
    }
  }
  std::vector<Row> rows;
  for (const auto& r : reps) rows.push_back(median_row(r));
  compare_rows(rows);
  return rows;
}

int run(const BenchOptions& o) {
  const std::string cleaved = find_cleaved(o.cleaved);
  if (!o.trace_dir.empty()) fs::create_directories(o.trace_dir);
  std::vector<std::string> schedules =
      o.schedule == "both"  ? std::vector<std::string>{"gpipe", "1f1b"}
      : o.schedule == "all" ? std::vector<std::string>{"gpipe", "1f1b", "zb1"}
                            : std::vector<std::string>{o.schedule};
  std::vector<ModelInfo> models;
  bool any_text = false;
  for (const auto& m : o.models) models.push_back(model_info(o, m));
  for (const auto& m : models) any_text = any_text || m.text;
  std::string text = o.text;
  const std::string tmp_text = (fs::temp_directory_path() / ("bench-pipeline-fortunes-" + std::to_string(getpid()) + ".txt"));
  if (any_text && text.empty()) text = cleave::write_fortunes_text(o.fortunes_dir, tmp_text);
  const cleave::bench::TorchPython torch(cleave::bench::torch_python(o.python), o.torch && any_text);
  const double load_start = load_average();
  std::printf("bench_pipeline: %lld train / %lld test samples, %d epoch(s), %d micro-batches, median of %d, "
              "%u CPU core(s), load average %.1f at start\n",
              static_cast<long long>(o.limit_train), static_cast<long long>(o.limit_test), o.epochs, o.microbatches,
              o.reps, std::thread::hardware_concurrency(), load_start);
  if (any_text)
    std::printf("GPT models: text %s, batch 32, %lld steps per run; PyTorch: %s\n", text.c_str(),
                static_cast<long long>(o.max_steps > 0 ? o.max_steps : 24),
                torch.available() ? (torch.python() + " (torch " + torch.version() + ")").c_str() : torch.missing().c_str());
  if (!o.bandwidth_limit.empty())
    std::printf("every daemon's links throttled: --bandwidth-limit %s\n", o.bandwidth_limit.c_str());
  const double startup_cpu = daemon_startup_cpu(cleaved, 1500);
  std::printf("a cleaved daemon spends %.2f CPU s starting up (probe included) and idling 1.5 s\n", startup_cpu);
  const auto t0 = Clock::now();
  const std::vector<Config> configs = make_configs(o, models, schedules);
  // Warm-up (not measured): page in the dataset, the BLAS and the allocator.
  for (const ModelInfo& m : models) {
    BenchOptions w = o;
    w.limit_train = std::min<int64_t>(o.limit_train, 4 * m.batch);
    w.limit_test = std::min<int64_t>(o.limit_test, 100);
    w.epochs = 1;
    w.max_steps = m.text ? 3 : o.max_steps;
    (void)run_local(w, m, text, 1, 1);
  }
  std::vector<Row> rows = measure(o, configs, text, cleaved, torch);
  print_rows(rows);
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("total %.0f s, load average %.1f at the end\n", total, load_average());

  json out = {{"benchmark", "pipeline"},
              {"limit_train", o.limit_train},
              {"limit_test", o.limit_test},
              {"epochs", o.epochs},
              {"max_steps", o.max_steps},
              {"microbatches", o.microbatches},
              {"reps", o.reps},
              {"statistic", "median"},
              {"schedules", schedules},
              {"recompute", o.recompute},
              {"planner", o.planner},
              {"bandwidth_limit", o.bandwidth_limit},
              {"torch", torch.available() ? torch.version() : torch.missing()},
              {"cpu_cores", std::thread::hardware_concurrency()},
              {"load_average_start", load_start},
              {"daemon_startup_cpu_seconds", startup_cpu},
              {"seconds", total},
              {"rows", json::array()}};
  if (any_text) out["text"] = text;
  for (const Row& r : rows) out["rows"].push_back(to_json(r));
  cleave::write_json_file(o.json_path, out);
  std::printf("wrote %s\n", o.json_path.c_str());
  if (any_text && o.text.empty()) fs::remove(tmp_text);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // the table as it comes, also into a log file
  BenchOptions o;
  CLI::App app{"Pipelined training over local cleaved daemons vs one process and PyTorch's pipeline "
               "(samples/s or tokens/s, busy, bubble, memory)"};
  std::string models = "cnn,mlp", stages = "1,2,3";
  bool no_torch = false;
  app.add_option("--models", models,
                 "Comma-separated models from models/ (cnn: batch 64, mlp: 128, GPT models such as gpt-tiny: 32 "
                 "on --text)")
      ->capture_default_str();
  app.add_option("--limit-train", o.limit_train, "Training samples")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--limit-test", o.limit_test, "Test samples")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--epochs", o.epochs, "Epochs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-steps", o.max_steps,
                 "Optimizer steps per run (0: 24 for GPT models, the whole --epochs for the others)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--schedule", o.schedule, "gpipe | 1f1b | zb1 | both (gpipe and 1f1b) | all (the three)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b", "zb1", "both", "all"}));
  app.add_option("--recompute", o.recompute,
                 "none | all | auto (recompute activations in backward) | both (rows with none and with all)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "all", "auto", "both"}));
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
  app.add_option("--bandwidth-limit", o.bandwidth_limit,
                 "Each daemon's --bandwidth-limit (e.g. 200mbit): links slower than loopback");
  app.add_option("--dataset-dir", o.dataset_dir, "Where Fashion-MNIST lives");
  app.add_option("--text", o.text, "Text for GPT models (default: the fortunes, concatenated)");
  app.add_option("--models-dir", o.models_dir, "Where the model JSON files live")->capture_default_str();
  app.add_option("--python", o.python, "Python with torch for the PyTorch rows (default $CLEAVE_TORCH_PYTHON, else python3)");
  app.add_option("--torch-script", o.torch_script, "torch_pipeline.py")->capture_default_str();
  app.add_flag("--no-torch", no_torch, "Skip PyTorch's pipeline (its rows say skipped)");
  app.add_option("--seed", o.seed, "Seed")->capture_default_str();
  app.add_option("--reps", o.reps, "Repetitions of every configuration (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  CLI11_PARSE(app, argc, argv);
  o.torch = !no_torch;
  // One "peer devN disconnected" line per daemon per run would bury the table.
  cleave::transport::set_log_level(cleave::transport::LogLevel::kWarning);
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
    if (!o.text.empty() && !fs::exists(o.text)) throw std::runtime_error("--text " + o.text + ": no such file");
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
