// process_env.cpp: see process_env.h.
#include "device/cpu/process_env.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "device/cpu/blas_kernels.h"

namespace cleave {

std::vector<EnvSetting> cpu_environment_to_set(const char* omp_wait_policy, const char* openblas_coretype,
                                               const std::string& better_coretype) {
  std::vector<EnvSetting> set;
  if (!omp_wait_policy) set.push_back({"OMP_WAIT_POLICY", "passive"});
  if (!openblas_coretype && !better_coretype.empty()) set.push_back({"OPENBLAS_CORETYPE", better_coretype});
  return set;
}

void restart_with_cpu_environment(char** argv) {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  const std::vector<EnvSetting> set =
      cpu_environment_to_set(std::getenv("OMP_WAIT_POLICY"), core, core ? std::string() : openblas_better_coretype());
  if (set.empty()) return;
  const EnvSetting* blas = nullptr;  // the OPENBLAS_CORETYPE it sets, if any
  for (const EnvSetting& s : set) {
    if (::setenv(s.name.c_str(), s.value.c_str(), 1) != 0) return;
    if (s.name == "OPENBLAS_CORETYPE") blas = &s;
  }
  const char* program = argv && argv[0] ? argv[0] : "cleave";
  if (const char* slash = std::strrchr(program, '/')) program = slash + 1;
  if (blas)
    std::fprintf(stderr, "%s: %s: restarting with OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE to choose yourself)\n",
                 program, openblas_kernel_mismatch().c_str(), blas->value.c_str());
  ::execv("/proc/self/exe", argv);
  if (blas)  // the variables stay set: children (the daemons of cleave demo) start with them
    std::fprintf(stderr, "%s: could not restart (%s): going on with OpenBLAS's own kernels\n", program,
                 std::strerror(errno));
}

}  // namespace cleave
