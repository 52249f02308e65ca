// config_file.h: cleaved's configuration file (`--config FILE`, e.g.
// /etc/cleave/cleaved.conf for the systemd unit): one `KEY = VALUE` per line,
// KEY a cleaved flag's name without the dashes, `#` starting a comment, blank
// lines ignored. Values are taken as the flag would take them (a switch: true
// or false). Whatever the file says, the command line overrides.
#pragma once

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace cleave::daemon_config {

struct Entry {
  std::string key, value;
  std::string origin;  // "FILE:LINE"
};

// The entries of `path`, in order. Throws std::runtime_error naming the file
// (and the line) for a file that cannot be read, a line without '=', an
// empty key or value, a key not in `known` (the message lists them) or a key
// given twice.
std::vector<Entry> read_config(const std::string& path, const std::set<std::string>& known);

}  // namespace cleave::daemon_config
