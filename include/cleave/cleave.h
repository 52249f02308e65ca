/* cleave.h: the embedding SDK's C API (libcleave.so.0 / libcleave.a).
 *
 * An app that owns its data joins cleave training without a separate daemon:
 * it describes itself in a cleave_options (coordinator, keys, device, role,
 * data callbacks), creates a cleave_client from it and starts it. The client
 * then does what `cleaved` does — dials the coordinator over CURVE, registers,
 * serves jobs (a pipeline stage, federated rounds, a split-learning client
 * part) — on one thread the SDK owns, until the coordinator releases it, its
 * job count is reached or the app stops it.
 *
 * Rules of every call:
 *   - It returns a cleave_status: CLEAVE_OK (0) or the failure's kind. On a
 *     failure cleave_last_error() says what went wrong, in words.
 *   - No C++ exception and no C++ type crosses this boundary.
 *   - Null handles and null required pointers return CLEAVE_ERR_INVALID_ARGUMENT.
 *   - A failing call's message starts with the call's name ("cleave_options_set: ...");
 *     what cleave_client_wait reports about a run that failed is the run's own message.
 *   - Every `const char*` argument is read (copied) during the call only: the
 *     caller keeps owning it and may free it on return.
 *   - Out-structs are owned by the caller; the SDK only writes them.
 *
 * Threading: see "Callbacks" below. Handles may be used from any thread, but
 * one cleave_options must not be changed from two threads at once.
 *
 * Compiles as C99 (-std=c99 -Wall -Wextra -pedantic) and as C++.
 */
#ifndef CLEAVE_CLEAVE_H
#define CLEAVE_CLEAVE_H

#include <stddef.h>
#include <stdint.h>

#include "cleave/version.h" /* CLEAVE_VERSION_MAJOR / _MINOR / _PATCH / _STRING */

#if defined(_WIN32)
#define CLEAVE_API
#elif defined(__GNUC__)
#define CLEAVE_API __attribute__((visibility("default")))
#else
#define CLEAVE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status, errors, version ------------------------------------------- */

typedef enum cleave_status {
  CLEAVE_OK = 0,
  CLEAVE_ERR_INVALID_ARGUMENT = 1, /* a null handle or pointer, a value out of range, a malformed key */
  CLEAVE_ERR_WRONG_STATE = 2,      /* a call in the wrong order (start twice, wait before start, ...) */
  CLEAVE_ERR_REFUSED_KEY = 3,      /* the coordinator was reached but the CURVE handshake failed */
  CLEAVE_ERR_UNREACHABLE = 4,      /* no connection to the coordinator within the connect timeout */
  CLEAVE_ERR_OUT_OF_MEMORY = 5,    /* host or device memory ran out */
  CLEAVE_ERR_DATA_CALLBACK = 6,    /* the app's data callback failed or returned short */
  CLEAVE_ERR_STOPPED = 7,          /* the run ended because cleave_client_stop was called */
  CLEAVE_ERR_INTERNAL = 8,         /* anything else (a bug: please report cleave_last_error()) */
  CLEAVE_ERR_TIMEOUT = 9           /* cleave_client_wait: the time ran out, the client still runs */
} cleave_status;

/* The message of the last failed call on this thread ("" when none failed yet).
 * Owned by the SDK; valid until the next failing call on the same thread. */
CLEAVE_API const char* cleave_last_error(void);

/* "MAJOR.MINOR.PATCH" of the library actually loaded; compare its major with
 * CLEAVE_VERSION_MAJOR from the header the app was built against. Static
 * storage (never free it). */
CLEAVE_API const char* cleave_version(void);

/* ---- Callbacks ----------------------------------------------------------
 * Which thread runs them: the data callback and the progress callback run on
 * the client's own thread (the one cleave_client_start created), never two at
 * once for one client. The log callback may run on any thread, also the
 * transport's background threads, so it must be thread-safe.
 * What a callback may call: cleave_client_get_status, cleave_client_stop,
 * cleave_client_release_memory, cleave_last_error, cleave_version. It must not
 * call cleave_client_wait or cleave_client_destroy on its own client (they
 * return CLEAVE_ERR_WRONG_STATE there). A slow callback delays the job: keep
 * it short (the coordinator abandons a client silent past its timeouts). */

/* Fills `count` samples of the app's data: for each k < count, the sample
 * with index indices[k] (0 <= index < num_samples) goes to
 * inputs[k * sample_numel ...] (sample_numel = product of the sample shape,
 * row-major floats) and its label to labels[k]: the class index as a float in
 * [0, num_classes), or the regression target when num_classes is 0.
 * `indices`, `inputs` and `labels` are owned by the SDK and valid during the
 * call only. Returns the number of samples filled: anything but `count` (a
 * negative value for an error, fewer for short data) ends the client with
 * CLEAVE_ERR_DATA_CALLBACK. */
typedef int64_t (*cleave_fill_fn)(void* user, const int64_t* indices, int64_t count, float* inputs, float* labels);

/* What the client offers the coordinator. Every role hosts pipeline stages
 * (layers of someone else's model; no data of its own is involved). A data
 * role also holds data (cleave_options_set_data, or the option "dataset") and
 * takes only the data jobs it names: a federated client's updates are whole
 * parameter blocks, while a split-learning client sends its cut layer's
 * activations, which say more about its samples, so an app that joined as a
 * federated client is never made a split-learning client (the coordinator is
 * refused, with a message) and the reverse. */
typedef enum cleave_role {
  CLEAVE_ROLE_STAGE = 0,        /* a pipeline stage device: hosts layers, no data of its own */
  CLEAVE_ROLE_FED_CLIENT = 1,   /* a federated client training on its own data (needs a data source) */
  CLEAVE_ROLE_SPLIT_CLIENT = 2, /* a split-learning client holding its data (needs a data source) */
  CLEAVE_ROLE_DATA_CLIENT = 3,  /* both of the above (what `cleaved --dataset` is) */
  /* Not a role: makes every non-negative int a value of the type, so that an
   * out-of-range role an app passes is refused (CLEAVE_ERR_INVALID_ARGUMENT)
   * instead of being undefined behaviour to read. */
  CLEAVE_ROLE_MAX_ENUM_ = 0x7fffffff
} cleave_role;

typedef enum cleave_state {
  CLEAVE_STATE_CREATED = 0,    /* created, not started */
  CLEAVE_STATE_LOADING = 1,    /* started: reading the app's data through the data callback */
  CLEAVE_STATE_CONNECTING = 2, /* dialling the coordinator */
  CLEAVE_STATE_WAITING = 3,    /* connected and registered, waiting for a job */
  CLEAVE_STATE_IN_JOB = 4,     /* running a job */
  CLEAVE_STATE_ENDED = 5       /* the run ended; cleave_client_wait returns its status */
} cleave_state;

typedef enum cleave_job {
  CLEAVE_JOB_NONE = 0,
  CLEAVE_JOB_STAGE = 1, /* a pipeline stage */
  CLEAVE_JOB_FED = 2,   /* federated rounds */
  CLEAVE_JOB_SPLIT = 3  /* a split-learning part */
} cleave_job;

typedef enum cleave_event {
  CLEAVE_EVENT_CONNECTED = 0,   /* first authenticated connection to the coordinator */
  CLEAVE_EVENT_JOB_STARTED = 1, /* a job began: `job` says which */
  CLEAVE_EVENT_ROUND = 2,       /* a federated round trained: `step` = round (from 0), `loss` = mean local loss */
  CLEAVE_EVENT_JOB_ENDED = 3,
  CLEAVE_EVENT_STEP = 4         /* a pipeline step or a split-learning batch done: `step` (from 0), `loss` = its
                                   mean loss where this client computes it (the last pipeline stage, a U-shaped
                                   split client), NaN where it does not */
} cleave_event;

/* What the progress callback is told. Owned by the SDK, valid during the call only. */
typedef struct cleave_progress {
  cleave_event event;
  cleave_job job;
  int64_t step; /* CLEAVE_EVENT_ROUND: the round; CLEAVE_EVENT_STEP: the step; else -1 */
  double loss;  /* CLEAVE_EVENT_ROUND / _STEP: the mean training loss (NaN: not computed here); else 0 */
} cleave_progress;

typedef void (*cleave_progress_fn)(void* user, const cleave_progress* progress);

typedef enum cleave_log_level {
  CLEAVE_LOG_DEBUG = 0,
  CLEAVE_LOG_INFO = 1,
  CLEAVE_LOG_WARNING = 2,
  CLEAVE_LOG_ERROR = 3
} cleave_log_level;

/* One log line (no trailing newline), owned by the SDK, valid during the call
 * only. The SDK's logging is process-wide: while a client with a log callback
 * runs, every cleave log line of the process goes to it (with several such
 * clients, to each of them) instead of stderr. */
typedef void (*cleave_log_fn)(void* user, cleave_log_level level, const char* line);

/* ---- Options ------------------------------------------------------------ */

typedef struct cleave_options cleave_options;

/* A fresh options object with the defaults: backend "auto", all threads, no
 * memory or bandwidth limit, connect timeout 0 (keep trying), serve jobs until
 * released (max_jobs 0), role CLEAVE_ROLE_STAGE. Free with cleave_options_destroy. */
CLEAVE_API cleave_status cleave_options_create(cleave_options** out);
/* Frees `options` (null: nothing happens, CLEAVE_OK). Clients made from it keep their own copy. */
CLEAVE_API cleave_status cleave_options_destroy(cleave_options* options);

/* Required: the coordinator to dial, "tcp://HOST:PORT". */
CLEAVE_API cleave_status cleave_options_set_coordinator(cleave_options* options, const char* endpoint);
/* The keys as files: this device's secret key (NAME.key, mode 0600) and the
 * coordinator's public key (.pub). Both are read and checked now
 * (CLEAVE_ERR_INVALID_ARGUMENT naming the file when missing or malformed). The
 * device name defaults to the secret key file's stem. */
CLEAVE_API cleave_status cleave_options_set_key_files(cleave_options* options, const char* secret_key_path,
                                                      const char* coordinator_public_key_path);
/* The keys as Z85 text (40 characters each); checked now. Needs a device name. */
CLEAVE_API cleave_status cleave_options_set_keys_z85(cleave_options* options, const char* secret_key_z85,
                                                     const char* coordinator_public_key_z85);
/* The device name the coordinator sees ([A-Za-z0-9._-], 1..64 characters). */
CLEAVE_API cleave_status cleave_options_set_name(cleave_options* options, const char* name);
/* backend: "auto" | "cpu" | "opencl" | "cuda"; threads: CPU threads, 0 = all cores. */
CLEAVE_API cleave_status cleave_options_set_backend(cleave_options* options, const char* backend, int threads);
/* Cap on what the client allocates on its device, in bytes (0: none). */
CLEAVE_API cleave_status cleave_options_set_memory_limit(cleave_options* options, uint64_t bytes);
/* Throttle of outgoing peer links in bytes per second (0: unlimited). */
CLEAVE_API cleave_status cleave_options_set_bandwidth_limit(cleave_options* options, double bytes_per_second);
/* Give up (CLEAVE_ERR_UNREACHABLE or CLEAVE_ERR_REFUSED_KEY) when not connected
 * within `ms` of the start of the connection (0: keep trying). */
CLEAVE_API cleave_status cleave_options_set_connect_timeout(cleave_options* options, int ms);
/* End (CLEAVE_OK) after this many jobs; 0 = serve until released or stopped. */
CLEAVE_API cleave_status cleave_options_set_max_jobs(cleave_options* options, int jobs);
CLEAVE_API cleave_status cleave_options_set_role(cleave_options* options, cleave_role role);
/* The app's data (needed for CLEAVE_ROLE_FED_CLIENT and _SPLIT_CLIENT):
 * num_samples samples, each of shape sample_shape[0 .. sample_dims) (1 to 4
 * positive dimensions; the array is copied), num_classes classes (0:
 * regression targets), read through `fill`: once when the client starts, in
 * chunks of 256 in index order, to check every sample before the client
 * dials, and then again batch by batch (the indices in training order) as
 * jobs train on them. The SDK keeps no copy: the app keeps its data
 * unchanged and `user` alive until the client ends. A fill that fails during
 * a job ends the client with CLEAVE_ERR_DATA_CALLBACK. `shard` is the "i/N"
 * the app says it holds; it appears in the registration. `user` is handed to
 * `fill` untouched. */
CLEAVE_API cleave_status cleave_options_set_data(cleave_options* options, int64_t num_samples,
                                                 const int64_t* sample_shape, int sample_dims, int num_classes,
                                                 const char* shard, cleave_fill_fn fill, void* user);
/* Optional test samples, for a split-learning client: `cleave split`
 * evaluates every client's part on its own test samples each epoch (without
 * them the client reports none). Same sample shape and classes as the data
 * of cleave_options_set_data, which must be called first; read through
 * `fill` (a cleave_fill_fn over indices [0, num_samples)) when the client
 * starts; the SDK keeps a copy of the test samples (they are evaluated in
 * place). The coordinator's --limit-test keeps the first N of them. `user` as
 * for set_data. */
CLEAVE_API cleave_status cleave_options_set_test_data(cleave_options* options, int64_t num_samples,
                                                      cleave_fill_fn fill, void* user);
/* fn may be null (no progress reports). `user` as for set_data. */
CLEAVE_API cleave_status cleave_options_set_progress_callback(cleave_options* options, cleave_progress_fn fn,
                                                              void* user);
/* fn may be null (log lines go to stderr). `user` as for set_data. */
CLEAVE_API cleave_status cleave_options_set_log_callback(cleave_options* options, cleave_log_fn fn, void* user);

/* Sets an option by name from text, exactly as the `cleaved` flag of that name
 * takes it: `cleaved --NAME VALUE` is cleave_options_set(o, "NAME", "VALUE")
 * (a switch takes "true" or "false"). This is how a program configures a
 * client from its own command line or configuration file; every typed setter
 * above is also reachable this way. Names:
 *   coordinator, key, coordinator-key, name, backend, threads, memory-limit
 *   ("512M", "4G" or bytes), bandwidth-limit ("100mbit", "10MB/s"),
 *   connect-timeout (seconds), max-jobs, role (stage | fed-client |
 *   split-client | data-client), peer-bind (where the previous pipeline stage
 *   dials in, tcp://IP:PORT, port * for any), coordinator-timeout (ms of
 *   coordinator silence after which a job is abandoned), insecure (plain TCP
 *   without CURVE; debugging only), log-level (debug | info | warning | error;
 *   process-wide, applied at start), metrics-listen (HOST:PORT, e.g.
 *   127.0.0.1:9464 or [::1]:0: Prometheus metrics over HTTP while the client
 *   runs, docs/monitoring.md; unauthenticated);
 *   data from a file instead of callbacks (docs/data.md): dataset
 *   (fashion-mnist, a CSV file or an IDX directory), data (the same, a path),
 *   dataset-dir, shard ("i/N"), partition (iid | dirichlet:ALPHA), seed,
 *   limit-train (use only the first N training samples before sharding);
 *   test hooks (not covered by the stability promise): poison.
 * "key" and "coordinator-key" are files, read and checked now; the name
 * defaults to the key's stem. CLEAVE_ERR_INVALID_ARGUMENT (the message names
 * the option and says what it takes) for an unknown name or a bad value; the
 * option keeps its old value then. */
CLEAVE_API cleave_status cleave_options_set(cleave_options* options, const char* name, const char* value);

/* ---- Client -------------------------------------------------------------- */

typedef struct cleave_client cleave_client;

/* A client from `options` (copied: the options may be destroyed afterwards).
 * CLEAVE_ERR_INVALID_ARGUMENT when they are incomplete: no coordinator, no
 * keys, Z85 keys without a name, a data role without data. */
CLEAVE_API cleave_status cleave_client_create(const cleave_options* options, cleave_client** out);
/* Destroys a client (null: nothing, CLEAVE_OK). A running client is stopped
 * and joined first (this blocks until its thread ends, at most a few seconds).
 * Called from the client's own callbacks it refuses: CLEAVE_ERR_WRONG_STATE. */
CLEAVE_API cleave_status cleave_client_destroy(cleave_client* client);
/* Starts the client on a thread the SDK owns and returns at once. Once per
 * client: a second call returns CLEAVE_ERR_WRONG_STATE. */
CLEAVE_API cleave_status cleave_client_start(cleave_client* client);
/* Asks a started client to end (from any thread, also a callback); returns at
 * once. cleave_client_wait then returns CLEAVE_ERR_STOPPED. Before start:
 * CLEAVE_ERR_WRONG_STATE. After the end: CLEAVE_OK, nothing happens. */
CLEAVE_API cleave_status cleave_client_stop(cleave_client* client);
/* Waits up to timeout_ms (< 0: without limit) for a started client to end.
 * Returns how the run ended — CLEAVE_OK (released by the coordinator or
 * max_jobs done), CLEAVE_ERR_STOPPED, _UNREACHABLE, _REFUSED_KEY,
 * _DATA_CALLBACK, _OUT_OF_MEMORY, _INVALID_ARGUMENT (bad start-up input, e.g.
 * an unknown backend), _INTERNAL — with cleave_last_error() set on this thread
 * for a failure; or CLEAVE_ERR_TIMEOUT when it still runs. Before start:
 * CLEAVE_ERR_WRONG_STATE. May be called again after the end (same answer). */
CLEAVE_API cleave_status cleave_client_wait(cleave_client* client, int timeout_ms);

/* What cleave_client_get_status writes (caller-owned). */
typedef struct cleave_client_info {
  cleave_role role;
  cleave_state state;
  cleave_job job;   /* the job running now, or CLEAVE_JOB_NONE */
  int64_t step;     /* the last federated round or step done (from 0), -1 before the first */
  double loss;      /* its mean loss (0 before the first; NaN where this client computes none) */
  int64_t jobs_done;
} cleave_client_info;

CLEAVE_API cleave_status cleave_client_get_status(const cleave_client* client, cleave_client_info* out);
/* Asks the client to return the device memory its backend keeps cached. It
 * takes effect while the client waits for a job (within ~0.1 s); during a job
 * at the job's end (a finished job releases it anyway). CLEAVE_OK also before
 * start (nothing is held). */
CLEAVE_API cleave_status cleave_client_release_memory(cleave_client* client);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CLEAVE_CLEAVE_H */
