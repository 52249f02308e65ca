/* guest_maps.c: preloaded into a daemon that runs under qemu-user
 * (bench_idle_rss --guest-maps; built for the guest's architecture by
 * bench_footprint.sh). On SIGUSR2 it copies /proc/self/maps, as qemu presents
 * it to the guest (the guest's own mappings at guest addresses, none of
 * qemu's), to the file named by $CLEAVE_GUEST_MAPS: first to NAME.tmp, then
 * renamed, so the reader never sees half a file. Only async-signal-safe calls
 * run in the handler. The library maps a few pages of its own, which the
 * measurement then includes (about 20 KiB).
 *
 * Without $CLEAVE_GUEST_MAPS it installs nothing. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char out_path[4096];
static char tmp_path[4096 + 8];

static void copy_maps(int sig) {
  (void)sig;
  const int saved = errno;
  const int in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  const int out = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  char buf[8192];
  ssize_t n = 0;
  int ok = in >= 0 && out >= 0;
  while (ok && (n = read(in, buf, sizeof buf)) > 0)
    for (ssize_t done = 0; ok && done < n;) {
      const ssize_t w = write(out, buf + done, (size_t)(n - done));
      ok = w > 0;
      done += w > 0 ? w : 0;
    }
  if (in >= 0) close(in);
  if (out >= 0) close(out);
  if (ok && n == 0) rename(tmp_path, out_path);
  errno = saved;
}

__attribute__((constructor)) static void install(void) {
  const char* path = getenv("CLEAVE_GUEST_MAPS");
  if (!path || !*path || strlen(path) >= sizeof out_path) return;
  memcpy(out_path, path, strlen(path) + 1);
  snprintf(tmp_path, sizeof tmp_path, "%s.tmp", path);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = copy_maps;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, NULL);
}
