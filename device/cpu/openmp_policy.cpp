// openmp_policy.cpp: see openmp_policy.h.
#include "device/cpu/openmp_policy.h"

#include <unistd.h>

#include <cstdlib>

namespace cleave {

void prefer_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // exec failed: carry on with the default policy (the variable stays set for children).
}

}  // namespace cleave
