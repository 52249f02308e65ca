/* fed_client.c: an app that keeps its own data in memory and joins a
 * federated run (`cleave fed`) through the SDK's C API (include/cleave/cleave.h).
 *
 *   fed_client --coordinator tcp://HOST:PORT --key dev.key --coordinator-key coordinator.pub
 *              --shard i/n [--data DIR] [--limit N]
 *
 * It reads Fashion-MNIST's training split from DIR (default
 * /usr/share/datasets/fashion-mnist; IDX files, gzip or plain) with its own few
 * lines of code, keeps the contiguous shard i of n of the first N samples, and
 * serves it from the data callback. Progress is printed by the progress callback. */
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
  const char* dir = "/usr/share/datasets/fashion-mnist";
  const int64_t shape[] = {1, 28, 28};
  long limit = 60000, i = 0, n = 1, lo;
  int a, ok;
  Shard data;
  cleave_options* o = NULL;
  cleave_client* c = NULL;
  for (a = 1; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--coordinator")) coordinator = argv[a + 1];
    else if (!strcmp(argv[a], "--key")) key = argv[a + 1];
    else if (!strcmp(argv[a], "--coordinator-key")) coordinator_key = argv[a + 1];
    else if (!strcmp(argv[a], "--shard")) shard = argv[a + 1];
    else if (!strcmp(argv[a], "--data")) dir = argv[a + 1];
    else if (!strcmp(argv[a], "--limit")) limit = atol(argv[a + 1]);
  }
  if (!coordinator || !key || !coordinator_key || !shard || sscanf(shard, "%ld/%ld", &i, &n) != 2 || n < 1 || i < 0 ||
      i >= n || limit < n || limit > 60000) {
    fprintf(stderr, "usage: fed_client --coordinator URL --key FILE --coordinator-key FILE --shard i/n "
                    "[--data DIR] [--limit N]\n");
    return 2;
  }
  lo = i * limit / n;
  data.count = (i + 1) * limit / n - lo;
  data.pixels = read_idx(dir, "train-images-idx3-ubyte", 16, lo * 784, data.count * 784);
  data.labels = read_idx(dir, "train-labels-idx1-ubyte", 8, lo, data.count);
  if (!data.pixels || !data.labels) return 1;
  printf("fed_client: cleave %s, shard %s: %ld samples\n", cleave_version(), shard, data.count);
  ok = check(cleave_options_create(&o)) && check(cleave_options_set_coordinator(o, coordinator)) &&
       check(cleave_options_set_key_files(o, key, coordinator_key)) &&
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
