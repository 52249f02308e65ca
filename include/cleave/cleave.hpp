// cleave.hpp: a header-only C++17 wrapper over the C API (cleave.h) only.
//
// cleave::Options and cleave::Client own their C handles (RAII, movable, not
// copyable). A failing call throws cleave::Error carrying the status and
// cleave_last_error()'s message. Callbacks are std::function; whatever a
// callback throws is caught here, before the C boundary: a throwing data
// callback ends the client with CLEAVE_ERR_DATA_CALLBACK (the exception's
// message is added to the Error that wait() throws), a throwing progress or
// log callback loses that one report. The callbacks live in the Options and,
// once a Client is made, are shared with it: they stay alive while either does.
// Threading and ownership are those of cleave.h.
#ifndef CLEAVE_CLEAVE_HPP
#define CLEAVE_CLEAVE_HPP

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cleave/cleave.h"

namespace cleave {

class Error : public std::runtime_error {
 public:
  Error(cleave_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  cleave_status status() const noexcept { return status_; }

 private:
  cleave_status status_;
};

namespace detail {

inline void check(cleave_status s) {
  if (s != CLEAVE_OK) throw Error(s, cleave_last_error());
}

// What the C callbacks reach through their user pointer.
struct Callbacks {
  // Fills `count` samples at `indices` into inputs / labels (see cleave_fill_fn);
  // returns the number filled.
  std::function<int64_t(const int64_t* indices, int64_t count, float* inputs, float* labels)> fill;
  std::function<int64_t(const int64_t* indices, int64_t count, float* inputs, float* labels)> test_fill;
  std::function<void(const cleave_progress&)> progress;
  std::function<void(cleave_log_level, const char*)> log;
  std::mutex mutex;
  std::string fill_error;  // what the data callback threw, if it did

  static int64_t fill_trampoline(void* user, const int64_t* indices, int64_t count, float* inputs,
                                 float* labels) noexcept {
    auto* self = static_cast<Callbacks*>(user);
    return self->call_fill(self->fill, indices, count, inputs, labels);
  }
  static int64_t test_fill_trampoline(void* user, const int64_t* indices, int64_t count, float* inputs,
                                      float* labels) noexcept {
    auto* self = static_cast<Callbacks*>(user);
    return self->call_fill(self->test_fill, indices, count, inputs, labels);
  }
  template <typename Fill>
  int64_t call_fill(const Fill& f, const int64_t* indices, int64_t count, float* inputs, float* labels) noexcept {
    Callbacks* self = this;
    try {
      return f(indices, count, inputs, labels);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(self->mutex);
      self->fill_error = e.what();
    } catch (...) {
      std::lock_guard<std::mutex> lock(self->mutex);
      self->fill_error = "an exception that is not a std::exception";
    }
    return -1;
  }
  static void progress_trampoline(void* user, const cleave_progress* p) noexcept {
    try {
      static_cast<Callbacks*>(user)->progress(*p);
    } catch (...) {
    }
  }
  static void log_trampoline(void* user, cleave_log_level level, const char* line) noexcept {
    try {
      static_cast<Callbacks*>(user)->log(level, line);
    } catch (...) {
    }
  }
};

}  // namespace detail

inline std::string version() { return cleave_version(); }

class Options {
 public:
  Options() : callbacks_(std::make_shared<detail::Callbacks>()) {
    cleave_options* o = nullptr;
    detail::check(cleave_options_create(&o));
    handle_.reset(o);
  }

  Options& coordinator(const std::string& endpoint) { return call(cleave_options_set_coordinator(get(), endpoint.c_str())); }
  Options& key_files(const std::string& secret_key_path, const std::string& coordinator_public_key_path) {
    return call(cleave_options_set_key_files(get(), secret_key_path.c_str(), coordinator_public_key_path.c_str()));
  }
  Options& keys_z85(const std::string& secret_key, const std::string& coordinator_public_key) {
    return call(cleave_options_set_keys_z85(get(), secret_key.c_str(), coordinator_public_key.c_str()));
  }
  Options& name(const std::string& device_name) { return call(cleave_options_set_name(get(), device_name.c_str())); }
  Options& backend(const std::string& backend, int threads = 0) {
    return call(cleave_options_set_backend(get(), backend.c_str(), threads));
  }
  Options& memory_limit(uint64_t bytes) { return call(cleave_options_set_memory_limit(get(), bytes)); }
  Options& bandwidth_limit(double bytes_per_second) {
    return call(cleave_options_set_bandwidth_limit(get(), bytes_per_second));
  }
  Options& connect_timeout_ms(int ms) { return call(cleave_options_set_connect_timeout(get(), ms)); }
  Options& max_jobs(int jobs) { return call(cleave_options_set_max_jobs(get(), jobs)); }
  Options& role(cleave_role r) { return call(cleave_options_set_role(get(), r)); }
  // Any option by the name of its `cleaved` flag, from text (cleave_options_set).
  Options& set(const std::string& name, const std::string& value) {
    return call(cleave_options_set(get(), name.c_str(), value.c_str()));
  }
  // `fill` as cleave_fill_fn without the user pointer; it may throw.
  Options& data(int64_t num_samples, const std::vector<int64_t>& sample_shape, int num_classes,
                const std::string& shard,
                std::function<int64_t(const int64_t* indices, int64_t count, float* inputs, float* labels)> fill) {
    callbacks_->fill = std::move(fill);
    return call(cleave_options_set_data(get(), num_samples, sample_shape.data(), static_cast<int>(sample_shape.size()),
                                        num_classes, shard.c_str(), &detail::Callbacks::fill_trampoline,
                                        callbacks_.get()));
  }
  // Test samples for a split-learning client (cleave_options_set_test_data); after data().
  Options& test_data(int64_t num_samples,
                     std::function<int64_t(const int64_t* indices, int64_t count, float* inputs, float* labels)> fill) {
    callbacks_->test_fill = std::move(fill);
    return call(cleave_options_set_test_data(get(), num_samples, &detail::Callbacks::test_fill_trampoline,
                                             callbacks_.get()));
  }
  Options& on_progress(std::function<void(const cleave_progress&)> fn) {
    callbacks_->progress = std::move(fn);
    return call(cleave_options_set_progress_callback(
        get(), callbacks_->progress ? &detail::Callbacks::progress_trampoline : nullptr, callbacks_.get()));
  }
  Options& on_log(std::function<void(cleave_log_level, const char*)> fn) {
    callbacks_->log = std::move(fn);
    return call(cleave_options_set_log_callback(get(), callbacks_->log ? &detail::Callbacks::log_trampoline : nullptr,
                                                callbacks_.get()));
  }

  const cleave_options* get() const { return handle_.get(); }
  cleave_options* get() { return handle_.get(); }
  const std::shared_ptr<detail::Callbacks>& callbacks() const { return callbacks_; }

 private:
  struct Free {
    void operator()(cleave_options* o) const noexcept { cleave_options_destroy(o); }
  };
  Options& call(cleave_status s) {
    detail::check(s);
    return *this;
  }
  std::shared_ptr<detail::Callbacks> callbacks_;
  std::unique_ptr<cleave_options, Free> handle_;
};

class Client {
 public:
  explicit Client(const Options& options) : callbacks_(options.callbacks()) {
    cleave_client* c = nullptr;
    detail::check(cleave_client_create(options.get(), &c));
    handle_.reset(c);
  }

  void start() { detail::check(cleave_client_start(handle_.get())); }
  void stop() { detail::check(cleave_client_stop(handle_.get())); }
  // Waits up to timeout_ms (< 0: without limit). True when the run ended well,
  // false when the time ran out; throws Error for a run that failed or was stopped.
  bool wait(int timeout_ms = -1) {
    const cleave_status s = cleave_client_wait(handle_.get(), timeout_ms);
    if (s == CLEAVE_OK) return true;
    if (s == CLEAVE_ERR_TIMEOUT) return false;
    std::string message = cleave_last_error();
    if (s == CLEAVE_ERR_DATA_CALLBACK) {
      std::lock_guard<std::mutex> lock(callbacks_->mutex);
      if (!callbacks_->fill_error.empty()) message += " (it threw: " + callbacks_->fill_error + ")";
    }
    throw Error(s, message);
  }
  cleave_client_info status() const {
    cleave_client_info info{};
    detail::check(cleave_client_get_status(handle_.get(), &info));
    return info;
  }
  void release_memory() { detail::check(cleave_client_release_memory(handle_.get())); }
  cleave_client* get() const { return handle_.get(); }

 private:
  struct Free {
    void operator()(cleave_client* c) const noexcept { cleave_client_destroy(c); }
  };
  std::shared_ptr<detail::Callbacks> callbacks_;  // declared first: destroyed after the client has joined
  std::unique_ptr<cleave_client, Free> handle_;
};

}  // namespace cleave

#endif  // CLEAVE_CLEAVE_HPP
