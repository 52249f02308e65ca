// process_env.h: the environment a training process needs before its
// libraries load, set by re-executing itself once.
//
// Two libraries read their settings once, when they are loaded, before main()
// runs; a program that wants other values must set them and re-exec:
// - libgomp's OMP_WAIT_POLICY. OpenBLAS (pthreads) and cleave's OpenMP loops
//   share the cores, and libgomp's default keeps idle OpenMP workers spinning,
//   which starves OpenBLAS's threads between GEMMs: on 2 cores a 2-thread
//   training step ran 2-4x slower than with OMP_WAIT_POLICY=passive
//   (bench_train_step).
// - OpenBLAS's OPENBLAS_CORETYPE. Where a hypervisor hides the CPU model,
//   OpenBLAS picks its oldest kernels although the CPU has AVX2 or AVX-512
//   (device/cpu/blas_kernels.h: several times slower matrix products).
// A value the user set for either is always kept.
#pragma once

#include <string>
#include <vector>

namespace cleave {

struct EnvSetting {
  std::string name, value;
};

// What restart_with_cpu_environment sets, given the variables as the process
// found them (nullptr: unset) and the core type OpenBLAS should have chosen
// (blas_better_coretype; empty when its choice fits): OMP_WAIT_POLICY=passive
// when unset, OPENBLAS_CORETYPE=`better_coretype` when unset and one is named.
std::vector<EnvSetting> cpu_environment_to_set(const char* omp_wait_policy, const char* openblas_coretype,
                                               const std::string& better_coretype);

// Sets cpu_environment_to_set's variables for this process and re-executes the
// running program (/proc/self/exe) with the same arguments: it does not return
// when it re-executed. Where it sets OPENBLAS_CORETYPE it says so on stderr,
// with why. It returns when there was nothing to set, and when the exec failed
// (the program then goes on as it is; the variables stay set for its children).
void restart_with_cpu_environment(char** argv);

}  // namespace cleave
