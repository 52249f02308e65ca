// cleave.cpp: the embedding SDK's C API (include/cleave/cleave.h): errors,
// version and the typed option setters. The client is in client.cpp, the
// setter by name (cleave_options_set) in named_options.cpp.
#include "cleave/cleave.h"

#include <zmq.h>

#include <algorithm>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "core/runtime/daemon/fed_client.h"
#include "sdk/internal.h"
#include "transport/keys.h"

namespace cleave::sdk {

thread_local std::string t_last_error;  // cleave_last_error()'s text
thread_local const char* t_entry = "cleave";  // the entry point running on this thread, for messages

void enter(const char* function) { t_entry = function; }

cleave_status fail(cleave_status status, const std::string& message) {
  t_last_error = std::string(t_entry) + ": " + message;
  return status;
}

cleave_status fail_verbatim(cleave_status status, const std::string& message) {
  t_last_error = message;
  return status;
}

cleave_status status_of_current_exception(std::string& message) {
  try {
    throw;
  } catch (const DataCallbackError& e) {
    message = e.what();
    return CLEAVE_ERR_DATA_CALLBACK;
  } catch (const OutOfMemory& e) {
    message = e.what();
    return CLEAVE_ERR_OUT_OF_MEMORY;
  } catch (const std::bad_alloc&) {
    message = "out of host memory";
    return CLEAVE_ERR_OUT_OF_MEMORY;
  } catch (const std::invalid_argument& e) {
    message = e.what();
    return CLEAVE_ERR_INVALID_ARGUMENT;
  } catch (const std::runtime_error& e) {  // bad input: a key file, a backend, a data file
    message = e.what();
    return CLEAVE_ERR_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    message = std::string("internal error: ") + e.what();
    return CLEAVE_ERR_INTERNAL;
  } catch (...) {
    message = "internal error: an unknown exception";
    return CLEAVE_ERR_INTERNAL;
  }
}

bool is_device_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '_' || ch == '-';
  });
}

transport::LogLevel log_level_named(const std::string& name) {
  if (name == "debug") return transport::LogLevel::kDebug;
  if (name == "info") return transport::LogLevel::kInfo;
  if (name == "warning") return transport::LogLevel::kWarning;
  if (name == "error") return transport::LogLevel::kError;
  throw std::invalid_argument("log level '" + name + "' is not debug, info, warning or error");
}

}  // namespace cleave::sdk

namespace {

using cleave::sdk::fail;
using cleave::sdk::guarded;

// A Z85 CURVE key: 40 characters that decode to 32 bytes.
bool is_z85_key(const char* text) {
  if (std::string(text).size() != 40) return false;
  uint8_t bytes[32];
  return zmq_z85_decode(bytes, text) != nullptr;
}

}  // namespace

// ---- Status and version

extern "C" const char* cleave_last_error(void) { return cleave::sdk::t_last_error.c_str(); }

extern "C" const char* cleave_version(void) { return CLEAVE_VERSION_STRING; }

// ---- Options

extern "C" cleave_status cleave_options_create(cleave_options** out) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(out, "out is null");
    *out = new cleave_options();
    (*out)->daemon.max_jobs = -1;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_destroy(cleave_options* options) {
  delete options;
  return CLEAVE_OK;
}

extern "C" cleave_status cleave_options_set_coordinator(cleave_options* options, const char* endpoint) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && endpoint, "options or endpoint is null");
    const std::string e = endpoint;
    CLEAVE_REQUIRE(e.rfind("tcp://", 0) == 0 && e.size() > 6, "the coordinator endpoint '" + e + "' is not tcp://HOST:PORT");
    options->daemon.coordinator = e;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_key_files(cleave_options* options, const char* secret_key_path,
                                                      const char* coordinator_public_key_path) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && secret_key_path && coordinator_public_key_path, "options or a key path is null");
    cleave::transport::load_secret_key(secret_key_path);  // throws naming the file
    cleave::transport::load_public_key(coordinator_public_key_path);
    options->daemon.key_path = secret_key_path;
    options->daemon.coordinator_key_path = coordinator_public_key_path;
    options->daemon.secret_key_z85.clear();
    options->daemon.coordinator_key_z85.clear();
    options->keys_set = true;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_keys_z85(cleave_options* options, const char* secret_key_z85,
                                                     const char* coordinator_public_key_z85) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && secret_key_z85 && coordinator_public_key_z85, "options or a key is null");
    CLEAVE_REQUIRE(is_z85_key(secret_key_z85), "the secret key is not a Z85 CURVE key (40 characters)");
    CLEAVE_REQUIRE(is_z85_key(coordinator_public_key_z85),
                   "the coordinator's public key is not a Z85 CURVE key (40 characters)");
    cleave::transport::public_key_of(secret_key_z85);
    options->daemon.secret_key_z85 = secret_key_z85;
    options->daemon.coordinator_key_z85 = coordinator_public_key_z85;
    options->daemon.key_path.clear();
    options->daemon.coordinator_key_path.clear();
    options->keys_set = true;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_name(cleave_options* options, const char* name) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && name, "options or name is null");
    CLEAVE_REQUIRE(cleave::sdk::is_device_name(name), std::string("the device name '") + name + "' is not 1..64 of [A-Za-z0-9._-]");
    options->daemon.name = name;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_backend(cleave_options* options, const char* backend, int threads) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && backend, "options or backend is null");
    const std::string b = backend;
    CLEAVE_REQUIRE(b == "auto" || b == "cpu" || b == "opencl" || b == "cuda",
                   "backend '" + b + "' is not auto, cpu, opencl or cuda");
    CLEAVE_REQUIRE(threads >= 0, "threads must be >= 0 (0 = all cores)");
    options->daemon.backend = b;
    options->daemon.threads = threads;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_memory_limit(cleave_options* options, uint64_t bytes) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options, "options is null");
    options->daemon.memory_limit = static_cast<size_t>(bytes);
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_bandwidth_limit(cleave_options* options, double bytes_per_second) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options, "options is null");
    CLEAVE_REQUIRE(bytes_per_second >= 0 && bytes_per_second < 1e18, "the bandwidth limit must be >= 0 bytes/s");
    options->daemon.bandwidth_limit = bytes_per_second;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_connect_timeout(cleave_options* options, int ms) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options, "options is null");
    CLEAVE_REQUIRE(ms >= 0, "the connect timeout must be >= 0 ms (0 = keep trying)");
    options->daemon.connect_timeout_ms = ms;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_max_jobs(cleave_options* options, int jobs) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options, "options is null");
    CLEAVE_REQUIRE(jobs >= 0, "max_jobs must be >= 0 (0 = serve until released)");
    options->daemon.max_jobs = jobs == 0 ? -1 : jobs;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_role(cleave_options* options, cleave_role role) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options, "options is null");
    CLEAVE_REQUIRE(role >= CLEAVE_ROLE_STAGE && role <= CLEAVE_ROLE_DATA_CLIENT,
                   "unknown role " + std::to_string(static_cast<int>(role)));
    options->role = role;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_data(cleave_options* options, int64_t num_samples,
                                                 const int64_t* sample_shape, int sample_dims, int num_classes,
                                                 const char* shard, cleave_fill_fn fill, void* user) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && sample_shape && shard && fill, "options, sample_shape, shard or fill is null");
    CLEAVE_REQUIRE(num_samples > 0, "num_samples must be positive");
    CLEAVE_REQUIRE(sample_dims >= 1 && sample_dims <= 4, "sample_dims must be 1 to 4");
    CLEAVE_REQUIRE(num_classes >= 0, "num_classes must be >= 0 (0 = regression targets)");
    cleave::sdk::AppData d;
    d.shape.assign(sample_shape, sample_shape + sample_dims);
    int64_t numel = 1;
    for (int64_t n : d.shape) {
      CLEAVE_REQUIRE(n > 0 && n <= (int64_t{1} << 24), "every sample dimension must be in [1, 2^24]");
      numel *= n;
    }
    CLEAVE_REQUIRE(numel <= (int64_t{1} << 28) && num_samples <= (int64_t{1} << 40) / numel,
                   "the data is too large to hold in memory");
    int index = 0, count = 1;
    cleave::parse_shard_spec(shard, index, count);  // std::invalid_argument naming the problem
    d.samples = num_samples;
    d.num_classes = num_classes;
    d.fill = fill;
    d.user = user;
    options->data = d;
    options->daemon.fed.shard = index;
    options->daemon.fed.num_shards = count;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_test_data(cleave_options* options, int64_t num_samples,
                                                      cleave_fill_fn fill, void* user) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && fill, "options or fill is null");
    CLEAVE_REQUIRE(options->data.fill, "call cleave_options_set_data first: the test samples take its shape and classes");
    CLEAVE_REQUIRE(num_samples > 0, "num_samples must be positive");
    const int64_t numel = cleave::numel(options->data.shape);
    CLEAVE_REQUIRE(num_samples <= (int64_t{1} << 40) / numel, "the test data is too large to hold in memory");
    cleave::sdk::AppData t = options->data;
    t.samples = num_samples;
    t.fill = fill;
    t.user = user;
    options->test_data = t;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_progress_callback(cleave_options* options, cleave_progress_fn fn,
                                                              void* user) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options, "options is null");
    options->progress = fn;
    options->progress_user = user;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_options_set_log_callback(cleave_options* options, cleave_log_fn fn, void* user) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options, "options is null");
    options->log = fn;
    options->log_user = user;
    return CLEAVE_OK;
  });
}

