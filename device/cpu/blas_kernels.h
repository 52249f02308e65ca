// blas_kernels.h: whether OpenBLAS runs kernels far below this CPU.
//
// OpenBLAS as Debian builds it (DYNAMIC_ARCH) picks its kernels at start-up from
// the CPU's vendor, family and model. A hypervisor that hides those gets the
// oldest x86-64 kernels ("Prescott": SSE3), although the CPU flags still offer
// AVX2 or AVX-512: on one such 2-core VM, one-thread sgemm (n = 1024) ran at 30
// GFLOP/s with them against 136 with OPENBLAS_CORETYPE=SkylakeX. The choice is
// made before main() runs: `cleave` and `cleaved` restart themselves with the
// better OPENBLAS_CORETYPE (device/cpu/process_env.h), and a daemon that still
// runs the lesser kernels (an app embedding the SDK, a core type set by hand)
// logs the advice below.
#pragma once

#include <string>

namespace cleave {

// What the CPU offers the kernel choice.
struct CpuVectorUnits {
  bool avx2_fma = false;  // AVX2 and FMA3: OpenBLAS's Haswell kernels
  bool avx512 = false;    // AVX-512 F, BW, DQ and VL: its SkylakeX kernels
};

// "OpenBLAS chose its Prescott kernels, but this CPU has AVX-512 (...)" where
// OpenBLAS's kernels `corename` (openblas_get_corename()) are well below what
// `cpu` offers; empty when the choice fits (or is newer than what is known here).
std::string blas_kernel_mismatch(const std::string& corename, const CpuVectorUnits& cpu);
// Advice for the operator when OpenBLAS's kernels `corename` (openblas_get_corename())
// are well below what `cpu` offers: which OPENBLAS_CORETYPE to start with. Empty
// when the choice fits (or is newer than what is known here).
std::string blas_kernel_advice(const std::string& corename, const CpuVectorUnits& cpu);
// The OPENBLAS_CORETYPE of that advice ("SkylakeX", "Haswell"), empty when there is none.
std::string blas_better_coretype(const std::string& corename, const CpuVectorUnits& cpu);

// What this CPU offers (both false off x86-64).
CpuVectorUnits cpu_vector_units();

// blas_kernel_mismatch, blas_kernel_advice and blas_better_coretype for this
// process's OpenBLAS and CPU (empty off x86-64).
std::string openblas_kernel_mismatch();
std::string openblas_kernel_advice();
std::string openblas_better_coretype();

}  // namespace cleave
