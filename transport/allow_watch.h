// allow_watch.h: noticing that an allow-list on disk changed (key revocation).
//
// A coordinator admits the keys of its allow-list (a directory of *.pub files
// or one key file, keys.h). Removing or replacing a file there revokes a key
// without a restart: an AllowListWatcher fingerprints the path (each entry's
// name, size and modification time) and re-reads it when the fingerprint
// changes, and whenever request_allow_list_reload() was called since its last
// poll (the coordinator's SIGHUP handler calls it: a file replaced in place
// with the same size and time is seen only then). ServerEndpoint runs one when
// ServerOptions::allow_path is set (endpoint.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "transport/keys.h"

namespace cleave::transport {

// Asks every watcher to re-read its allow-list at its next poll.
// Async-signal-safe (one lock-free atomic increment): call it from a SIGHUP handler.
void request_allow_list_reload();

class AllowListWatcher {
 public:
  // Fingerprints `path` now (the list the server started with was read from it).
  explicit AllowListWatcher(std::filesystem::path path);

  // The re-read list when the path changed or a reload was requested since the
  // last call; nullopt otherwise. A directory without *.pub files is an empty
  // list (every key revoked). A list that cannot be read (a malformed file,
  // perhaps half written) is logged as an error naming the file, and nullopt
  // is returned: the previous list stays until the path changes again.
  // `label` prefixes the log lines.
  std::optional<AllowList> poll(const std::string& label);

  // Whether request_allow_list_reload() was called since the last poll.
  bool reload_requested() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::string fingerprint_;
  uint64_t generation_;
};

}  // namespace cleave::transport
