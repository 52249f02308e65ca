// client.cpp: the SDK's client (include/cleave/cleave.h, "Client"): a started
// client reads the app's data, then runs the daemon loop (run_daemon,
// core/runtime/daemon/daemon.h) on a thread it owns, telling the app through
// its callbacks and answering status queries under one mutex.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/data/dataset.h"
#include "sdk/internal.h"
#include "transport/log.h"

using cleave::sdk::AppData;
using cleave::sdk::DataCallbackError;
using cleave::sdk::fail;
using cleave::sdk::guarded;

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

// "samples [lo, hi)" for consecutive indices, else "a batch of n samples".
std::string describe(const int64_t* indices, int64_t count) {
  for (int64_t k = 1; k < count; ++k)
    if (indices[k] != indices[0] + k) return "a batch of " + std::to_string(count) + " samples";
  return "samples [" + std::to_string(indices[0]) + ", " + std::to_string(indices[0] + count) + ")";
}

// One call of the app's callback `what` ("data", "test-data") for `count`
// samples at `indices` into x / y; throws DataCallbackError when it throws,
// fails, returns short or gives a label that is not one of its classes.
void fill_checked(const AppData& app, const char* what, const int64_t* indices, int64_t count, float* x, float* y) {
  int64_t got = -1;
  const std::string the = std::string("the ") + what + " callback";
  try {
    got = app.fill(app.user, indices, count, x, y);
  } catch (...) {
    throw DataCallbackError(the + " threw for " + describe(indices, count));
  }
  if (got < 0)
    throw DataCallbackError(the + " failed (returned " + std::to_string(got) + ") for " + describe(indices, count));
  if (got != count)
    throw DataCallbackError(the + " returned short: " + std::to_string(got) + " of " + std::to_string(count) + " " +
                            describe(indices, count));
  for (int64_t k = 0; k < count; ++k)
    if (const std::string why = cleave::label_refusal(y[k], app.num_classes); !why.empty())
      throw DataCallbackError(the + " gave invalid samples: the label " + std::to_string(y[k]) + " of sample " +
                              std::to_string(indices[k]) + " is " + why);
}

// The app's samples as a dataset: read once through the callback, 256 at a
// time, to check them before the client dials (DataCallbackError when they
// fail); then `copy` keeps them (test data, evaluated in place) or they are
// fetched again batch by batch as training needs them (the SDK keeps no copy
// of an app's training data). A later fetch that fails calls `failed` with
// the message, then throws.
std::shared_ptr<const cleave::Dataset> read_app_data(const AppData& app, const char* what, bool copy,
                                                     const std::atomic<bool>& stop,
                                                     std::function<void(const std::string&)> failed) {
  auto data = std::make_shared<cleave::Dataset>();
  data->name = "app";
  data->sample_shape = app.shape;
  data->num_classes = app.num_classes;
  const int64_t per = data->sample_numel();
  constexpr int64_t kChunk = 256;
  std::vector<float> xs(static_cast<size_t>(copy ? app.samples * per : kChunk * per));
  std::vector<float> ys(static_cast<size_t>(copy ? app.samples : kChunk));
  std::vector<int64_t> indices;
  for (int64_t lo = 0; lo < app.samples && !stop; lo += kChunk) {
    const int64_t count = std::min(kChunk, app.samples - lo);
    indices.resize(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) indices[static_cast<size_t>(k)] = lo + k;
    const int64_t at = copy ? lo : 0;
    fill_checked(app, what, indices.data(), count, xs.data() + at * per, ys.data() + at);
  }
  if (copy) {
    data->x = std::move(xs);
    data->y = std::move(ys);
    return data;
  }
  auto source = std::make_shared<cleave::Dataset::Source>();
  source->count = app.samples;
  source->fetch = [app, what, failed](const int64_t* idx, int64_t n, float* x, float* y) {
    try {
      fill_checked(app, what, idx, n, x, y);
    } catch (const DataCallbackError& e) {
      failed(e.what());
      throw;
    }
  };
  data->source = std::move(source);
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
      case Kind::progress:
        c->info.step = p.step = e.step;
        c->info.loss = p.loss = e.loss;
        p.event = e.job == "fed" ? CLEAVE_EVENT_ROUND : CLEAVE_EVENT_STEP;
        break;
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
  if (!c->options.log_level.empty()) cleave::transport::set_log_level(cleave::sdk::log_level_named(c->options.log_level));
  if (c->options.data.fill) {
    // A fetch that fails during a job ends the client with CLEAVE_ERR_DATA_CALLBACK.
    auto failed = [c](const std::string& why) {
      std::lock_guard<std::mutex> lock(c->mutex);
      if (c->data_failure.empty()) c->data_failure = why;
      c->stop = true;
      c->wake.signal();
    };
    d.fed.supplied = read_app_data(c->options.data, "data", /*copy=*/false, c->stop, failed);
    if (c->options.test_data.fill && !c->stop) {
      AppData test = c->options.test_data;
      test.shape = c->options.data.shape;  // as set_data says now
      test.num_classes = c->options.data.num_classes;
      d.fed.supplied_test = read_app_data(test, "test-data", /*copy=*/true, c->stop, failed);
    }
    if (c->stop) return end(CLEAVE_ERR_STOPPED, "stopped by cleave_client_stop");
  }
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->info.state = CLEAVE_STATE_CONNECTING;
  }
  d.on_event = [c](const cleave::DaemonEvent& e) { on_daemon_event(c, e); };
  d.release_requested = [c] { return c->release.exchange(false); };
  d.wake = &c->wake;
  const int code = cleave::run_daemon(d, c->stop);
  if (code == cleave::kExitNoCoordinator) {
    std::lock_guard<std::mutex> lock(c->mutex);
    return end(c->refused_key ? CLEAVE_ERR_REFUSED_KEY : CLEAVE_ERR_UNREACHABLE, c->no_coordinator_message);
  }
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (!c->data_failure.empty()) return end(CLEAVE_ERR_DATA_CALLBACK, c->data_failure + " (during a job)");
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
    status = cleave::sdk::status_of_current_exception(message);
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

// ---- Client

extern "C" cleave_status cleave_client_create(const cleave_options* options, cleave_client** out) {
  return guarded(__func__, [&] {
    CLEAVE_REQUIRE(options && out, "options or out is null");
    *out = nullptr;
    const cleave::DaemonOptions& d = options->daemon;
    CLEAVE_REQUIRE(!d.coordinator.empty(), "no coordinator: call cleave_options_set_coordinator");
    const std::string stem = d.key_path.empty() ? "" : std::filesystem::path(d.key_path).stem().string();
    CLEAVE_REQUIRE(!d.name.empty() || cleave::sdk::is_device_name(stem),
                   "no device name: call cleave_options_set_name (keys given as Z85 carry no name)");
    CLEAVE_REQUIRE(options->keys_set || d.insecure,
                   "no keys: call cleave_options_set_key_files or cleave_options_set_keys_z85");
    const bool data_role = options->role != CLEAVE_ROLE_STAGE;
    const bool file_data = !d.fed.dataset.empty(), app_data = options->data.fill != nullptr;
    CLEAVE_REQUIRE(!(file_data && app_data), "two data sources: give either cleave_options_set_data (callbacks) or "
                                             "the option \"dataset\" (a file), not both");
    CLEAVE_REQUIRE(!data_role || file_data || app_data,
                   "a federated or split-learning client needs data: call cleave_options_set_data (or set the "
                   "option \"dataset\")");
    CLEAVE_REQUIRE(data_role || !file_data,
                   "a stage device holds no data: set the role to a data role (fed-client, split-client or "
                   "data-client) to use the option \"dataset\"");
    auto c = std::make_unique<cleave_client>();
    c->options = *options;
    if (!data_role) c->options.data = AppData{};  // a stage device holds no data
    c->options.daemon.fed_jobs = options->role == CLEAVE_ROLE_FED_CLIENT || options->role == CLEAVE_ROLE_DATA_CLIENT;
    c->options.daemon.split_client_jobs =
        options->role == CLEAVE_ROLE_SPLIT_CLIENT || options->role == CLEAVE_ROLE_DATA_CLIENT;
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
    client->wake.signal();
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
    client->wake.signal();
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
    if (client->result != CLEAVE_OK) return cleave::sdk::fail_verbatim(client->result, client->result_message);
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
    client->wake.signal();
    return CLEAVE_OK;
  });
}
