/* fake_openblas_corename.c: preloaded (LD_PRELOAD) into `cleave` and `cleaved`
 * by test_process_env.cpp, it makes OpenBLAS's kernel choice look like a VM's
 * that hides the CPU model ("Prescott", whatever OpenBLAS really chose), and
 * appends one line per program start to $CLEAVE_TEST_START_LOG:
 * "PID OMP_WAIT_POLICY OPENBLAS_CORETYPE" ("-" for an unset variable), so that
 * the test sees each (re-)execution and the environment it started with. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

char* openblas_get_corename(void) { return (char*)"Prescott"; }

static const char* or_dash(const char* v) { return v ? v : "-"; }

__attribute__((constructor)) static void record_start(void) {
  const char* path = getenv("CLEAVE_TEST_START_LOG");
  if (!path) return;
  FILE* f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "%d %s %s\n", (int)getpid(), or_dash(getenv("OMP_WAIT_POLICY")), or_dash(getenv("OPENBLAS_CORETYPE")));
  fclose(f);
}
