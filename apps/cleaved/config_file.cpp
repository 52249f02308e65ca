// config_file.cpp: see config_file.h.
#include "apps/cleaved/config_file.h"

#include <fstream>
#include <map>

namespace cleave::daemon_config {
namespace {

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

std::string listed(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::vector<Entry> read_config(const std::string& path, const std::set<std::string>& known) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read the configuration file");
  std::vector<Entry> out;
  std::map<std::string, std::string> seen;  // key -> where
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string where = path + ":" + std::to_string(n);
    const std::string text = trimmed(line.substr(0, line.find('#')));
    if (text.empty()) continue;
    const size_t eq = text.find('=');
    if (eq == std::string::npos) throw std::runtime_error(where + ": expected KEY = VALUE, got '" + text + "'");
    Entry e{trimmed(text.substr(0, eq)), trimmed(text.substr(eq + 1)), where};
    if (e.key.empty() || e.value.empty()) throw std::runtime_error(where + ": expected KEY = VALUE, got '" + text + "'");
    if (!known.count(e.key))
      throw std::runtime_error(where + ": unknown key '" + e.key + "' (keys: " + listed(known) + ")");
    if (auto it = seen.find(e.key); it != seen.end())
      throw std::runtime_error(where + ": '" + e.key + "' is already set at " + it->second);
    seen[e.key] = where;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace cleave::daemon_config
