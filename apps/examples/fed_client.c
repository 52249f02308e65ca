/* fed_client.c: an app that keeps its own data in memory and joins a
 * federated run (`cleave fed`) through the SDK's C API (include/cleave/cleave.h).
 *
 *   fed_client --coordinator tcp://HOST:PORT --key dev.key --coordinator-key coordinator.pub
 *              --shard i/n [--data DIR] [--limit N] [--seed S] [--backend B] [--threads T]
 *
 * It reads Fashion-MNIST's training split from DIR (default
 * /usr/share/datasets/fashion-mnist; IDX files, gzip or plain) with its own few
 * lines of code, keeps shard i of n of the first N samples, and serves it from
 * the data callback. Progress is printed by the progress callback. --backend
 * (auto, cpu, opencl, cuda) and --threads (0: all cores) go to the SDK as given.
 *
 * Which samples shard i holds:
 *   without --seed  the contiguous run [i*N/n, (i+1)*N/n).
 *   with --seed S   the shard `cleaved --dataset fashion-mnist --shard i/n
 *                   --partition iid --seed S --limit-train N` holds, so the app
 *                   and daemons share one run's shards without overlap. The
 *                   rule (core/data/shard.cpp, integer arithmetic only): a
 *                   Fisher-Yates permutation of 0..N-1 drawn from xoshiro256**
 *                   seeded with derive_seed(S, 0x1d1d) (core/util/rng.h), cut
 *                   into n runs [k*N/n, (k+1)*N/n); run i, in ascending order. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "cleave/cleave.h"

typedef struct {
  unsigned char* pixels; /* count * 784 */
  unsigned char* labels; /* count */
  long count;
} Shard;

/* Reads `n` bytes after a `header`-byte IDX header of DIR/NAME(.gz); NULL on failure. */
static unsigned char* read_idx(const char* dir, const char* name, long header, long offset, long n) {
  char path[1024];
  unsigned char* out = malloc((size_t)n);
  gzFile f;
  snprintf(path, sizeof path, "%s/%s.gz", dir, name);
  f = gzopen(path, "rb");
  if (!f) {
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = gzopen(path, "rb");
  }
  if (!f || !out || gzseek(f, header + offset, SEEK_SET) < 0 || gzread(f, out, (unsigned)n) != (int)n) {
    fprintf(stderr, "fed_client: cannot read %s\n", path);
    free(out);
    out = NULL;
  }
  if (f) gzclose(f);
  return out;
}

/* splitmix64 and xoshiro256**, as core/util/rng.h. */
static uint64_t splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4]) {
  const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

/* Marks in `in_shard` (n_total flags) the samples of cleaved's iid shard i of n
 * for `seed` (see the top of this file); 0 when out of memory. */
static int mark_iid_shard(uint64_t seed, long n_total, long i, long n, unsigned char* in_shard) {
  uint64_t x = seed ^ 0x6a09e667f3bcc909ULL, h, s[4];
  long* order = malloc(sizeof(long) * (size_t)n_total);
  long k;
  int w;
  if (!order) return 0;
  h = splitmix64(&x); /* derive_seed(seed, 0x1d1d, 0, 0) */
  x = h ^ 0x1d1d;
  h = splitmix64(&x);
  x = h;
  h = splitmix64(&x);
  x = h;
  h = splitmix64(&x);
  for (w = 0; w < 4; ++w) s[w] = splitmix64(&h);
  for (k = 0; k < n_total; ++k) order[k] = k;
  for (k = n_total - 1; k > 0; --k) {
    const long j = (long)(next_u64(s) % (uint64_t)(k + 1)), t = order[k];
    order[k] = order[j];
    order[j] = t;
  }
  memset(in_shard, 0, (size_t)n_total);
  for (k = n_total * i / n; k < n_total * (i + 1) / n; ++k) in_shard[order[k]] = 1;
  free(order);
  return 1;
}

/* Loads shard i of n of the first `limit` samples into `out` (see the top of
 * this file: contiguous, or cleaved's iid shard when `seeded`); 0 on failure. */
static int load_shard(const char* dir, long limit, long i, long n, int seeded, uint64_t seed, Shard* out) {
  const long lo = seeded ? 0 : i * limit / n, count = seeded ? limit : (i + 1) * limit / n - lo;
  unsigned char* in_shard = seeded ? malloc((size_t)limit) : NULL;
  long k, kept = 0;
  out->pixels = read_idx(dir, "train-images-idx3-ubyte", 16, lo * 784, count * 784);
  out->labels = read_idx(dir, "train-labels-idx1-ubyte", 8, lo, count);
  out->count = count;
  if (!out->pixels || !out->labels || (seeded && (!in_shard || !mark_iid_shard(seed, limit, i, n, in_shard)))) {
    free(in_shard);
    return 0;
  }
  if (!seeded) return 1;
  for (k = 0; k < limit; ++k) {
    if (!in_shard[k]) continue;
    memmove(out->pixels + kept * 784, out->pixels + k * 784, 784);
    out->labels[kept++] = out->labels[k];
  }
  out->count = kept;
  free(in_shard);
  return 1;
}

static int64_t fill(void* user, const int64_t* indices, int64_t count, float* inputs, float* labels) {
  const Shard* s = user;
  int64_t k;
  int j;
  for (k = 0; k < count; ++k) {
    if (indices[k] < 0 || indices[k] >= s->count) return -1;
    for (j = 0; j < 784; ++j) inputs[k * 784 + j] = s->pixels[indices[k] * 784 + j] / 255.0f;
    labels[k] = s->labels[indices[k]];
  }
  return count;
}

static void progress(void* user, const cleave_progress* p) {
  (void)user;
  if (p->event == CLEAVE_EVENT_CONNECTED) printf("connected\n");
  if (p->event == CLEAVE_EVENT_ROUND) printf("round %lld: local loss %.4f\n", (long long)p->step + 1, p->loss);
  if (p->event == CLEAVE_EVENT_JOB_ENDED) printf("job ended\n");
  fflush(stdout);
}

static int check(cleave_status s) {
  if (s != CLEAVE_OK) fprintf(stderr, "fed_client: %s\n", cleave_last_error());
  return s == CLEAVE_OK;
}

int main(int argc, char** argv) {
  const char *coordinator = NULL, *key = NULL, *coordinator_key = NULL, *shard = NULL;
  const char *dir = "/usr/share/datasets/fashion-mnist", *backend = "auto";
  const int64_t shape[] = {1, 28, 28};
  long limit = 60000, i = 0, n = 1;
  int a, ok, seeded = 0, threads = 0;
  uint64_t seed = 0;
  Shard data = {NULL, NULL, 0};
  cleave_options* o = NULL;
  cleave_client* c = NULL;
  for (a = 1; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--coordinator")) coordinator = argv[a + 1];
    else if (!strcmp(argv[a], "--key")) key = argv[a + 1];
    else if (!strcmp(argv[a], "--coordinator-key")) coordinator_key = argv[a + 1];
    else if (!strcmp(argv[a], "--shard")) shard = argv[a + 1];
    else if (!strcmp(argv[a], "--data")) dir = argv[a + 1];
    else if (!strcmp(argv[a], "--limit")) limit = atol(argv[a + 1]);
    else if (!strcmp(argv[a], "--backend")) backend = argv[a + 1];
    else if (!strcmp(argv[a], "--threads")) threads = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--seed")) {
      seeded = 1;
      seed = strtoull(argv[a + 1], NULL, 10);
    }
  }
  if (!coordinator || !key || !coordinator_key || !shard || sscanf(shard, "%ld/%ld", &i, &n) != 2 || n < 1 || i < 0 ||
      i >= n || limit < n || limit > 60000) {
    fprintf(stderr, "usage: fed_client --coordinator URL --key FILE --coordinator-key FILE --shard i/n "
                    "[--data DIR] [--limit N] [--seed S] [--backend B] [--threads T]\n");
    return 2;
  }
  if (!load_shard(dir, limit, i, n, seeded, seed, &data)) {
    free(data.pixels);
    free(data.labels);
    return 1;
  }
  printf("fed_client: cleave %s, shard %s (%s): %ld samples\n", cleave_version(), shard, seeded ? "iid" : "contiguous",
         data.count);
  ok = check(cleave_options_create(&o)) && check(cleave_options_set_coordinator(o, coordinator)) &&
       check(cleave_options_set_key_files(o, key, coordinator_key)) &&
       check(cleave_options_set_backend(o, backend, threads)) &&
       check(cleave_options_set_role(o, CLEAVE_ROLE_FED_CLIENT)) &&
       check(cleave_options_set_data(o, data.count, shape, 3, 10, shard, fill, &data)) &&
       check(cleave_options_set_progress_callback(o, progress, NULL)) && check(cleave_client_create(o, &c)) &&
       check(cleave_client_start(c)) && check(cleave_client_wait(c, -1));
  cleave_client_destroy(c);
  cleave_options_destroy(o);
  free(data.pixels);
  free(data.labels);
  return ok ? 0 : 1;
}
