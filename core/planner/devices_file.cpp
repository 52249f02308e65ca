// devices_file.cpp: parsing and writing device / link description files.
#include "core/planner/devices_file.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include "core/io/untrusted_json.h"

namespace cleave {

using nlohmann::json;

namespace {

std::runtime_error file_error(const std::string& source, const std::string& what) {
  return std::runtime_error(source + ": " + what);
}

void check_fields(const json& obj, std::initializer_list<const char*> allowed, const std::string& source,
                  const std::string& where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (const char* a : allowed) ok |= it.key() == a;
    if (!ok) {
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
      throw file_error(source, where + ": unknown field '" + it.key() + "' (known: " + list + ")");
    }
  }
}

double get_number(const json& obj, const char* key, const std::string& source, const std::string& where,
                  bool required, double fallback) {
  if (!obj.contains(key)) {
    if (required) throw file_error(source, where + ": missing field '" + key + "'");
    return fallback;
  }
  const json& v = obj[key];
  if (!v.is_number()) throw file_error(source, where + ": " + key + ": expected a number, got " + json_excerpt(v));
  return v.get<double>();
}

LinkProfile parse_link_fields(const json& obj, const std::string& source, const std::string& where) {
  LinkProfile l;
  l.mbps = get_number(obj, "mbps", source, where, true, 0);
  if (!std::isfinite(l.mbps) || l.mbps <= 0)
    throw file_error(source, where + ": mbps: expected a positive bandwidth in Mbit/s, got " + json_excerpt(obj["mbps"]));
  l.latency_ms = get_number(obj, "latency_ms", source, where, false, 0);
  if (!std::isfinite(l.latency_ms) || l.latency_ms < 0)
    throw file_error(source, where + ": latency_ms: expected a number >= 0, got " + json_excerpt(obj["latency_ms"]));
  if (obj.contains("cpu_mbps")) {
    l.cpu_mbps = get_number(obj, "cpu_mbps", source, where, true, 0);
    if (!std::isfinite(*l.cpu_mbps) || *l.cpu_mbps <= 0)
      throw file_error(source, where + ": cpu_mbps: expected a positive rate in Mbit/s, got " +
                                   json_excerpt(obj["cpu_mbps"]));
  }
  if (obj.contains("encoding")) {
    const json& e = obj["encoding"];
    if (!e.is_string()) throw file_error(source, where + ": encoding: expected \"f32\", \"f16\" or \"int8\", got " + json_excerpt(e));
    try {
      l.encoding = transport::parse_encoding(e.get<std::string>());
    } catch (const std::invalid_argument& ex) {
      throw file_error(source, where + ": encoding: " + ex.what());
    }
  }
  return l;
}

}  // namespace

int64_t parse_memory_size(const json& value) {
  const char* forms = "expected bytes (an integer) or a size such as \"512M\", \"4G\", \"1.5GiB\"";
  if (value.is_number_integer() || value.is_number_unsigned()) {
    const int64_t v = value.get<int64_t>();
    if (v < 0) throw std::invalid_argument(std::string("negative memory size; ") + forms);
    return v;
  }
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (!std::isfinite(v) || v < 0 || v != std::floor(v) || v > 9.0e18)
      throw std::invalid_argument(std::string("not a whole number of bytes: ") + json_excerpt(value) + "; " + forms);
    return static_cast<int64_t>(v);
  }
  if (!value.is_string()) throw std::invalid_argument(std::string(forms) + ", got " + json_excerpt(value));
  const std::string s = value.get<std::string>();
  size_t pos = 0;
  while (pos < s.size() && (std::isdigit(static_cast<unsigned char>(s[pos])) || s[pos] == '.')) ++pos;
  const std::string number = s.substr(0, pos);
  std::string suffix = s.substr(pos);
  while (!suffix.empty() && suffix.front() == ' ') suffix.erase(suffix.begin());
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1)
    throw std::invalid_argument(std::string(forms) + ", got \"" + s + "\"");
  const double v = std::stod(number);
  std::string u;
  for (char ch : suffix) u += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (u.size() >= 2 && u.back() == 'B') u.pop_back();  // "GB", "GiB" -> "G", "GI"
  if (u.size() == 2 && u[1] == 'I') u.pop_back();       // "GI" -> "G"
  double mult;
  if (u.empty() || u == "B") mult = 1;
  else if (u == "K") mult = 1024.0;
  else if (u == "M") mult = 1024.0 * 1024;
  else if (u == "G") mult = 1024.0 * 1024 * 1024;
  else if (u == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw std::invalid_argument("unknown size suffix '" + suffix + "' in \"" + s + "\"; " + forms);
  const double bytes = std::floor(v * mult);
  if (!std::isfinite(bytes) || bytes > 9.0e18) throw std::invalid_argument("memory size too large: \"" + s + "\"");
  return static_cast<int64_t>(bytes);
}

namespace {
// d[key]: one number >= 0 per layer (`what` says what each is).
std::vector<double> read_seconds(const json& d, const char* key, const char* what, const std::string& source,
                                 const std::string& where) {
  const json& t = d[key];
  if (!t.is_array()) throw file_error(source, where + ": " + key + ": expected an array of " + what);
  std::vector<double> secs;
  for (size_t j = 0; j < t.size(); ++j) {
    if (!t[j].is_number() || !std::isfinite(t[j].get<double>()) || t[j].get<double>() < 0)
      throw file_error(source, where + ": " + key + "[" + std::to_string(j) + "]: expected a number >= 0, got " +
                                   json_excerpt(t[j]));
    secs.push_back(t[j].get<double>());
  }
  return secs;
}
}  // namespace

Cluster parse_cluster(const json& doc, const std::string& source) {
  if (!doc.is_object()) throw file_error(source, "expected a JSON object with \"devices\"");
  check_fields(doc, {"devices", "links", "default_link", "description"}, source, "top level");
  if (!doc.contains("devices") || !doc["devices"].is_array() || doc["devices"].empty())
    throw file_error(source, "\"devices\": expected a non-empty array of {\"name\", \"memory\", \"gflops\"}");
  Cluster c;
  const json& devices = doc["devices"];
  for (size_t i = 0; i < devices.size(); ++i) {
    const json& d = devices[i];
    std::string where = "devices[" + std::to_string(i) + "]";
    if (!d.is_object()) throw file_error(source, where + ": expected an object, got " + json_excerpt(d));
    if (!d.contains("name") || !d["name"].is_string() || d["name"].get<std::string>().empty())
      throw file_error(source, where + ": missing or empty \"name\"");
    DeviceProfile dev;
    dev.name = d["name"].get<std::string>();
    where += " ('" + dev.name + "')";
    check_fields(d, {"name", "memory", "gflops", "layer_seconds", "layer_microbatch_seconds", "update_seconds_per_param", "host", "host_cores",
                     "cpu_threads", "host_contention", "backend", "address", "description"}, source, where);
    if (c.index_of(dev.name) >= 0) throw file_error(source, where + ": duplicate device name '" + dev.name + "'");
    if (!d.contains("memory")) throw file_error(source, where + ": missing field 'memory'");
    try {
      dev.memory_bytes = parse_memory_size(d["memory"]);
    } catch (const std::invalid_argument& e) {
      throw file_error(source, where + ": memory: " + e.what());
    }
    const bool measured = d.contains("layer_seconds");
    dev.gflops = get_number(d, "gflops", source, where, !measured, 0);
    if (!std::isfinite(dev.gflops) || dev.gflops < 0 || (!measured && dev.gflops == 0))
      throw file_error(source, where + ": gflops: expected a positive number (sustained GFLOP/s), got " + json_excerpt(d["gflops"]));
    if (measured) dev.layer_seconds_per_sample = read_seconds(d, "layer_seconds", "seconds per sample", source, where);
    if (d.contains("layer_microbatch_seconds")) {
      if (!measured) throw file_error(source, where + ": layer_microbatch_seconds needs layer_seconds too");
      dev.layer_seconds_per_microbatch =
          read_seconds(d, "layer_microbatch_seconds", "fixed seconds per micro-batch", source, where);
    }
    if (d.contains("host")) {
      if (!d["host"].is_string()) throw file_error(source, where + ": host: expected a string naming the machine");
      dev.host = d["host"].get<std::string>();
      dev.host_cores = get_number(d, "host_cores", source, where, true, 0);
      dev.cpu_threads = get_number(d, "cpu_threads", source, where, true, 0);
      if (!(dev.host_cores > 0) || !std::isfinite(dev.host_cores) || !(dev.cpu_threads >= 0) || !std::isfinite(dev.cpu_threads))
        throw file_error(source, where + ": host_cores must be > 0 and cpu_threads >= 0");
      if (d.contains("host_contention")) {
        dev.host_contention = get_number(d, "host_contention", source, where, true, 0);
        if (!(*dev.host_contention > 0) || !std::isfinite(*dev.host_contention))
          throw file_error(source, where + ": host_contention must be > 0 (how much slower the device computes beside "
                                           "the others on its host, 1: not at all)");
      }
    } else if (d.contains("host_cores") || d.contains("cpu_threads") || d.contains("host_contention")) {
      throw file_error(source, where + ": host_cores, cpu_threads and host_contention need \"host\" (the machine's name)");
    }
    if (d.contains("backend")) {
      const json& b = d["backend"];
      if (b.is_string()) dev.backend = backend_named(b.get<std::string>());
      if (!dev.backend) throw file_error(source, where + ": backend: expected \"cpu\", \"opencl\" or \"cuda\", got " + json_excerpt(b));
    }
    if (d.contains("update_seconds_per_param")) {
      dev.update_seconds_per_param = get_number(d, "update_seconds_per_param", source, where, true, 0);
      if (!std::isfinite(dev.update_seconds_per_param) || dev.update_seconds_per_param < 0)
        throw file_error(source, where + ": update_seconds_per_param: expected a number >= 0, got " +
                                     json_excerpt(d["update_seconds_per_param"]));
    }
    c.devices.push_back(std::move(dev));
  }
  if (doc.contains("default_link")) {
    const json& l = doc["default_link"];
    if (!l.is_object()) throw file_error(source, "default_link: expected {\"mbps\", \"latency_ms\"}");
    check_fields(l, {"mbps", "latency_ms", "cpu_mbps", "encoding"}, source, "default_link");
    c.default_link = parse_link_fields(l, source, "default_link");
  }
  if (doc.contains("links")) {
    const json& links = doc["links"];
    if (!links.is_array()) throw file_error(source, "\"links\": expected an array of {\"from\", \"to\", \"mbps\"}");
    std::set<std::pair<int, int>> given;
    std::vector<std::pair<std::pair<int, int>, LinkProfile>> parsed;
    for (size_t i = 0; i < links.size(); ++i) {
      const json& l = links[i];
      std::string where = "links[" + std::to_string(i) + "]";
      if (!l.is_object()) throw file_error(source, where + ": expected an object, got " + json_excerpt(l));
      check_fields(l, {"from", "to", "mbps", "latency_ms", "cpu_mbps", "encoding", "description"}, source, where);
      int ends[2];
      const char* keys[2] = {"from", "to"};
      for (int e = 0; e < 2; ++e) {
        if (!l.contains(keys[e]) || !l[keys[e]].is_string())
          throw file_error(source, where + ": missing or non-string '" + keys[e] + "'");
        ends[e] = c.index_of(l[keys[e]].get<std::string>());
        if (ends[e] < 0)
          throw file_error(source, where + ": " + keys[e] + ": no device named '" + l[keys[e]].get<std::string>() + "'");
      }
      where += " (" + c.devices[ends[0]].name + " -> " + c.devices[ends[1]].name + ")";
      if (ends[0] == ends[1]) throw file_error(source, where + ": a link needs two different devices");
      if (!given.insert({ends[0], ends[1]}).second) throw file_error(source, where + ": this link is given twice");
      parsed.push_back({{ends[0], ends[1]}, parse_link_fields(l, source, where)});
    }
    for (const auto& [key, l] : parsed) c.set_link(key.first, key.second, l);
    for (const auto& [key, l] : parsed)  // symmetric unless the reverse is given
      if (!given.count({key.second, key.first})) c.set_link(key.second, key.first, l);
  }
  return c;
}

Cluster load_cluster(const std::string& path) {
  // A devices file may come from anyone: size and depth are bounded before parsing.
  return parse_cluster(read_untrusted_json_file(path, kFileJsonLimits, "devices file"), path);
}

namespace {
json link_json(const LinkProfile& l) {
  json j = {{"mbps", l.mbps}, {"latency_ms", l.latency_ms}};
  if (l.encoding) j["encoding"] = transport::encoding_name(*l.encoding);
  if (l.cpu_mbps) j["cpu_mbps"] = *l.cpu_mbps;
  return j;
}
}  // namespace

json cluster_to_json(const Cluster& c) {
  json devices = json::array();
  for (const DeviceProfile& d : c.devices) {
    json j = {{"name", d.name}, {"memory", d.memory_bytes}, {"gflops", d.gflops}};
    if (d.layer_seconds_per_sample) j["layer_seconds"] = *d.layer_seconds_per_sample;
    if (d.layer_seconds_per_microbatch) j["layer_microbatch_seconds"] = *d.layer_seconds_per_microbatch;
    if (d.update_seconds_per_param > 0) j["update_seconds_per_param"] = d.update_seconds_per_param;
    if (d.backend) j["backend"] = backend_name(*d.backend);
    if (!d.host.empty()) {
      j["host"] = d.host;
      j["host_cores"] = d.host_cores;
      j["cpu_threads"] = d.cpu_threads;
      if (d.host_contention) j["host_contention"] = *d.host_contention;
    }
    devices.push_back(std::move(j));
  }
  json links = json::array();
  for (const auto& [key, l] : c.links) {
    json j = link_json(l);
    j["from"] = c.devices.at(key.first).name;
    j["to"] = c.devices.at(key.second).name;
    links.push_back(std::move(j));
  }
  return {{"devices", devices}, {"links", links}, {"default_link", link_json(c.default_link)}};
}

void write_devices_file(const std::string& path, const Cluster& cluster) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error(path + ": cannot write devices file: " + std::strerror(errno));
  out << cluster_to_json(cluster).dump(2) << "\n";
  if (!out) throw std::runtime_error(path + ": write failed");
}

}  // namespace cleave
