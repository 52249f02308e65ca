// internal.h: what the SDK's translation units share (never installed): the
// handles' definitions and the guard every entry point runs its body in.
//
// Every entry point is `guarded`: whatever is thrown inside becomes a status
// and a thread-local message (the way CLBlast's clblast.cpp dispatches its
// exceptions), so nothing C++ crosses the boundary.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "cleave/cleave.h"
#include "core/runtime/daemon/daemon.h"
#include "device/device.h"
#include "transport/log.h"
#include "transport/wakeup.h"

namespace cleave::sdk {

// What cleave_options_set_data describes.
struct AppData {
  int64_t samples = 0;
  Shape shape;
  int num_classes = 0;
  cleave_fill_fn fill = nullptr;
  void* user = nullptr;
};

// The app's data callback failed, returned short or gave invalid samples.
struct DataCallbackError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Records `message` (prefixed with the running entry point's name) as this
// thread's last error and returns `status`.
cleave_status fail(cleave_status status, const std::string& message);
// Records `message` as it is (a run's own message, already in words).
cleave_status fail_verbatim(cleave_status status, const std::string& message);
// The status (and message) of the exception being handled; call inside a catch.
cleave_status status_of_current_exception(std::string& message);
// Names the entry point running on this thread, for fail()'s messages.
void enter(const char* function);

// Runs an entry point's body; nothing it throws escapes.
template <typename Body>
cleave_status guarded(const char* function, Body&& body) noexcept {
  enter(function);
  try {
    return body();
  } catch (...) {
    std::string message;
    const cleave_status s = status_of_current_exception(message);
    return fail(s, message);
  }
}

bool is_device_name(const std::string& name);
// debug | info | warning | error; throws std::invalid_argument for anything else.
transport::LogLevel log_level_named(const std::string& name);

}  // namespace cleave::sdk

#define CLEAVE_REQUIRE(cond, what)                                          \
  do {                                                                      \
    if (!(cond)) return ::cleave::sdk::fail(CLEAVE_ERR_INVALID_ARGUMENT, what); \
  } while (false)

struct cleave_options {
  cleave::DaemonOptions daemon;
  bool keys_set = false;  // both keys given (files, Z85 text, or "key" + "coordinator-key" by name)
  cleave_role role = CLEAVE_ROLE_STAGE;
  cleave::sdk::AppData data;
  cleave::sdk::AppData test_data;  // optional: a split client's test samples (same shape and classes as `data`)
  std::string log_level;  // "" (leave it) | debug | info | warning | error: process-wide, applied at start
  cleave_progress_fn progress = nullptr;
  void* progress_user = nullptr;
  cleave_log_fn log = nullptr;
  void* log_user = nullptr;
};

struct cleave_client {
  cleave_options options;
  std::atomic<bool> stop{false};
  std::atomic<bool> release{false};
  cleave::transport::Wakeup wake;  // signalled after stop or release is set: the idle daemon looks at once
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
  std::string data_failure;  // a data callback that failed during a job: the client ends with DATA_CALLBACK
};
