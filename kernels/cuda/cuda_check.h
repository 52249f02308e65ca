// cuda_check.h: one check macro per CUDA API (runtime, cuBLAS), with file:line
// and the failing call, for host code (.cpp and .cu alike).
//
// CUDA_CHECK(cudaMalloc(...)) throws cleave::CudaError whose message names the
// call, the location and the runtime's description, so a failed launch or copy
// is an exception the caller can report, never an abort.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace cleave {

// Any failed CUDA runtime or cuBLAS call.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace cuda {

// Name and description of a cuBLAS status (cuBLAS has no cudaGetErrorString).
inline const char* cublas_status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (no usable GPU or driver)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (out of device memory)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (bad argument)";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH (GPU too old)";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED (kernel failed)";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "unknown cuBLAS status";
  }
}

// Throws CudaError for a failed runtime call; `call` is its source text.
inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  throw CudaError(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + call +
                  " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Throws CudaError for a failed cuBLAS call; `call` is its source text.
inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(std::string("cuBLAS error at ") + file + ":" + std::to_string(line) + ": " + call +
                  " failed: " + cublas_status_string(s));
}

}  // namespace cuda
}  // namespace cleave

#define CUDA_CHECK(call) ::cleave::cuda::check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::cleave::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: configuration errors surface here, not at the next sync.
#define CUDA_CHECK_LAUNCH() ::cleave::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
