// openmp_policy.h: make idle OpenMP threads sleep instead of spin.
//
// OpenBLAS (pthreads) and cleave's OpenMP loops share the cores. libgomp's
// default keeps idle OpenMP workers spinning, which starves OpenBLAS's threads
// between GEMMs: on 2 cores a 2-thread training step ran 2-4x slower than with
// OMP_WAIT_POLICY=passive (bench_train_step). libgomp reads the variable once,
// when it is loaded, so an executable that wants it must set it and re-exec
// itself before doing anything else.
#pragma once

namespace cleave {

// When OMP_WAIT_POLICY is unset: sets it to "passive" and re-executes the
// running program with the same arguments (does not return on success; on
// failure it returns and the program continues with the default policy).
// A user's own OMP_WAIT_POLICY is always respected.
void prefer_passive_openmp(char** argv);

}  // namespace cleave
