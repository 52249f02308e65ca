// processes.cpp: see processes.h.
#include "apps/common/processes.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <stdexcept>

namespace cleave {
namespace {
std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }
}  // namespace

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() { return g_interrupted; }

std::string find_on_path(const std::vector<std::string>& names) {
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/usr/bin:/bin";
  for (const std::string& name : names) {
    for (size_t start = 0; start <= dirs.size();) {
      const size_t end = std::min(dirs.find(':', start), dirs.size());
      const std::string dir = dirs.substr(start, end - start);
      const std::string candidate = (std::filesystem::path(dir) / name).string();
      if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
      start = end + 1;
    }
  }
  return {};
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string find_cleaved() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path candidate : {self.parent_path() / "cleaved", self.parent_path().parent_path() / "cleaved" / "cleaved"})
      if (fs::exists(candidate)) return candidate.string();
  }
  if (std::string on_path = find_on_path({"cleaved"}); !on_path.empty()) return on_path;
  throw std::runtime_error("cannot find the cleaved binary next to cleave or on PATH: build it (scripts/build.sh)");
}

namespace {

pid_t fork_exec(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("cannot start " + argv.front() + ": fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    if (!log_path.empty()) {
      int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not
// the process: a daemon started from a short-lived thread would get SIGTERM
// with it. Children are therefore forked by one thread that lives as long as
// the process (never destroyed: it may still wait when the process exits).
class Spawner {
 public:
  Spawner() { std::thread([this] { run(); }).detach(); }

  pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path) {
    std::packaged_task<pid_t()> task([&] { return fork_exec(argv, log_path); });
    std::future<pid_t> pid = task.get_future();
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
    return pid.get();  // rethrows fork_exec's error
  }

 private:
  [[noreturn]] void run() {
    for (;;) {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return !tasks_.empty(); });
      std::packaged_task<pid_t()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<pid_t()>> tasks_;
};

}  // namespace

pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  static Spawner* const spawner = new Spawner;
  return spawner->spawn(argv, log_path);
}

void terminate(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) return;
  kill(pid, SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(grace_ms)) {
    if (waitpid(pid, &status, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
}

}  // namespace cleave
