// bench_recovery: how long `cleave train` across daemons takes to recover
// from a lost device (issue 15, docs/recovery.md), split into the phases the
// result JSON's `recoveries` reports, for the MLP, the CNN and a model 10x
// the MLP's parameters (bench/recovery/mlp-10x.json).
//
// Every run: an in-process coordinator (train_pipeline, --planner balance,
// 3 stages) and 4 real cleaved daemons on loopback (CURVE, --threads 1
// each): dev1..dev3 register and get the stages, dev4 starts once they hold
// them and waits as the spare. Per model and repeat, four runs, interleaved:
//   baseline  no checkpoints, no loss: the step time (train_seconds / steps)
//   ckpt      a checkpoint every --cost-every steps (default 2: many of
//             them, so the difference stands out of the noise), no loss: the
//             checkpoint cost, measured by comparison:
//             (train_seconds(ckpt) - train_seconds(baseline)) / checkpoints
//             written, i.e. everything one checkpoint adds to the run
//             (draining the pipeline, gathering the state from the stages,
//             writing the file). Reading the newest file back is timed
//             directly (load_training_state, page cache warm) and shown as
//             its own column; the runs' own `read_seconds` are kept in the
//             JSON's raw runs.
//   kill      --checkpoint-every N; stage 1's daemon gets SIGKILL mid-run
//   stop      the same, SIGSTOP instead: frozen, not dead, so detection is
//             silence: the transport's 3 s heartbeat or --peer-timeout, whichever
//             is shorter (it gets SIGCONT once the spare holds
//             its stage)
// When the loss happens: the watcher waits for the checkpoint of step K (the
// newest multiple of N before the middle of the run) to appear in the
// checkpoint directory, then for (middle - K) baseline step times, so the
// loss lands near the middle step and about N/2 steps after a checkpoint,
// whatever the machine's speed.
// Reported per model and scenario, medians over --repeats: detect, re-plan,
// checkpoint read, restore and catch-up seconds (docs/recovery.md defines
// the four of `recoveries`), the steps replayed, the step and checkpoint
// seconds, and the whole recovery in steps of training lost ((detect +
// re-plan + read + restore + catch-up) / step seconds).
//
// Usage: bench_recovery [--models mlp,cnn,mlp-10x] [--scenarios kill,stop]
//        [--repeats 3] [--limit-train 1920] [--batch 64] [--microbatches 2]
//        [--checkpoint-every 10] [--cost-every 2] [--peer-timeout 5000]
//        [--optimizer sgd|adam]
//        [--limit-test 200] [--dataset-dir DIR] [--cleaved PATH]
//        [--json bench-recovery.json]
#include <signal.h>
#include <sys/utsname.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/common/processes.h"
#include "bench/common/bench_args.h"
#include "bench/common/local_daemons.h"
#include "core/data/dataset.h"
#include "core/io/json_file.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/train/checkpoint_dir.h"
#include "core/train/train_checkpoint.h"
#include "device/cpu/process_env.h"
#include "transport/log.h"

using namespace cleave;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string models = "mlp,cnn,mlp-10x";
  std::string scenarios = "kill,stop";
  int repeats = 3;
  int64_t limit_train = 1920;
  int64_t limit_test = 200;
  int64_t batch = 64;
  int microbatches = 2;
  int64_t checkpoint_every = 10;
  int64_t cost_every = 2;
  int peer_timeout_ms = 5000;  // cleave's default; 2000 lost mlp-10x's stage 1 to a checkpoint's gather
  std::string optimizer = "sgd";
  std::string dataset_dir;
  std::string cleaved = std::string(CLEAVE_BUILD_DIR) + "/apps/cleaved/cleaved";
  std::string json_path = "bench-recovery.json";
};

// A model of --models and where its JSON is.
struct Model {
  std::string name, path;
};

Model find_model(const std::string& name) {
  if (name == "mlp" || name == "cnn") return {name, std::string(CLEAVE_SOURCE_DIR) + "/models/" + name + ".json"};
  if (name == "mlp-10x") return {name, std::string(CLEAVE_SOURCE_DIR) + "/bench/recovery/mlp-10x.json"};
  throw std::invalid_argument("--models: unknown model '" + name + "' (expected mlp, cnn or mlp-10x)");
}

enum class Scenario { kBaseline, kCheckpointed, kKill, kStop };

const char* scenario_name(Scenario s) {
  switch (s) {
    case Scenario::kBaseline: return "baseline";
    case Scenario::kCheckpointed: return "ckpt";
    case Scenario::kKill: return "kill";
    case Scenario::kStop: return "stop";
  }
  return "?";
}

std::vector<Scenario> parse_scenarios(const std::string& text) {
  std::vector<Scenario> out;
  for (const std::string& s : bench::split_text(text, ',')) {
    if (s == "kill") out.push_back(Scenario::kKill);
    else if (s == "stop") out.push_back(Scenario::kStop);
    else throw std::invalid_argument("--scenarios: unknown scenario '" + s + "' (expected kill, stop or kill,stop)");
  }
  if (out.empty()) throw std::invalid_argument("--scenarios is empty (expected kill, stop or kill,stop)");
  return out;
}

const std::vector<std::string> kDevices = {"dev1", "dev2", "dev3", "dev4"};  // dev4: the spare
constexpr int kStages = 3;
constexpr size_t kSpare = 3;  // kDevices' index of the spare

// The 4 daemons of a run (dev1..dev3 for the stages, dev4 the spare), one
// CPU thread each. Keys (and the coordinator's) from LocalDaemons, in its
// temporary directory; the processes are started here because
// LocalDaemons::start fixes --max-jobs 1 and the survivors of a loss serve a
// second job: the re-planned one.
class Daemons {
 public:
  explicit Daemons(const std::string& cleaved)
      : keys_(kDevices, cleaved), cleaved_(cleaved),
        dir_(fs::path(keys_.coordinator_key()).parent_path().string()) {}
  ~Daemons() { stop(); }
  Daemons(const Daemons&) = delete;
  Daemons& operator=(const Daemons&) = delete;

  const bench::LocalDaemons& keys() const { return keys_; }
  const std::string& dir() const { return dir_; }
  std::string log(size_t i) const { return read_text(dir_ + "/" + kDevices[i] + ".log"); }
  pid_t pid(size_t i) const { return pids_[i]; }
  // The last lines of every daemon's log, for an error message.
  std::string log_tails() const {
    std::string out;
    for (size_t i = 0; i < kDevices.size(); ++i) {
      const std::vector<std::string> lines = bench::split_text(log(i), '\n');
      out += "\n  " + kDevices[i] + ".log:" + (lines.empty() ? " (empty)" : "");
      for (size_t l = lines.size() > 4 ? lines.size() - 4 : 0; l < lines.size(); ++l) out += "\n    " + lines[l];
    }
    return out;
  }
  // Starts daemon i dialling `endpoint`; its log goes beside the keys.
  void start(size_t i, const std::string& endpoint) {
    const std::string& name = kDevices[i];
    pids_[i] = spawn({cleaved_, "--coordinator", endpoint, "--key", dir_ + "/" + name + ".key", "--coordinator-key",
                      dir_ + "/coordinator.pub", "--name", name, "--backend", "cpu", "--threads", "1", "--max-jobs",
                      "8"},
                     dir_ + "/" + name + ".log");
  }
  void stop() {
    for (pid_t& p : pids_)
      if (p > 0) {
        kill(p, SIGCONT);  // a frozen one must be able to take its SIGTERM
        terminate(p);
        p = 0;
      }
  }

 private:
  bench::LocalDaemons keys_;
  std::string cleaved_, dir_;
  std::array<pid_t, 4> pids_{};  // fixed: the watcher thread starts the spare while the run reads nothing here
};

// What the watcher did to the run, for the row and its checks.
struct Disturbance {
  std::string victim;             // the daemon that held stage 1
  int64_t after_checkpoint = -1;  // the checkpoint step the loss was timed from
  bool done = false;              // the signal was sent
  std::string error;              // why the watcher gave up ("" when it did not)
};

// Sleeps up to `d` in short naps; false when a stop was requested.
bool nap(std::stop_token st, std::chrono::milliseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
    if (st.stop_requested()) return false;
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        std::chrono::milliseconds(20), std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now())));
  }
  return !st.stop_requested();
}

// Waits until `ready()` or a stop; false on a stop.
template <typename Ready>
bool wait_for(std::stop_token st, Ready&& ready) {
  while (!ready())
    if (!nap(st, std::chrono::milliseconds(20))) return false;
  return true;
}

// The newest checkpoint step in `dir` (-1 when none yet).
int64_t newest_checkpoint(const std::string& dir) {
  try {
    if (!fs::exists(dir)) return -1;
    const auto list = CheckpointDir(dir).list();
    return list.empty() ? -1 : list.front().first;
  } catch (const std::exception&) {
    return -1;  // a file removed while listing: look again
  }
}

// When and where the loss happens (see the top of the file).
struct LossPlan {
  int64_t checkpoint_step = 0;  // wait for this checkpoint ...
  double wait_seconds = 0;      // ... then this long
};

// The watcher thread: starts the spare once the 3 stages are assigned, and
// for kill/stop disturbs stage 1's daemon at the planned time.
void watch(std::stop_token st, Daemons& daemons, const std::string& endpoint, Scenario scenario, const LossPlan& plan,
           const std::string& checkpoint_dir, Disturbance& out) {
  const auto assigned = [&](size_t i) { return daemons.log(i).find("assigned stage") != std::string::npos; };
  if (!wait_for(st, [&] { return assigned(0) && assigned(1) && assigned(2); })) return;
  daemons.start(kSpare, endpoint);
  if (scenario == Scenario::kBaseline || scenario == Scenario::kCheckpointed) return;
  size_t victim = kSpare;
  for (size_t i = 0; i < kSpare; ++i)
    if (daemons.log(i).find("assigned stage 1 of") != std::string::npos) victim = i;
  if (victim == kSpare) {
    out.error = "no daemon's log says it was assigned stage 1";
    return;
  }
  out.victim = kDevices[victim];
  if (!wait_for(st, [&] { return newest_checkpoint(checkpoint_dir) >= plan.checkpoint_step; })) return;
  out.after_checkpoint = newest_checkpoint(checkpoint_dir);
  if (!nap(st, std::chrono::milliseconds(static_cast<int64_t>(plan.wait_seconds * 1000)))) return;
  const pid_t pid = daemons.pid(victim);
  kill(pid, scenario == Scenario::kKill ? SIGKILL : SIGSTOP);
  out.done = true;
  if (scenario != Scenario::kStop) return;
  // Frozen past --peer-timeout: woken once the spare holds its stage (or at the end).
  (void)wait_for(st, [&] { return assigned(kSpare); });
  kill(pid, SIGCONT);
}

TrainConfig run_config(const Options& o, const Model& m) {
  TrainConfig cfg = bench::bench_run_config(m.path);
  cfg.dataset_dir = o.dataset_dir;
  cfg.batch = o.batch;
  cfg.microbatches = o.microbatches;
  cfg.limit_train = o.limit_train;
  cfg.limit_test = o.limit_test;
  cfg.threads = 1;
  if (o.optimizer == "sgd") {
    cfg.optimizer.kind = "sgd";
    cfg.optimizer.lr = 0.01f;
    cfg.optimizer.momentum = 0.9f;
  }
  return cfg;
}

// The newest checkpoint file in `dir`: its bytes and the seconds reading it
// back takes (load_training_state, what recovery's restore_point does between
// the re-plan and the restore: no phase of `recoveries` counts it); zeros when
// there is none.
std::pair<double, double> checkpoint_size_and_read(const std::string& dir) {
  const int64_t step = newest_checkpoint(dir);
  if (step < 0) return {0, 0};
  const std::string path = CheckpointDir(dir).path_for(step);
  const auto t0 = Clock::now();
  (void)load_training_state(path);
  const double read = std::chrono::duration<double>(Clock::now() - t0).count();
  return {static_cast<double>(fs::file_size(path)), read};
}

// One run of `scenario`; returns what the row needs (the coordinator's
// result trimmed to it). Throws when the run fails or the loss was not the
// one the watcher caused.
nlohmann::json run_once(const Options& o, const Model& m, Scenario scenario, const LossPlan& plan) {
  Daemons daemons(o.cleaved);
  const std::string checkpoint_dir = daemons.dir() + "/checkpoints";
  ClusterOptions c;
  daemons.keys().connect(c);
  c.devices = kStages;
  c.planner = "balance";
  c.peer_timeout_ms = o.peer_timeout_ms;
  c.checkpoint_dir = checkpoint_dir;
  c.checkpoint_every = scenario == Scenario::kBaseline       ? int64_t{1} << 40
                       : scenario == Scenario::kCheckpointed ? o.cost_every
                                                             : o.checkpoint_every;
  c.max_recoveries = 2;
  Disturbance disturbance;
  std::jthread watcher;  // declared after `daemons`: joined before they are stopped
  c.on_listening = [&](const std::string& endpoint) {
    for (size_t i = 0; i < kSpare; ++i) daemons.start(i, endpoint);
    watcher = std::jthread([&, endpoint](std::stop_token st) {
      watch(st, daemons, endpoint, scenario, plan, checkpoint_dir, disturbance);
      // The spare was spawned from this thread: PR_SET_PDEATHSIG ends it with the thread, so live to the end.
      (void)wait_for(st, [] { return false; });
    });
  };
  const std::string what = m.name + " " + scenario_name(scenario);
  nlohmann::json r;
  try {
    r = train_pipeline(run_config(o, m), c);
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": " + e.what() + daemons.log_tails());
  }
  watcher.request_stop();
  if (watcher.joinable()) watcher.join();
  if (!disturbance.error.empty()) throw std::runtime_error(what + ": " + disturbance.error);
  const auto [bytes, read_seconds] = checkpoint_size_and_read(checkpoint_dir);
  nlohmann::json row = {{"scenario", scenario_name(scenario)},
                        {"parameters", r.at("parameters")},
                        {"steps", r.at("steps")},
                        {"train_seconds", r.at("train_seconds")},
                        {"checkpoints_written", r.at("checkpoints").at("written")},
                        {"checkpoint_bytes", bytes},
                        {"checkpoint_read_seconds", read_seconds},
                        {"test_accuracy", r.at("test_accuracy")},
                        {"load_average", bench::load_average()}};
  const auto& recoveries = r.at("recoveries");
  if (scenario == Scenario::kBaseline || scenario == Scenario::kCheckpointed) {
    if (!recoveries.empty()) throw std::runtime_error(what + ": recovered without a loss: " + recoveries.dump());
    return row;
  }
  if (!disturbance.done) throw std::runtime_error(what + ": the run ended before the planned loss: shorten "
                                                  "--checkpoint-every or raise --limit-train");
  if (recoveries.size() != 1 || recoveries[0].at("device") != disturbance.victim)
    throw std::runtime_error(what + ": expected one recovery from the loss of " + disturbance.victim + ", got " +
                             recoveries.dump());
  row["victim"] = disturbance.victim;
  row["timed_after_checkpoint"] = disturbance.after_checkpoint;
  row["recovery"] = recoveries[0];
  return row;
}

}  // namespace

namespace {

// The middle step of a run of `steps` and the checkpoint before it; throws
// when --checkpoint-every leaves none there.
LossPlan plan_loss(const Options& o, int64_t steps, double step_seconds) {
  const int64_t middle = steps / 2;
  const int64_t k = middle > 0 ? ((middle - 1) / o.checkpoint_every) * o.checkpoint_every : 0;
  if (k < 1)
    throw std::invalid_argument("--checkpoint-every " + std::to_string(o.checkpoint_every) +
                                " leaves no checkpoint before the middle step (" + std::to_string(middle) + ") of a run of " +
                                std::to_string(steps) + " steps: lower it or raise --limit-train");
  return {k, static_cast<double>(middle - k) * step_seconds};
}

double seconds_of(const nlohmann::json& recovery, const char* key) {
  const auto& v = recovery.at(key);
  return v.is_null() ? 0.0 : v.get<double>();
}

const char* const kPhases[] = {"detect_seconds", "replan_seconds", "restore_seconds", "catch_up_seconds"};

// One model's repeats (each: runs by scenario name) summed up per loss
// scenario: medians over the repeats.
nlohmann::json summarise(const Model& m, const std::vector<std::map<std::string, nlohmann::json>>& repeats,
                         Scenario scenario) {
  std::map<std::string, std::vector<double>> v;
  for (const auto& runs : repeats) {
    const auto& base = runs.at("baseline");
    const auto& ckpt = runs.at("ckpt");
    const auto& lost = runs.at(scenario_name(scenario));
    const double step = base.at("train_seconds").get<double>() / std::max<double>(1, base.at("steps").get<double>());
    const double written = ckpt.at("checkpoints_written").get<double>();
    double total = ckpt.at("checkpoint_read_seconds").get<double>();
    v["checkpoint_read_seconds"].push_back(total);
    for (const char* k : kPhases) {
      v[k].push_back(seconds_of(lost.at("recovery"), k));
      total += v[k].back();
    }
    v["recovery_seconds"].push_back(total);
    v["step_seconds"].push_back(step);
    v["recovery_in_steps"].push_back(total / step);
    v["replayed_steps"].push_back(lost.at("recovery").at("replayed_steps").get<double>());
    v["lost_at_step"].push_back(lost.at("recovery").at("step").get<double>());
    v["checkpoint_seconds"].push_back(
        written > 0 ? (ckpt.at("train_seconds").get<double>() - base.at("train_seconds").get<double>()) / written : 0);
    v["checkpoint_bytes"].push_back(ckpt.at("checkpoint_bytes").get<double>());
  }
  nlohmann::json row = {{"model", m.name},
                        {"model_path", m.path},
                        {"parameters", repeats.front().at("baseline").at("parameters")},
                        {"scenario", scenario_name(scenario)},
                        {"repeats", repeats.size()}};
  for (const auto& [k, xs] : v) row[k] = bench::median(xs);
  return row;
}

void print_header() {
  std::printf("%-8s %11s %-8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "model", "parameters", "scenario",
              "detect", "re-plan", "read", "restore", "catch-up", "total s", "replayed", "lost at", "step s",
              "ckpt s", "ckpt MB", "in steps");
}

void print_row(const nlohmann::json& r) {
  if (r.at("repeats") == 0) {
    std::printf("%-8s %11s %-8s no complete repeat (see the errors above)\n", r.at("model").get<std::string>().c_str(),
                "", r.at("scenario").get<std::string>().c_str());
    return;
  }
  auto d = [&](const char* k) { return r.at(k).get<double>(); };
  std::printf("%-8s %11lld %-8s %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.1f %8.1f %8.4f %8.4f %8.1f %8.1f\n",
              r.at("model").get<std::string>().c_str(), static_cast<long long>(r.at("parameters").get<int64_t>()),
              r.at("scenario").get<std::string>().c_str(), d("detect_seconds"), d("replan_seconds"),
              d("checkpoint_read_seconds"), d("restore_seconds"), d("catch_up_seconds"), d("recovery_seconds"), d("replayed_steps"),
              d("lost_at_step"), d("step_seconds"), d("checkpoint_seconds"), d("checkpoint_bytes") / 1e6,
              d("recovery_in_steps"));
}

nlohmann::json machine() {
  utsname u{};
  uname(&u);
  return {{"cores", bench::online_cores()},
          {"kernel", std::string(u.release)},
          {"machine", std::string(u.machine)},
          {"load_average_start", bench::load_average()}};
}

nlohmann::json settings_json(const Options& o) {
  return {{"devices", kStages},
          {"spares", 1},
          {"threads_per_daemon", 1},
          {"planner", "balance"},
          {"limit_train", o.limit_train},
          {"limit_test", o.limit_test},
          {"batch", o.batch},
          {"microbatches", o.microbatches},
          {"checkpoint_every", o.checkpoint_every},
          {"cost_every", o.cost_every},
          {"peer_timeout_ms", o.peer_timeout_ms},
          {"optimizer", o.optimizer},
          {"repeats", o.repeats},
          {"checkpoint_seconds_method",
           "(train_seconds with a checkpoint every --cost-every steps - train_seconds without checkpoints) / "
           "checkpoints written"},
          {"checkpoint_read_seconds_method",
           "load_training_state of the newest checkpoint file, timed here after the ckpt run (page cache warm)"},
          {"recovery_seconds_method", "detect + replan + checkpoint read + restore + catch-up"},
          {"step_seconds_method", "train_seconds / steps of the run without checkpoints"}};
}

// One repeat of one model: baseline, ckpt, then the loss scenarios, the loss
// timed with this repeat's baseline step time. Each run is appended to
// `runs` as it ends; throws when one fails.
std::map<std::string, nlohmann::json> run_repeat(const Options& o, const Model& m,
                                                 const std::vector<Scenario>& scenarios, int rep, nlohmann::json& runs) {
  std::map<std::string, nlohmann::json> got;
  std::vector<Scenario> order = {Scenario::kBaseline, Scenario::kCheckpointed};
  order.insert(order.end(), scenarios.begin(), scenarios.end());
  LossPlan plan;
  for (Scenario s : order) {
    std::fprintf(stderr, "bench_recovery: %s %s, repeat %d of %d\n", m.name.c_str(), scenario_name(s), rep + 1,
                 o.repeats);
    nlohmann::json run = run_once(o, m, s, plan);
    if (s == Scenario::kBaseline) {
      const int64_t steps = run.at("steps").get<int64_t>();
      plan = plan_loss(o, steps, run.at("train_seconds").get<double>() / static_cast<double>(std::max<int64_t>(1, steps)));
    }
    run["model"] = m.name;
    run["repeat"] = rep;
    runs.push_back(run);
    got[scenario_name(s)] = std::move(run);
  }
  return got;
}

// Every repeat of every model, interleaved; returns the rows. A failed run
// ends its repeat of its model (recorded in `failures`, said on stderr); the
// rows are medians over the complete repeats.
nlohmann::json run_all(const Options& o, const std::vector<Model>& models, const std::vector<Scenario>& scenarios,
                       nlohmann::json& runs, nlohmann::json& failures) {
  std::vector<std::vector<std::map<std::string, nlohmann::json>>> by_model(models.size());
  for (int rep = 0; rep < o.repeats; ++rep)
    for (size_t i = 0; i < models.size(); ++i) {
      try {
        by_model[i].push_back(run_repeat(o, models[i], scenarios, rep, runs));
      } catch (const std::runtime_error& e) {
        std::fprintf(stderr, "bench_recovery: repeat %d of %s failed: %s\n", rep + 1, models[i].name.c_str(), e.what());
        failures.push_back({{"model", models[i].name}, {"repeat", rep}, {"error", e.what()}});
      }
    }
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < models.size(); ++i)
    for (Scenario s : scenarios)
      rows.push_back(by_model[i].empty()
                         ? nlohmann::json{{"model", models[i].name}, {"scenario", scenario_name(s)}, {"repeats", 0}}
                         : summarise(models[i], by_model[i], s));
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  CLI::App app{"bench_recovery: recovery time from a lost device (detection, re-plan, restore, catch-up)"};
  Options o;
  app.add_option("--models", o.models, "Models: mlp, cnn, mlp-10x (bench/recovery/mlp-10x.json)")->capture_default_str();
  app.add_option("--scenarios", o.scenarios, "kill (SIGKILL), stop (SIGSTOP past --peer-timeout)")->capture_default_str();
  app.add_option("--repeats", o.repeats, "Runs of each; the table shows medians")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--limit-train", o.limit_train, "Training samples (one epoch)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--limit-test", o.limit_test, "Test samples evaluated at the end")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "Batch size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--microbatches", o.microbatches, "Pipeline micro-batches per batch")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-every", o.checkpoint_every, "Steps between checkpoints")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--cost-every", o.cost_every,
                 "Steps between checkpoints in the run that measures what one costs (more of them: less noise)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--peer-timeout", o.peer_timeout_ms, "Milliseconds of silence before a device is lost")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--optimizer", o.optimizer, "sgd (momentum 0.9, lr 0.01) or adam (lr 0.001)")->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--dataset-dir", o.dataset_dir, "Where Fashion-MNIST lives");
  app.add_option("--cleaved", o.cleaved, "The cleaved binary")->capture_default_str();
  app.add_option("--json", o.json_path, "Write the results here")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<Model> models;
    for (const std::string& name : bench::split_text(o.models, ',')) models.push_back(find_model(name));
    if (models.empty()) throw std::invalid_argument("--models is empty (expected e.g. mlp,cnn,mlp-10x)");
    const std::vector<Scenario> scenarios = parse_scenarios(o.scenarios);
    if (!fs::exists(o.cleaved))
      throw std::invalid_argument("--cleaved " + o.cleaved + ": no such file (build it: ninja cleaved)");
    (void)plan_loss(o, o.limit_train / o.batch, 0);  // bad --checkpoint-every/--limit-train: say so before running
    try {
      (void)find_fashion_mnist(o.dataset_dir);
    } catch (const std::exception& e) {
      std::printf("bench_recovery: skipped: Fashion-MNIST is missing (%s)\n", e.what());
      return 0;
    }
    transport::set_log_level(transport::LogLevel::kError);
    nlohmann::json report = {{"benchmark", "recovery"}, {"machine", machine()}, {"settings", settings_json(o)}};
    nlohmann::json runs = nlohmann::json::array(), failures = nlohmann::json::array();
    const nlohmann::json rows = run_all(o, models, scenarios, runs, failures);
    report["machine"]["load_average_end"] = bench::load_average();
    report["results"] = rows;
    report["runs"] = runs;
    report["failures"] = failures;
    std::printf("machine: %d cores, load average %.2f at the start, %.2f at the end; medians over %d repeat(s)\n",
                report["machine"]["cores"].get<int>(), report["machine"]["load_average_start"].get<double>(),
                report["machine"]["load_average_end"].get<double>(), o.repeats);
    print_header();
    for (const auto& r : rows) print_row(r);
    write_json_file(o.json_path, report);
    std::printf("wrote %s\n", o.json_path.c_str());
    if (!failures.empty())
      std::printf("%zu repeat(s) failed (their errors are above and under \"failures\" in the JSON)\n", failures.size());
    return failures.empty() ? 0 : 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_recovery: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_recovery: error: %s\n", e.what());
    return 1;
  }
}
