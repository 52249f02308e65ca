// cleave.cpp: the embedding SDK's C API (include/cleave/cleave.h) over the
// daemon library: a cleave_options becomes DaemonOptions, a started client
// runs run_daemon (core/runtime/daemon/daemon.h) on a thread it owns.
//
// Every entry point is `guarded`: whatever is thrown inside becomes a status
// and a thread-local message (the way CLBlast's clblast.cpp dispatches its
// exceptions), so nothing C++ crosses the boundary.
#include "cleave/cleave.h"

#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/data/dataset.h"
#include "core/runtime/daemon/daemon.h"
#include "core/runtime/daemon/fed_client.h"
#include "device/device.h"
#include "transport/keys.h"
#include "transport/log.h"

namespace {

thread_local std::string t_last_error;
thread_local const char* t_entry = "cleave";  // the entry point running on this thread, for messages

// The app's data callback failed, returned short or gave invalid samples.
struct DataCallbackError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Records `message` (prefixed with the entry point) as this thread's last error.
cleave_status fail(cleave_status status, const std::string& message) {
  t_last_error = std::string(t_entry) + ": " + message;
  return status;
}

// The status (and message) of the exception being handled; call inside a catch.
cleave_status status_of_current_exception(std::string& message) {
  try {
    throw;
  } catch (const DataCallbackError& e) {
    message = e.what();
    return CLEAVE_ERR_DATA_CALLBACK;
  } catch (const cleave::OutOfMemory& e) {
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

// Runs an entry point's body; nothing it throws escapes.
template <typename Body>
cleave_status guarded(const char* function, Body&& body) noexcept {
  t_entry = function;
  try {
    return body();
  } catch (...) {
    std::string message;
    const cleave_status s = status_of_current_exception(message);
    return fail(s, message);
  }
}

#define CLEAVE_REQUIRE(cond, what)                                                            \
  do {                                                                                        \
    if (!(cond)) return fail(CLEAVE_ERR_INVALID_ARGUMENT, what);                                \
  } while (false)

// A Z85 CURVE key: 40 characters that decode to 32 bytes.
bool is_z85_key(const char* text) {
  if (std::string(text).size() != 40) return false;
  uint8_t bytes[32];
  return zmq_z85_decode(bytes, text) != nullptr;
}

bool is_device_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
           ch == '_' || ch == '-';
  });
}

// What cleave_options_set_data describes.
struct AppData {
  int64_t samples = 0;
  cleave::Shape shape;
  int num_classes = 0;
  cleave_fill_fn fill = nullptr;
  void* user = nullptr;
};

}  // namespace

struct cleave_options {
  cleave::DaemonOptions daemon;
  bool keys_set = false;
  cleave_role role = CLEAVE_ROLE_STAGE;
  AppData data;
  cleave_progress_fn progress = nullptr;
  void* progress_user = nullptr;
  cleave_log_fn log = nullptr;
  void* log_user = nullptr;
};

struct cleave_client {
  cleave_options options;
  std::atomic<bool> stop{false};
  std::atomic<bool> release{false};
  std::thread thread;
  std::thread::id thread_id;  // the client's thread, once started
  mutable std::mutex mutex;   // guards everything below
  std::condition_variable ended_cv;
  bool started = false;
  bool ended = false;
  cleave_status result = CLEAVE_OK;
  std::string result_message;
  cleave_client_info info{};
  std::string no_coordinator_message;
  bool refused_key = false;
};

namespace {

// ---- Logging: one process-wide sink fanning out to the clients that asked.

std::mutex g_log_mutex;
std::vector<const cleave_client*> g_log_clients;

void log_to_clients(cleave::transport::LogLevel level, std::string_view line) {
  const std::string text(line);
  std::lock_guard<std::mutex> lock(g_log_mutex);
  for (const cleave_client* c : g_log_clients) {
    try {
      c->options.log(c->options.log_user, static_cast<cleave_log_level>(level), text.c_str());
    } catch (...) {  // an app's C++ callback that throws: the line is lost, nothing else
    }
  }
}

void add_log_client(const cleave_client* c) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log_clients.push_back(c);
  if (g_log_clients.size() == 1) cleave::transport::set_log_sink(log_to_clients);
}

void remove_log_client(const cleave_client* c) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log_clients.erase(std::remove(g_log_clients.begin(), g_log_clients.end(), c), g_log_clients.end());
  if (g_log_clients.empty()) cleave::transport::set_log_sink({});
}

// ---- The client's thread.

// Reads the app's samples through its callback, 256 at a time; throws
// DataCallbackError when it fails, returns short or gives invalid labels.
std::shared_ptr<const cleave::Dataset> read_app_data(const AppData& app, const std::atomic<bool>& stop) {
  auto data = std::make_shared<cleave::Dataset>();
  data->name = "app";
  data->sample_shape = app.shape;
  data->num_classes = app.num_classes;
  const int64_t per = data->sample_numel();
  data->x.resize(static_cast<size_t>(app.samples * per));
  data->y.resize(static_cast<size_t>(app.samples));
  constexpr int64_t kChunk = 256;
  std::vector<int64_t> indices;
  for (int64_t lo = 0; lo < app.samples && !stop; lo += kChunk) {
    const int64_t count = std::min(kChunk, app.samples - lo);
    indices.resize(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) indices[static_cast<size_t>(k)] = lo + k;
    int64_t got = -1;
    try {
      got = app.fill(app.user, indices.data(), count, data->x.data() + lo * per, data->y.data() + lo);
    } catch (...) {
      throw DataCallbackError("the data callback threw for samples [" + std::to_string(lo) + ", " +
                              std::to_string(lo + count) + ")");
    }
    const std::string range = "samples [" + std::to_string(lo) + ", " + std::to_string(lo + count) + ")";
    if (got < 0) throw DataCallbackError("the data callback failed (returned " + std::to_string(got) + ") for " + range);
    if (got != count)
      throw DataCallbackError("the data callback returned short: " + std::to_string(got) + " of " +
                              std::to_string(count) + " " + range);
  }
  try {
    cleave::check_dataset(*data);
  } catch (const std::exception& e) {
    throw DataCallbackError(std::string("the data callback gave invalid samples: ") + e.what());
  }
  return data;
}

cleave_job job_of(const std::string& kind) {
  if (kind == "fed") return CLEAVE_JOB_FED;
  if (kind == "split") return CLEAVE_JOB_SPLIT;
  return CLEAVE_JOB_STAGE;
}

// The daemon's events: the client's status, then the app's progress callback.
void on_daemon_event(cleave_client* c, const cleave::DaemonEvent& e) {
  using Kind = cleave::DaemonEvent::Kind;
  cleave_progress p{CLEAVE_EVENT_CONNECTED, job_of(e.job), -1, 0.0};
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    switch (e.kind) {
      case Kind::connected: c->info.state = CLEAVE_STATE_WAITING; p.job = CLEAVE_JOB_NONE; break;
      case Kind::job_started: c->info.state = CLEAVE_STATE_IN_JOB; c->info.job = p.job; p.event = CLEAVE_EVENT_JOB_STARTED; break;
      case Kind::progress: c->info.step = p.step = e.step; c->info.loss = p.loss = e.loss; p.event = CLEAVE_EVENT_ROUND; break;
      case Kind::job_ended:
        c->info.state = CLEAVE_STATE_WAITING;
        c->info.job = CLEAVE_JOB_NONE;
        ++c->info.jobs_done;
        p.event = CLEAVE_EVENT_JOB_ENDED;
        break;
      case Kind::no_coordinator: c->no_coordinator_message = e.message; c->refused_key = e.refused_key; return;
    }
  }
  if (!c->options.progress) return;
  try {
    c->options.progress(c->options.progress_user, &p);
  } catch (...) {  // never into the daemon
  }
}

// The body of the client's thread: data, then the daemon; returns how it ended.
cleave_status run_client(cleave_client* c, std::string& message) {
  auto end = [&message](cleave_status status, std::string why) {
    message = std::move(why);
    return status;
  };
  cleave::DaemonOptions d = c->options.daemon;
  if (c->options.data.fill) {
    d.fed.supplied = read_app_data(c->options.data, c->stop);
    if (c->stop) return end(CLEAVE_ERR_STOPPED, "stopped by cleave_client_stop");
  }
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->info.state = CLEAVE_STATE_CONNECTING;
  }
  d.on_event = [c](const cleave::DaemonEvent& e) { on_daemon_event(c, e); };
  d.release_requested = [c] { return c->release.exchange(false); };
  const int code = cleave::run_daemon(d, c->stop);
  if (code == cleave::kExitNoCoordinator) {
    std::lock_guard<std::mutex> lock(c->mutex);
    return end(c->refused_key ? CLEAVE_ERR_REFUSED_KEY : CLEAVE_ERR_UNREACHABLE, c->no_coordinator_message);
  }
  if (c->stop) return end(CLEAVE_ERR_STOPPED, "stopped by cleave_client_stop");
  if (code != 0) return end(CLEAVE_ERR_INTERNAL, "the client ended with code " + std::to_string(code));
  return CLEAVE_OK;
}

void client_thread(cleave_client* c) {
  if (c->options.log) add_log_client(c);
  std::string message;
  cleave_status status = CLEAVE_OK;
  try {
    status = run_client(c, message);
  } catch (...) {
    status = status_of_current_exception(message);
  }
  if (c->options.log) remove_log_client(c);
  std::lock_guard<std::mutex> lock(c->mutex);
  c->result = status;
  c->result_message = message;
  c->info.state = CLEAVE_STATE_ENDED;
  c->info.job = CLEAVE_JOB_NONE;
  c->ended = true;
  c->ended_cv.notify_all();
}

bool on_client_thread(const cleave_client* c) {
  std::lock_guard<std::mutex> lock(c->mutex);
  return c->started && c->thread_id == std::this_thread::get_id();
}

}  // namespace

// ---- Status and version

extern "C" const char* cleave_last_error(void) { return t_last_error.c_str(); }

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
    CLEAVE_REQUIRE(is_device_name(name), std::string("the device name '") + name + "' is not 1..64 of [A-Za-z0-9._-]");
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
    CLEAVE_REQUIRE(role == CLEAVE_ROLE_STAGE || role == CLEAVE_ROLE_FED_CLIENT || role == CLEAVE_ROLE_SPLIT_CLIENT,
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
    AppData d;
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

// ---- Client

extern "C" cleave_status cleave_client_create(const cleave_options* options, cleave_client** out) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && out, "options or out is null");
    *out = nullptr;
    const cleave::DaemonOptions& d = options->daemon;
    CLEAVE_REQUIRE(!d.coordinator.empty(), "no coordinator: call cleave_options_set_coordinator");
    CLEAVE_REQUIRE(options->keys_set, "no keys: call cleave_options_set_key_files or cleave_options_set_keys_z85");
    const std::string stem = d.key_path.empty() ? "" : std::filesystem::path(d.key_path).stem().string();
    CLEAVE_REQUIRE(!d.name.empty() || is_device_name(stem),
                   "no device name: call cleave_options_set_name (keys given as Z85 carry no name)");
    const bool data_role = options->role != CLEAVE_ROLE_STAGE;
    CLEAVE_REQUIRE(!data_role || options->data.fill, "a federated or split-learning client needs data: call "
                                                     "cleave_options_set_data");
    auto c = std::make_unique<cleave_client>();
    c->options = *options;
    if (!data_role) c->options.data = AppData{};  // a stage device holds no data
    c->info.role = options->role;
    c->info.state = CLEAVE_STATE_CREATED;
    c->info.job = CLEAVE_JOB_NONE;
    c->info.step = -1;
    *out = c.release();
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_client_destroy(cleave_client* client) {
  return guarded(__func__, [&] {
    if (!client) return CLEAVE_OK;
    if (on_client_thread(client))
      return fail(CLEAVE_ERR_WRONG_STATE, "called from the client's own callback");
    client->stop = true;
    if (client->thread.joinable()) client->thread.join();
    delete client;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_client_start(cleave_client* client) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(client, "client is null");
    std::lock_guard<std::mutex> lock(client->mutex);
    if (client->started) return fail(CLEAVE_ERR_WRONG_STATE, "the client was already started");
    client->info.state = client->options.data.fill ? CLEAVE_STATE_LOADING : CLEAVE_STATE_CONNECTING;
    client->thread = std::thread(client_thread, client);
    client->thread_id = client->thread.get_id();
    client->started = true;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_client_stop(cleave_client* client) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(client, "client is null");
    std::lock_guard<std::mutex> lock(client->mutex);
    if (!client->started) return fail(CLEAVE_ERR_WRONG_STATE, "the client was not started");
    client->stop = true;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_client_wait(cleave_client* client, int timeout_ms) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(client, "client is null");
    if (on_client_thread(client))
      return fail(CLEAVE_ERR_WRONG_STATE, "called from the client's own callback");
    std::unique_lock<std::mutex> lock(client->mutex);
    if (!client->started) return fail(CLEAVE_ERR_WRONG_STATE, "the client was not started");
    auto ended = [client] { return client->ended; };
    if (timeout_ms < 0) {
      client->ended_cv.wait(lock, ended);
    } else if (!client->ended_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), ended)) {
      return fail(CLEAVE_ERR_TIMEOUT, "still running after " + std::to_string(timeout_ms) + " ms");
    }
    if (client->result != CLEAVE_OK) return fail(client->result, client->result_message);
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_client_get_status(const cleave_client* client, cleave_client_info* out) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(client && out, "client or out is null");
    std::lock_guard<std::mutex> lock(client->mutex);
    *out = client->info;
    return CLEAVE_OK;
  });
}

extern "C" cleave_status cleave_client_release_memory(cleave_client* client) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(client, "client is null");
    client->release = true;
    return CLEAVE_OK;
  });
}
