// blas_kernels.cpp: see blas_kernels.h.
#include "device/cpu/blas_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace cleave {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

std::string blas_better_coretype(const std::string& corename, const CpuVectorUnits& cpu) {
  // OpenBLAS's x86-64 kernels without AVX2 (DYNAMIC_ARCH core names, lower case).
  static const std::set<std::string> pre_avx2 = {
      "prescott", "core2",   "penryn",   "dunnington", "nehalem",   "atom",     "sandybridge",
      "opteron",  "opteron_sse3", "barcelona", "bobcat", "bulldozer", "piledriver", "steamroller",
      "excavator", "katmai", "coppermine", "northwood", "banias",   "generic"};
  if (!pre_avx2.count(lower(corename))) return {};
  return cpu.avx512 ? "SkylakeX" : cpu.avx2_fma ? "Haswell" : "";
}

std::string blas_kernel_mismatch(const std::string& corename, const CpuVectorUnits& cpu) {
  if (blas_better_coretype(corename, cpu).empty()) return {};
  return std::string("OpenBLAS chose its ") + corename + " kernels, but this CPU has " +
         (cpu.avx512 ? "AVX-512" : "AVX2 and FMA") + " (a hypervisor that hides the CPU model does this)";
}

std::string blas_kernel_advice(const std::string& corename, const CpuVectorUnits& cpu) {
  const std::string better = blas_better_coretype(corename, cpu);
  if (better.empty()) return {};
  return blas_kernel_mismatch(corename, cpu) +
         ": matrix products run several times slower. Start with OPENBLAS_CORETYPE=" + better +
         " in the environment (systemd: Environment=OPENBLAS_CORETYPE=" + better + " in cleaved.service)";
}

#if defined(__x86_64__) && defined(__GNUC__)
CpuVectorUnits cpu_vector_units() {
  CpuVectorUnits cpu;
  cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return cpu;
}

namespace {

std::string this_corename() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

}  // namespace

std::string openblas_kernel_mismatch() { return blas_kernel_mismatch(this_corename(), cpu_vector_units()); }
std::string openblas_kernel_advice() { return blas_kernel_advice(this_corename(), cpu_vector_units()); }
std::string openblas_better_coretype() { return blas_better_coretype(this_corename(), cpu_vector_units()); }
#else
CpuVectorUnits cpu_vector_units() { return {}; }
std::string openblas_kernel_mismatch() { return {}; }
std::string openblas_kernel_advice() { return {}; }
std::string openblas_better_coretype() { return {}; }
#endif

}  // namespace cleave
