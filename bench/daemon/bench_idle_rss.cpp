// bench_idle_rss: resident memory of idle `cleaved --backend cpu` daemons
// (issue 13, finding 9; target: at most 16 MiB for a CPU daemon), and what an
// SDK client adds to an app (issue 14; target: at most 16 MiB while idle).
// Prints a table and writes JSON.
//
//   bench_idle_rss [--cleaved PATH] [--emulator PATH [--guest-maps LIB]] [--setups A,B,...]
//                  [--app PATH] [--lib PATH] [--app-samples 10000] [--runs 5] [--settle 2] [--wake-window 3]
//                  [--job-rounds 3] [--job-limit-train 6000] [--json bench-idle-rss.json]
//
// --emulator runs the daemon under it (qemu-aarch64-static with an arm64
// --cleaved: bench_footprint.sh); its VmRSS then includes the emulator's own
// memory. --guest-maps LIB (guest_maps.c built for the guest) is preloaded
// into the emulated daemon, and the guest's own resident pages are counted
// (resident_pages.h): the "pages" column, which is then the one held to the
// target. Natively "pages" counts every mapping's present pages, which
// should give VmRSS back. --setups picks some of the setups below (default:
// all). --job-rounds and --job-limit-train size the fed-job-1t job.
//
// Each run starts a fresh daemon and, once it is idle, reads VmRSS, RssAnon,
// RssFile, VmHWM and Threads from /proc/PID/status, counts its present pages in
// /proc/PID/pagemap, counts the CUDA / OpenCL libraries in /proc/PID/maps and
// keeps the mappings that hold the most; then, over --wake-window seconds
// (default 3), it counts how often the idle daemon's threads were put on a CPU
// ("wake/s", from /proc/PID/task/*/schedstat) and the CPU time they used
// ("cpu ms/s"): what an idle daemon costs a board or a phone on battery. Setups:
//   unconnected      dialling a loopback port where nothing listens (all cores)
//   unconnected-1t   the same with --threads 1
//   registered-1t    --threads 1, registered with a coordinator (a CURVE server
//                    in this process, on the daemon's allow-list) that gives it no job
//   auto             unconnected with --backend auto (the default): the GPU
//                    backends' modules are tried and, without a GPU, the CPU used
//   fed-job-1t       --threads 1, the only client of a real `cleave fed` job
//                    (--job-rounds of the MLP; needs Fashion-MNIST): the highest
//                    VmRSS sampled every 20 ms (guest pages: every 250 ms)
//                    until it exits, and VmHWM
//   sdk-registered-1t  the app sdk_rss_app.c (--app), holding --app-samples
//                    samples of its own (default 10000: 30 MiB), dlopen()s
//                    libcleave (--lib) and runs a federated client (CPU, 1
//                    thread) registered with the in-process coordinator;
//                    "added" is its VmRSS then minus its VmRSS before dlopen
//                    (the SDK reads the app's samples through its callback and
//                    keeps no copy)
//   sdk-fed-job-1t   the same app in a real `cleave fed` run (3 rounds of the
//                    MLP, the only client); "added" is its highest VmRSS during
//                    the job minus the baseline (needs Fashion-MNIST for the
//                    coordinator; skipped, and said so, without it)
// "Idle" is --settle seconds after the start-up probe ("GFLOP/s measured" in
// its log) and, for registered-1t, after its first registration arrived. Each
// setup reports the median of --runs; the machine's cores, memory and load
// average are recorded. Run with --cleaved OLD/cleaved to measure another build.
#include <sys/utsname.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/processes.h"
#include "bench/common/bench_args.h"
#include "bench/common/local_daemons.h"
#include "bench/daemon/resident_pages.h"
#include "core/io/json_file.h"
#include "transport/endpoint.h"
#include "transport/keys.h"

#ifndef CLEAVE_BUILD_DIR
#define CLEAVE_BUILD_DIR "."
#endif

namespace {

namespace fs = std::filesystem;
using cleave::read_text;
using Clock = std::chrono::steady_clock;
constexpr double kTargetMiB = 16.0;
constexpr double kKiB = 1024.0;

struct Args {
  std::string cleaved = CLEAVE_BUILD_DIR "/apps/cleaved/cleaved";
  std::string app = CLEAVE_BUILD_DIR "/bench/daemon/sdk_rss_app";
  std::string lib = CLEAVE_BUILD_DIR "/sdk/libcleave.so.0";
  int64_t app_samples = 10000;
  int runs = 5;
  double settle = 2.0;
  double wake_window = 3.0;
  std::string json = "bench-idle-rss.json";
  std::vector<std::string> emulator;  // --emulator: runs cleaved under it (qemu-aarch64-static for an arm64 build)
  std::string guest_maps;             // --guest-maps: guest_maps.so for the emulated daemon
  int job_rounds = 3;
  int64_t job_limit_train = 6000;
  std::vector<std::string> setups = {"unconnected", "unconnected-1t", "registered-1t", "auto",
                                     "fed-job-1t", "sdk-registered-1t", "sdk-fed-job-1t"};
};

// One sample of a daemon's memory, in KiB (threads: a count).
struct Sample {
  std::map<std::string, double> status;  // VmRSS, RssAnon, RssFile, VmHWM, Threads
  int gpu_libraries = 0;                 // distinct CUDA / OpenCL libraries mapped
  nlohmann::json top;                    // the mappings with the most resident memory
};

using cleave::bench::load_average;

bool is_gpu_library(const std::string& path) {
  for (const char* lib : {"libcuda", "libcublas", "libnvrtc", "libOpenCL", "libclblast", "libpocl", "libcleave-backend-"})
    if (path.find(lib) != std::string::npos) return true;
  return false;
}

// The mappings of /proc/PID/smaps with the most resident memory (anonymous ones
// as "[anon]"), and how many distinct GPU libraries are mapped.
void read_mappings(pid_t pid, Sample& s) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  std::map<std::string, std::pair<double, double>> by_path;  // rss, anonymous (KiB)
  std::string line, current;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string first;
    ls >> first;
    if (first.find('-') != std::string::npos && first.back() != ':') {
      std::string perms, offset, dev, inode, path;
      ls >> perms >> offset >> dev >> inode;
      std::getline(ls >> std::ws, path);
      current = path.empty() ? "[anon]" : path;
    } else if (first == "Rss:" || first == "Anonymous:") {
      double kib = 0;
      ls >> kib;
      (first == "Rss:" ? by_path[current].first : by_path[current].second) += kib;
    }
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [path, v] : by_path) {
    order.emplace_back(v.first, path);
    if (is_gpu_library(path)) ++s.gpu_libraries;
  }
  std::sort(order.rbegin(), order.rend());
  s.top = nlohmann::json::array();
  for (size_t i = 0; i < order.size() && i < 8; ++i)
    s.top.push_back({{"mapping", order[i].second},
                     {"rss_kib", order[i].first},
                     {"anonymous_kib", by_path[order[i].second].second}});
}

// The daemon's present pages: the guest's when it is emulated with
// guest_maps.so preloaded (`guest_maps` names the file it writes), else all.
void count_pages(pid_t pid, const std::string& guest_maps, Sample& s) {
  const cleave::bench::Resident r =
      guest_maps.empty()
          ? cleave::bench::resident_pages(pid, cleave::bench::parse_maps(read_text("/proc/" + std::to_string(pid) + "/maps")))
          : cleave::bench::guest_resident(pid, guest_maps);
  s.status["Pages"] = r.kib;
  s.status["PagesAnon"] = r.anon_kib;
  s.status["PagesFile"] = r.file_kib;
}

// The times the daemon's threads were put on a CPU, and their CPU seconds, so
// far (the first and third fields of each thread's schedstat; threads that
// ended are not counted, and an idle daemon ends none).
struct Activity {
  double slices = 0, cpu_seconds = 0;
};

Activity activity(pid_t pid) {
  Activity a;
  for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::istringstream in(read_text((t.path() / "schedstat").string()));
    double run_ns = 0, wait_ns = 0, slices = 0;
    if (!(in >> run_ns >> wait_ns >> slices)) continue;
    a.slices += slices;
    a.cpu_seconds += run_ns * 1e-9;
  }
  return a;
}

Sample sample(pid_t pid, const std::string& guest_maps = "") {
  Sample s;
  std::istringstream status(read_text("/proc/" + std::to_string(pid) + "/status"));
  std::string key;
  while (status >> key) {
    double v = 0;
    if (key == "VmRSS:" || key == "RssAnon:" || key == "RssFile:" || key == "VmHWM:" || key == "Threads:") {
      status >> v;
      s.status[key.substr(0, key.size() - 1)] = v;
    }
    std::getline(status, key);
  }
  read_mappings(pid, s);
  count_pages(pid, guest_maps, s);
  return s;
}

// Waits up to 60 s for `needle` in the daemon's log; throws with the log otherwise.
void wait_for_log(const std::string& log, const std::string& needle, const std::function<void()>& while_waiting) {
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (read_text(log).find(needle) == std::string::npos) {
    if (Clock::now() > end) throw std::runtime_error("cleaved never logged '" + needle + "':\n" + read_text(log));
    while_waiting();
  }
}

// Keeps reading what the daemon sends (its registrations) for `seconds`.
void serve_for(cleave::transport::ServerEndpoint* server, double seconds, bool* registered) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (!server) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    auto r = server->receive(cleave::transport::Millis(50));
    if (r && std::holds_alternative<cleave::transport::RegisterMsg>(r.value().message.body) && registered)
      *registered = true;
  }
}

// Serves `server` for `seconds` (see serve_for) and records the daemon's
// wake-ups and CPU time per second meanwhile in `s`.
void serve_measuring(pid_t pid, cleave::transport::ServerEndpoint* server, double seconds, Sample& s) {
  const Activity before = activity(pid);
  const auto t0 = Clock::now();
  serve_for(server, seconds, nullptr);
  const Activity after = activity(pid);
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  s.status["WakeupsPerSec"] = (after.slices - before.slices) / elapsed;
  s.status["CpuMsPerSec"] = 1000 * (after.cpu_seconds - before.cpu_seconds) / elapsed;
}

// The emulator's part of the daemon's command line: with --guest-maps it
// preloads the library into the guest and names the file it writes (in `dir`).
std::vector<std::string> emulator_prefix(const Args& a, const std::string& dir, std::string* maps_out) {
  std::vector<std::string> argv = a.emulator;
  maps_out->clear();
  if (!a.emulator.empty() && !a.guest_maps.empty()) {
    *maps_out = dir + "/guest.maps";
    argv.insert(argv.end(), {"-E", "LD_PRELOAD=" + fs::absolute(a.guest_maps).string(), "-E", "CLEAVE_GUEST_MAPS=" + *maps_out});
  }
  return argv;
}

// One fresh daemon of `setup`, sampled once idle.
Sample run_once(const Args& a, const std::string& setup) {
  cleave::bench::LocalDaemons keys({"idle"}, a.cleaved);
  const std::string dir = fs::path(keys.coordinator_key()).parent_path().string();
  const std::string log = dir + "/idle.log";
  std::unique_ptr<cleave::transport::ServerEndpoint> server;
  std::string maps;
  std::vector<std::string> argv = emulator_prefix(a, dir, &maps);
  argv.insert(argv.end(), {a.cleaved, "--name", "idle", "--backend", setup == "auto" ? "auto" : "cpu"});
  if (setup == "registered-1t") {
    cleave::transport::ServerOptions o;
    o.keys = cleave::transport::load_secret_key(keys.coordinator_key());
    o.allow = cleave::transport::AllowList::load(keys.allow());
    o.label = "bench coordinator";
    server = std::make_unique<cleave::transport::ServerEndpoint>(o);
    argv.insert(argv.end(), {"--coordinator", server->endpoint(), "--key", dir + "/idle.key", "--coordinator-key",
                             dir + "/coordinator.pub"});
  } else {
    argv.insert(argv.end(), {"--coordinator", "tcp://127.0.0.1:9", "--insecure"});
  }
  if (setup.ends_with("-1t")) argv.insert(argv.end(), {"--threads", "1"});
  const pid_t pid = cleave::spawn(argv, log);
  Sample s;
  try {
    bool registered = !server;
    wait_for_log(log, "GFLOP/s measured", [&] { serve_for(server.get(), 0.05, &registered); });
    const auto end = Clock::now() + std::chrono::seconds(60);
    while (!registered && Clock::now() < end) serve_for(server.get(), 0.1, &registered);
    if (!registered) throw std::runtime_error("the daemon never registered:\n" + read_text(log));
    serve_for(server.get(), a.settle, nullptr);
    s = sample(pid, maps);
    serve_measuring(pid, server.get(), a.wake_window, s);
  } catch (...) {
    cleave::terminate(pid);
    throw;
  }
  cleave::terminate(pid);
  return s;
}

// The number after "KEY " in the app's output (-1 when it is not there).
double app_value(const std::string& log, const std::string& key) {
  const size_t at = log.find(key + " ");
  return at == std::string::npos ? -1 : std::atof(log.c_str() + at + key.size() + 1);
}

bool have_fashion_mnist() {
  const char* env = std::getenv("CLEAVE_DATA_DIR");
  for (const std::string& d : {env ? std::string(env) : "", env ? std::string(env) + "/fashion-mnist" : "",
                              std::string("/usr/share/datasets/fashion-mnist")})
    if (!d.empty() && (fs::exists(d + "/train-images-idx3-ubyte.gz") || fs::exists(d + "/train-images-idx3-ubyte")))
      return true;
  return false;
}

// A `cleave fed` coordinator for one client (`rounds` rounds of the MLP);
// returns its pid and the endpoint it listens on.
std::pair<pid_t, std::string> start_fed_coordinator(const cleave::bench::LocalDaemons& keys, const std::string& dir,
                                                    int rounds = 3) {
  const std::string fed_log = dir + "/fed.log";
  const pid_t pid = cleave::spawn({CLEAVE_BUILD_DIR "/apps/cleave/cleave", "fed", "--model", CLEAVE_SOURCE_DIR "/models/mlp.json",
                                   "--dataset", "fashion-mnist", "--clients", "1", "--rounds", std::to_string(rounds), "--batch", "32",
                                   "--limit-test", "500", "--threads", "1", "--key", keys.coordinator_key(), "--allow",
                                   keys.allow(), "--listen", "tcp://127.0.0.1:*", "--shutdown-clients"},
                                  fed_log);
  wait_for_log(fed_log, "listening on ", [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  const std::string text = read_text(fed_log);
  const size_t at = text.find("listening on ") + 13;
  return {pid, text.substr(at, text.find(',', at) - at)};
}

// fed-job-1t: a `cleaved --threads 1` as the only client of a real `cleave fed`
// job, sampled every 20 ms (250 ms when counting an emulated guest's pages)
// until it exits: VmRSS and Pages are the highest samples, VmHWM the kernel's
// peak as last read.
Sample run_job_once(const Args& a) {
  cleave::bench::LocalDaemons keys({"job"}, a.cleaved);
  const std::string dir = fs::path(keys.coordinator_key()).parent_path().string();
  const auto [coordinator, endpoint] = start_fed_coordinator(keys, dir, a.job_rounds);
  std::string maps;
  std::vector<std::string> argv = emulator_prefix(a, dir, &maps);
  argv.insert(argv.end(), {a.cleaved, "--name", "job", "--backend", "cpu", "--threads", "1", "--coordinator", endpoint,
                           "--key", dir + "/job.key", "--coordinator-key", dir + "/coordinator.pub", "--max-jobs", "1",
                           "--dataset", "fashion-mnist", "--shard", "0/1", "--limit-train",
                           std::to_string(a.job_limit_train)});
  const pid_t pid = cleave::spawn(argv, dir + "/job.log");
  Sample peak;
  const auto end = Clock::now() + std::chrono::minutes(10);
  const auto every = std::chrono::milliseconds(maps.empty() ? 20 : 250);
  bool exited = false;
  for (int status = 0; !exited && Clock::now() < end;) {
    std::this_thread::sleep_for(every);
    if ((exited = waitpid(pid, &status, WNOHANG) == pid)) break;
    Sample now;
    try {
      now = sample(pid, maps);
    } catch (const std::exception&) {
      // It ended while we asked: an exiting process drops its pages before it
      // is a zombie that waitpid reports, so give it a moment to get there.
      for (int i = 0; i < 50 && !exited; ++i) {
        exited = waitpid(pid, &status, WNOHANG) == pid;
        if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (exited) break;
      throw;
    }
    const double hwm = std::max(now.status["VmHWM"], peak.status["VmHWM"]);
    const double pages = std::max(now.status["Pages"], peak.status["Pages"]);
    if (now.status["VmRSS"] >= peak.status["VmRSS"]) peak = now;
    peak.status["VmHWM"] = hwm;
    peak.status["Pages"] = pages;
  }
  if (!exited) cleave::terminate(pid);
  cleave::terminate(coordinator);
  if (!exited) throw std::runtime_error("the daemon's job ran past 10 minutes:\n" + read_text(dir + "/job.log"));
  if (peak.status["VmRSS"] <= 0) throw std::runtime_error("the daemon's job left no sample:\n" + read_text(dir + "/job.log"));
  return peak;
}

// The SDK app of `setup` (sdk-registered-1t: sampled while it waits for a job;
// sdk-fed-job-1t: its peak during a `cleave fed` job, as it reports it).
Sample run_sdk_once(const Args& a, const std::string& setup) {
  cleave::bench::LocalDaemons keys({"app"}, a.cleaved);
  const std::string dir = fs::path(keys.coordinator_key()).parent_path().string();
  const std::string log = dir + "/app.log";
  std::unique_ptr<cleave::transport::ServerEndpoint> server;
  pid_t coordinator = -1;
  std::string endpoint;
  if (setup == "sdk-registered-1t") {
    cleave::transport::ServerOptions o;
    o.keys = cleave::transport::load_secret_key(keys.coordinator_key());
    o.allow = cleave::transport::AllowList::load(keys.allow());
    o.label = "bench coordinator";
    server = std::make_unique<cleave::transport::ServerEndpoint>(o);
    endpoint = server->endpoint();
  } else {
    std::tie(coordinator, endpoint) = start_fed_coordinator(keys, dir);
  }
  const pid_t pid = cleave::spawn({a.app, "--lib", a.lib, "--coordinator", endpoint, "--key", dir + "/app.key",
                                   "--coordinator-key", dir + "/coordinator.pub", "--threads", "1", "--max-jobs",
                                   server ? "0" : "1", "--samples", std::to_string(a.app_samples)},
                                  log);
  Sample s;
  try {
    if (server) {
      wait_for_log(log, "waiting 1", [&] { serve_for(server.get(), 0.05, nullptr); });
      serve_for(server.get(), a.settle, nullptr);
      s = sample(pid);
    } else {
      wait_for_log(log, "end_kib", [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
    }
    const std::string out = read_text(log);  // the app's lines, read once, after the sample
    if (!server) s.status["VmRSS"] = app_value(out, "job_peak_kib");
    s.status["Baseline"] = app_value(out, "baseline_kib");
    s.status["Added"] = s.status["VmRSS"] - s.status["Baseline"];
    s.status["Loaded"] = app_value(out, "loaded_kib");
  } catch (...) {
    cleave::terminate(pid);
    if (coordinator > 0) cleave::terminate(coordinator);
    throw;
  }
  cleave::terminate(pid);
  if (coordinator > 0) cleave::terminate(coordinator);
  return s;
}

std::vector<std::string> split_list(const std::string& text) {
  static const std::set<std::string> known = {"unconnected", "unconnected-1t", "registered-1t", "auto",
                                              "fed-job-1t", "sdk-registered-1t", "sdk-fed-job-1t"};
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!known.count(item)) throw std::invalid_argument("--setups: unknown setup '" + item + "'");
    out.push_back(item);
  }
  if (out.empty()) throw std::invalid_argument("--setups: name at least one setup");
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage: bench_idle_rss [--cleaved PATH] [--emulator PATH [--guest-maps LIB]] [--setups A,B,...] "
                   "[--app PATH] [--lib PATH] [--app-samples N] [--runs N] [--settle SECONDS] [--wake-window SECONDS] [--job-rounds N] "
                   "[--job-limit-train N] [--json PATH]\n";
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
    const std::string v = argv[++i];
    if (arg == "--cleaved") a.cleaved = v;
    else if (arg == "--app") a.app = v;
    else if (arg == "--lib") a.lib = v;
    else if (arg == "--app-samples") a.app_samples = cleave::bench::parse_int_arg(arg, v, 1);
    else if (arg == "--runs") a.runs = static_cast<int>(cleave::bench::parse_int_arg(arg, v, 1));
    else if (arg == "--settle") a.settle = cleave::bench::parse_positive_arg(arg, v);
    else if (arg == "--wake-window") a.wake_window = cleave::bench::parse_positive_arg(arg, v);
    else if (arg == "--json") a.json = v;
    else if (arg == "--emulator") a.emulator = {v};
    else if (arg == "--guest-maps") a.guest_maps = v;
    else if (arg == "--job-rounds") a.job_rounds = static_cast<int>(cleave::bench::parse_int_arg(arg, v, 1));
    else if (arg == "--job-limit-train") a.job_limit_train = cleave::bench::parse_int_arg(arg, v, 32);
    else if (arg == "--setups") a.setups = split_list(v);
    else throw std::invalid_argument("unknown argument '" + arg + "'");
  }
  if (!fs::exists(a.cleaved)) throw std::invalid_argument("--cleaved " + a.cleaved + ": no such file");
  if (!a.guest_maps.empty() && a.emulator.empty())
    throw std::invalid_argument("--guest-maps counts an emulated daemon's pages: give --emulator too");
  if (!a.guest_maps.empty() && !fs::exists(a.guest_maps))
    throw std::invalid_argument("--guest-maps " + a.guest_maps + ": no such file");
  return a;
}

nlohmann::json machine(double load_start) {
  utsname u{};
  uname(&u);
  std::istringstream mem(read_text("/proc/meminfo"));
  std::string key;
  double total_kib = 0;
  while (mem >> key)
    if (key == "MemTotal:") mem >> total_kib;
  return {{"cores", cleave::bench::online_cores()},
          {"memory_total_bytes", total_kib * kKiB},
          {"kernel", std::string(u.release)},
          {"load_average_start", load_start}};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_idle_rss: " << e.what() << "\nusage: bench_idle_rss [--cleaved PATH] [--runs N] "
              << "[--settle SECONDS] [--json PATH]\n";
    return 2;
  }
  try {
    nlohmann::json report = {{"benchmark", "idle_rss"},
                             {"cleaved", fs::absolute(a.cleaved).string()},
                             {"emulator", a.emulator.empty() ? nlohmann::json() : nlohmann::json(a.emulator[0])},
                             {"guest_pages_counted", !a.guest_maps.empty()},
                             {"job_rounds", a.job_rounds},
                             {"job_limit_train", a.job_limit_train},
                             {"runs", a.runs},
                             {"settle_seconds", a.settle},
                             {"wake_window_seconds", a.wake_window},
                             {"app_samples", a.app_samples},
                             {"target_vmrss_bytes", kTargetMiB * kKiB * kKiB},
                             {"machine", machine(load_average())},
                             {"setups", nlohmann::json::array()}};
    // Emulated with --guest-maps, the guest's own pages are the daemon's memory; else VmRSS is.
    const bool guest = !a.guest_maps.empty();
    std::printf("%-17s %5s %10s %10s %10s %10s %10s %10s %8s %9s %7s %8s %9s\n", "setup", "runs", "VmRSS MiB",
                guest ? "guest MiB" : "pages MiB", "added MiB", "anon MiB", "file MiB", "HWM MiB", "threads", "GPU libs",
                "target", "wake/s", "cpu ms/s");
    for (const std::string& setup : a.setups) {
      const bool sdk = setup.starts_with("sdk-"), job = setup.ends_with("job-1t");
      if (job && !have_fashion_mnist()) {
        std::printf("%-17s skipped: Fashion-MNIST is not installed (the coordinator needs it)\n", setup.c_str());
        report["setups"].push_back({{"setup", setup}, {"skipped", "Fashion-MNIST is not installed"}});
        continue;
      }
      std::map<std::string, std::vector<double>> values;
      nlohmann::json runs = nlohmann::json::array();
      Sample last;
      for (int r = 0; r < a.runs; ++r) {
        last = sdk ? run_sdk_once(a, setup) : job ? run_job_once(a) : run_once(a, setup);
        for (const auto& [k, v] : last.status) values[k].push_back(v);
        values["gpu_libraries"].push_back(last.gpu_libraries);
        runs.push_back({{"status_kib", last.status}, {"gpu_libraries", last.gpu_libraries}});
      }
      nlohmann::json median;
      for (const auto& [k, v] : values) median[k] = cleave::bench::median(v);
      const double rss_mib = median.value("VmRSS", 0.0) / kKiB, added_mib = median.value("Added", 0.0) / kKiB;
      const double pages_mib = median.value("Pages", 0.0) / kKiB, daemon_mib = guest ? pages_mib : rss_mib;
      const char* anon = guest ? "PagesAnon" : "RssAnon";
      const char* file = guest ? "PagesFile" : "RssFile";
      // A daemon's target is its whole VmRSS; an SDK client's, what it adds to its app while idle.
      const bool has_target = !job;
      const bool meets = (sdk ? added_mib : daemon_mib) <= kTargetMiB;
      char added[16] = "-";
      if (sdk) std::snprintf(added, sizeof added, "%.1f", added_mib);
      char pages[16] = "-";
      if (!sdk) std::snprintf(pages, sizeof pages, "%.1f", pages_mib);
      char wake[16] = "-", cpu[16] = "-";  // measured for the daemons of run_once only
      if (median.contains("WakeupsPerSec")) {
        std::snprintf(wake, sizeof wake, "%.1f", median["WakeupsPerSec"].get<double>());
        std::snprintf(cpu, sizeof cpu, "%.2f", median["CpuMsPerSec"].get<double>());
      }
      std::printf("%-17s %5d %10.1f %10s %10s %10.1f %10.1f %10.1f %8.0f %9.0f %7s %8s %9s\n", setup.c_str(), a.runs,
                  rss_mib, pages, added, median.value(anon, 0.0) / kKiB, median.value(file, 0.0) / kKiB,
                  median.value("VmHWM", 0.0) / kKiB, median.value("Threads", 0.0),
                  median.value("gpu_libraries", 0.0), has_target ? (meets ? "met" : "MISSED") : "-", wake, cpu);
      report["setups"].push_back({{"setup", setup},
                                  {"median_kib", median},
                                  {"vmrss_mib", rss_mib},
                                  {guest ? "guest_pages_mib" : "pages_mib", sdk ? nlohmann::json() : nlohmann::json(pages_mib)},
                                  {"added_to_app_mib", sdk ? nlohmann::json(added_mib) : nlohmann::json()},
                                  {"meets_target", has_target ? nlohmann::json(meets) : nlohmann::json()},
                                  {"largest_mappings_last_run", last.top},
                                  {"each_run", runs}});
    }
    report["machine"]["load_average_end"] = load_average();
    if (guest)
      std::printf("emulated: 'guest' is the guest's own present pages (its maps as qemu shows them to it), anon/file "
                  "split likewise; VmRSS is qemu's whole process\n");
    std::printf("target: %s (a daemon) or added (an idle SDK client) <= %.0f MiB; load average %.2f -> %.2f; JSON: %s\n",
                guest ? "guest pages" : "VmRSS", kTargetMiB,
                report["machine"]["load_average_start"].get<double>(), load_average(), a.json.c_str());
    cleave::write_json_file(a.json, report);
  } catch (const std::exception& e) {
    std::cerr << "bench_idle_rss: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
