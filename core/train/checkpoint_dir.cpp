// checkpoint_dir.cpp: see checkpoint_dir.h.
#include "core/train/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "core/io/atomic_file.h"

namespace cleave {

namespace fs = std::filesystem;

CheckpointDir::CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(std::max(1, keep)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw std::runtime_error(dir_ + ": cannot create the checkpoint directory: " + ec.message());
  check_writable((fs::path(dir_) / "step-probe.ckpt").string());
}

std::string CheckpointDir::path_for(int64_t step) const {
  char name[40];
  std::snprintf(name, sizeof name, "step-%012lld.ckpt", static_cast<long long>(step));
  return (fs::path(dir_) / name).string();
}

void CheckpointDir::save(int64_t step, const std::function<void(const std::string&)>& save) {
  save(path_for(step));
  const auto all = list();
  for (size_t i = static_cast<size_t>(keep_); i < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i].second, ec);  // an old checkpoint left behind costs disk, nothing else
  }
}

std::vector<std::pair<int64_t, std::string>> CheckpointDir::list() const {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    long long step = -1;
    char tail = 0;
    if (name.size() != 22 || std::sscanf(name.c_str(), "step-%12lld.ckp%c", &step, &tail) != 2 || tail != 't')
      continue;
    out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

void CheckpointDir::remove_checkpoints() const {
  for (const auto& [step, path] : list()) {
    std::error_code ec;
    fs::remove(path, ec);
  }
}

void CheckpointDir::refuse_foreign(int64_t first_step, const std::string& resume_command) const {
  const auto there = list();
  if (there.empty() || there.front().first <= first_step) return;
  throw std::runtime_error("--checkpoint-dir " + dir_ + " already holds " + there.front().second + " (step " +
                           std::to_string(there.front().first) + ") of another run: continue that run with " +
                           resume_command + " " + dir_ + ", or give an empty --checkpoint-dir");
}

void CheckpointDir::skip(const std::string& path, const std::string& why, std::vector<std::string>& skipped) const {
  skipped.push_back(why.rfind(path, 0) == 0 ? why : path + ": " + why);
}

std::string default_checkpoint_dir(const std::string& save_path, const std::string& who) {
  if (!save_path.empty()) return save_path + ".checkpoints";
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + who + "-checkpoints-XXXXXX";
  if (!mkdtemp(pattern.data())) throw std::runtime_error(pattern + ": cannot create a checkpoint directory");
  return pattern;
}

void remove_temporary_checkpoint_dir(const std::string& dir, bool unless_resumable) {
  if (dir.empty()) return;
  try {
    if (unless_resumable && !CheckpointDir(dir).list().empty()) return;
  } catch (const std::exception&) {
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace cleave
