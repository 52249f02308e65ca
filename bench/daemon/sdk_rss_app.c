/* sdk_rss_app.c: an app of bench_idle_rss's SDK setups (issue 14: an idle SDK
 * client adds at most 16 MiB to its app). It holds its own data (N synthetic
 * Fashion-MNIST-shaped samples), reports its resident memory (VmRSS, KiB)
 * before it loads libcleave (`baseline_kib`), after dlopen (`loaded_kib`),
 * when its client is registered and waiting for a job (`waiting`: the bench
 * samples it then), the highest while it runs a job (`job_peak_kib`) and at
 * the end (`end_kib`), one "key value" line each on stdout.
 *
 *   sdk_rss_app --lib libcleave.so.0 --coordinator URL --key FILE --coordinator-key FILE
 *               [--samples N] [--threads T] [--max-jobs J]
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cleave/cleave.h"

static long rss_kib(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  return kib;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

enum { kPixels = 784 };
static float* g_x;
static float* g_y;
static long g_n = 1000;

static int64_t fill(void* user, const int64_t* idx, int64_t count, float* in, float* labels) {
  (void)user;
  for (int64_t k = 0; k < count; ++k) {
    memcpy(in + k * kPixels, g_x + idx[k] * kPixels, sizeof(float) * kPixels);
    labels[k] = g_y[idx[k]];
  }
  return count;
}

/* The SDK's calls this app makes, looked up after dlopen. */
struct Api {
  cleave_status (*options_create)(cleave_options**);
  cleave_status (*options_set)(cleave_options*, const char*, const char*);
  cleave_status (*options_set_data)(cleave_options*, int64_t, const int64_t*, int, int, const char*, cleave_fill_fn,
                                    void*);
  cleave_status (*client_create)(const cleave_options*, cleave_client**);
  cleave_status (*client_start)(cleave_client*);
  cleave_status (*client_wait)(cleave_client*, int);
  cleave_status (*client_get_status)(const cleave_client*, cleave_client_info*);
  const char* (*last_error)(void);
};

static void* must(void* lib, const char* name) {
  void* f = dlsym(lib, name);
  if (!f) {
    fprintf(stderr, "sdk_rss_app: %s not in the library\n", name);
    exit(1);
  }
  return f;
}

static void load_api(void* lib, struct Api* a) {
  *(void**)&a->options_create = must(lib, "cleave_options_create");
  *(void**)&a->options_set = must(lib, "cleave_options_set");
  *(void**)&a->options_set_data = must(lib, "cleave_options_set_data");
  *(void**)&a->client_create = must(lib, "cleave_client_create");
  *(void**)&a->client_start = must(lib, "cleave_client_start");
  *(void**)&a->client_wait = must(lib, "cleave_client_wait");
  *(void**)&a->client_get_status = must(lib, "cleave_client_get_status");
  *(void**)&a->last_error = must(lib, "cleave_last_error");
}

static const char* flag(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; i += 2)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

/* Runs the client to its end, reporting when it waits and its peak in a job. */
static int run(const struct Api* a, cleave_client* c) {
  long peak = 0;
  int told_waiting = 0;
  cleave_status s;
  if (a->client_start(c) != CLEAVE_OK) return 1;
  while ((s = a->client_wait(c, 50)) == CLEAVE_ERR_TIMEOUT) {
    cleave_client_info info;
    a->client_get_status(c, &info);
    if (info.state == CLEAVE_STATE_WAITING && !told_waiting) {
      printf("waiting 1\n");
      fflush(stdout);
      told_waiting = 1;
    }
    if (info.state == CLEAVE_STATE_IN_JOB && rss_kib() > peak) peak = rss_kib();
  }
  printf("job_peak_kib %ld\nend_kib %ld\n", peak, rss_kib());
  if (s != CLEAVE_OK) fprintf(stderr, "sdk_rss_app: %s\n", a->last_error());
  return s == CLEAVE_OK ? 0 : 1;
}

int main(int argc, char** argv) {
  const int64_t shape[] = {1, 28, 28};
  struct Api a;
  cleave_options* o = NULL;
  cleave_client* c = NULL;
  void* lib;
  g_n = atol(flag(argc, argv, "--samples", "1000"));
  if (g_n < 1) return 2;
  g_x = malloc(sizeof(float) * kPixels * (size_t)g_n);
  g_y = malloc(sizeof(float) * (size_t)g_n);
  if (!g_x || !g_y) return 1;
  for (long i = 0; i < g_n * kPixels; ++i) g_x[i] = (float)((i * 2654435761u) % 256) / 255.0f;
  for (long i = 0; i < g_n; ++i) g_y[i] = (float)(i % 10);
  printf("baseline_kib %ld\n", rss_kib());
  lib = dlopen(flag(argc, argv, "--lib", "libcleave.so.0"), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "sdk_rss_app: %s\n", dlerror());
    return 1;
  }
  load_api(lib, &a);
  printf("loaded_kib %ld\n", rss_kib());
  fflush(stdout);
  if (a.options_create(&o) != CLEAVE_OK || a.options_set(o, "coordinator", flag(argc, argv, "--coordinator", "")) ||
      a.options_set(o, "key", flag(argc, argv, "--key", "")) ||
      a.options_set(o, "coordinator-key", flag(argc, argv, "--coordinator-key", "")) ||
      a.options_set(o, "backend", "cpu") || a.options_set(o, "threads", flag(argc, argv, "--threads", "1")) ||
      a.options_set(o, "max-jobs", flag(argc, argv, "--max-jobs", "0")) || a.options_set(o, "role", "fed-client") ||
      a.options_set_data(o, g_n, shape, 3, 10, "0/1", fill, NULL) || a.client_create(o, &c)) {
    fprintf(stderr, "sdk_rss_app: %s\n", a.last_error());
    return 1;
  }
  sleep_ms(1);
  return run(&a, c);
}
