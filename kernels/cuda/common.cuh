// common.cuh: what every CUDA kernel file shares — launch geometry, grid-stride
// loops and warp / block reductions. Device code only plus small host helpers;
// the error-check macros live in cuda_check.h (usable from plain C++ too).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace cleave::cuda {

constexpr int kBlock = 256;              // threads per block for elementwise kernels
constexpr int64_t kMaxGrid = 1 << 16;    // grid-stride loops cover the rest
constexpr unsigned kFullMask = 0xffffffffu;

// Blocks for n elements at `block` threads each, capped (kernels grid-stride).
inline unsigned grid_for(int64_t n, int block = kBlock) {
  int64_t g = (n + block - 1) / block;
  if (g > kMaxGrid) g = kMaxGrid;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g);
}

// Throws std::invalid_argument naming the op when a size is negative.
inline void require_non_negative(const char* op, const char* what, int64_t v) {
  if (v < 0)
    throw std::invalid_argument(std::string("cuda ") + op + ": " + what + " must be >= 0, got " +
                                std::to_string(v));
}

// Smallest multiple of 32 >= n, clamped to [32, cap]: threads for one row of n items.
inline int row_block(int64_t n, int cap = 256) {
  int64_t b = (n + 31) / 32 * 32;
  if (b < 32) b = 32;
  if (b > cap) b = cap;
  return static_cast<int>(b);
}

// First global index and stride of a 1-D grid-stride loop.
__device__ __forceinline__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t global_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `shared` holds 32 T. Contains __syncthreads: call from all threads.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  return warp_sum(total);
}

// Maximum of v over the block; same rules as block_sum.
__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float m = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(m);
}

}  // namespace cleave::cuda
