// checkpoint_dir.h: a directory of a run's periodic checkpoints
// (`--checkpoint-dir`), what recovery and `--resume DIR` restore from.
//
// Files are named "step-NNNNNNNNNNNN.ckpt" after the optimizer step (or the
// federated round) they hold, written atomically by the caller's save
// function (core/io/checkpoint.h), and the newest `keep` are kept: after a
// save the older ones are removed. Reading goes newest first: a file that
// fails to load (truncated, corrupted: its checksum) is skipped with a
// note that names it and why (the caller logs it and puts it in its
// result), and the one before it is used.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cleave {

class CheckpointDir {
 public:
  // Creates `dir` (and its parents) when missing; throws std::runtime_error
  // "DIR: why" when it cannot be created or written.
  explicit CheckpointDir(std::string dir, int keep = 2);

  const std::string& dir() const { return dir_; }
  // Where the checkpoint of `step` goes.
  std::string path_for(int64_t step) const;
  // Writes the checkpoint of `step` through `save(path)`, then removes all
  // but the newest `keep`.
  void save(int64_t step, const std::function<void(const std::string& path)>& save);
  // The checkpoints there, newest first: (step, path).
  std::vector<std::pair<int64_t, std::string>> list() const;
  // Removes every checkpoint there (a default directory a new run takes over).
  void remove_checkpoints() const;
  // For a new run starting at `first_step` in a directory it was given:
  // throws std::runtime_error when it holds a later checkpoint — another
  // run's, which would outrank this run's — saying to resume that run with
  // `resume_command` or to give an empty directory.
  void refuse_foreign(int64_t first_step, const std::string& resume_command) const;

  // The newest checkpoint `load(path)` accepts (it throws for one it does
  // not), or nothing when none does. Every file skipped adds "PATH: why" to
  // `skipped`.
  template <typename T>
  std::optional<T> newest(const std::function<T(const std::string& path)>& load, std::vector<std::string>& skipped) const {
    for (const auto& [step, path] : list()) {
      try {
        return load(path);
      } catch (const std::exception& e) {
        skip(path, e.what(), skipped);
      }
    }
    return std::nullopt;
  }

 private:
  void skip(const std::string& path, const std::string& why, std::vector<std::string>& skipped) const;
  std::string dir_;
  int keep_;
};

// A fresh directory for checkpoints when the run names none: "SAVE.checkpoints"
// beside `save_path`, or a new one under $TMPDIR (or /tmp) named after `who`.
std::string default_checkpoint_dir(const std::string& save_path, const std::string& who);

// Removes a run's temporary checkpoint directory `dir` and all in it; with
// `unless_resumable`, only when it holds no checkpoint to resume from (a run
// that failed before its first one). Never throws: a directory it cannot
// read is kept.
void remove_temporary_checkpoint_dir(const std::string& dir, bool unless_resumable);

}  // namespace cleave
