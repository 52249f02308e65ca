// named_options.cpp: cleave_options_set (include/cleave/cleave.h), every
// option by the name of its `cleaved` flag, from text. `cleaved` is a thin
// program over this: its flags go in here unchanged, so the daemon and an app
// parse and check each value with the same code.
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "core/data/shard.h"
#include "core/monitor/listen_address.h"
#include "core/runtime/daemon/fed_client.h"
#include "sdk/internal.h"
#include "transport/keys.h"
#include "transport/link.h"

namespace {

using cleave::sdk::fail;
using cleave::sdk::guarded;

// The whole of `text` as an integer in [lo, hi]; throws naming the range.
long long integer_in(const std::string& text, long long lo, long long hi) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < lo || v > hi)
    throw std::invalid_argument("'" + text + "' is not a whole number in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  return v;
}

double number_at_least(const std::string& text, double lo) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= lo) || v > 1e9)
    throw std::invalid_argument("'" + text + "' is not a number >= " + std::to_string(lo).substr(0, 3));
  return v;
}

bool switch_value(const std::string& text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  throw std::invalid_argument("'" + text + "' is not true or false");
}

cleave_role role_named(const std::string& text) {
  if (text == "stage") return CLEAVE_ROLE_STAGE;
  if (text == "fed-client") return CLEAVE_ROLE_FED_CLIENT;
  if (text == "split-client") return CLEAVE_ROLE_SPLIT_CLIENT;
  if (text == "data-client") return CLEAVE_ROLE_DATA_CLIENT;
  throw std::invalid_argument("'" + text + "' is not stage, fed-client, split-client or data-client");
}

// A typed setter's status, its message (without the setter's own name) thrown for the caller to rename.
void check_typed(cleave_status s) {
  if (s == CLEAVE_OK) return;
  std::string message = cleave_last_error();
  const size_t colon = message.find(": ");
  if (colon != std::string::npos) message = message.substr(colon + 2);
  throw std::invalid_argument(message);
}

void refresh_keys_set(cleave_options& o) {
  const cleave::DaemonOptions& d = o.daemon;
  o.keys_set = (!d.key_path.empty() && !d.coordinator_key_path.empty()) ||
               (!d.secret_key_z85.empty() && !d.coordinator_key_z85.empty());
}

using Setter = std::function<void(cleave_options&, const std::string&)>;

// The options that are files, names and switches of the daemon itself.
void add_daemon_setters(std::map<std::string, Setter>& t) {
  t["coordinator"] = [](cleave_options& o, const std::string& v) {
    check_typed(cleave_options_set_coordinator(&o, v.c_str()));
  };
  t["key"] = [](cleave_options& o, const std::string& v) {
    cleave::transport::load_secret_key(v);  // throws naming the file
    o.daemon.key_path = v;
    o.daemon.secret_key_z85.clear();
    refresh_keys_set(o);
  };
  t["coordinator-key"] = [](cleave_options& o, const std::string& v) {
    cleave::transport::load_public_key(v);
    o.daemon.coordinator_key_path = v;
    o.daemon.coordinator_key_z85.clear();
    refresh_keys_set(o);
  };
  t["name"] = [](cleave_options& o, const std::string& v) { check_typed(cleave_options_set_name(&o, v.c_str())); };
  t["backend"] = [](cleave_options& o, const std::string& v) {
    check_typed(cleave_options_set_backend(&o, v.c_str(), o.daemon.threads));
  };
  t["threads"] = [](cleave_options& o, const std::string& v) {
    o.daemon.threads = static_cast<int>(integer_in(v, 0, 1 << 16));
  };
  t["memory-limit"] = [](cleave_options& o, const std::string& v) { o.daemon.memory_limit = cleave::parse_bytes(v); };
  t["bandwidth-limit"] = [](cleave_options& o, const std::string& v) {
    o.daemon.bandwidth_limit = cleave::transport::parse_bandwidth(v);
  };
  t["connect-timeout"] = [](cleave_options& o, const std::string& v) {
    o.daemon.connect_timeout_ms = static_cast<int>(number_at_least(v, 0) * 1000);
  };
  t["max-jobs"] = [](cleave_options& o, const std::string& v) {
    const int jobs = static_cast<int>(integer_in(v, 0, std::numeric_limits<int>::max()));
    o.daemon.max_jobs = jobs == 0 ? -1 : jobs;
  };
  t["role"] = [](cleave_options& o, const std::string& v) { o.role = role_named(v); };
  t["peer-bind"] = [](cleave_options& o, const std::string& v) {
    if (v.rfind("tcp://", 0) != 0 || v.size() <= 6) throw std::invalid_argument("'" + v + "' is not tcp://IP:PORT");
    o.daemon.peer_bind = v;
  };
  t["coordinator-timeout"] = [](cleave_options& o, const std::string& v) {
    o.daemon.coordinator_timeout_ms = static_cast<int>(integer_in(v, 1, std::numeric_limits<int>::max()));
  };
  t["insecure"] = [](cleave_options& o, const std::string& v) { o.daemon.insecure = switch_value(v); };
  t["metrics-listen"] = [](cleave_options& o, const std::string& v) {
    cleave::monitor::parse_listen_address(v);  // throws saying what HOST:PORT is; binding waits for the start
    o.daemon.metrics_listen = v;
  };
  t["log-level"] = [](cleave_options& o, const std::string& v) {
    cleave::sdk::log_level_named(v);
    o.log_level = v;
  };
}

// The options of data read from a file (docs/data.md), as cleaved's --dataset and friends.
void add_data_setters(std::map<std::string, Setter>& t) {
  t["dataset"] = [](cleave_options& o, const std::string& v) {
    if (v.empty()) throw std::invalid_argument("give fashion-mnist, a CSV file or an IDX directory");
    o.daemon.fed.dataset = v;
  };
  t["data"] = t["dataset"];
  t["dataset-dir"] = [](cleave_options& o, const std::string& v) { o.daemon.fed.dataset_dir = v; };
  t["shard"] = [](cleave_options& o, const std::string& v) {
    cleave::parse_shard_spec(v, o.daemon.fed.shard, o.daemon.fed.num_shards);
  };
  t["partition"] = [](cleave_options& o, const std::string& v) {
    cleave::parse_shard_scheme(v);
    o.daemon.fed.partition = v;
  };
  t["seed"] = [](cleave_options& o, const std::string& v) {
    o.daemon.fed.seed = static_cast<uint64_t>(integer_in(v, 0, std::numeric_limits<long long>::max()));
  };
  t["limit-train"] = [](cleave_options& o, const std::string& v) {
    o.daemon.fed.limit = integer_in(v, 1, std::numeric_limits<long long>::max());
  };
  t["poison"] = [](cleave_options& o, const std::string& v) {
    if (const std::string why = cleave::fed_poison_refusal(v); !why.empty()) throw std::invalid_argument(why);
    o.daemon.fed.poison = v;
  };
}

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = [] {
    std::map<std::string, Setter> t;
    add_daemon_setters(t);
    add_data_setters(t);
    return t;
  }();
  return table;
}

std::string known_names() {
  std::string names;
  for (const auto& [name, setter] : setters()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

}  // namespace

extern "C" cleave_status cleave_options_set(cleave_options* options, const char* name, const char* value) {
  static constexpr const char* kEntry = "cleave_options_set";
  return guarded(kEntry, [&] {
    CLEAVE_REQUIRE(options && name && value, "options, name or value is null");
    const auto it = setters().find(name);
    CLEAVE_REQUIRE(it != setters().end(), std::string("unknown option '") + name + "' (options: " + known_names() + ")");
    cleave_options updated = *options;  // a bad value leaves the options as they were
    try {
      it->second(updated, value);
    } catch (const std::exception& e) {
      cleave::sdk::enter(kEntry);  // a typed setter ran inside
      return fail(CLEAVE_ERR_INVALID_ARGUMENT, std::string(name) + ": " + e.what());
    }
    *options = updated;
    return CLEAVE_OK;
  });
}
