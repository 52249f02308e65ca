// emu.h: a host-only stand-in for the parts of the CUDA runtime and cuBLAS that
// cleave uses, so the CUDA backend (CudaDevice + kernels/cuda/*.cu) can be run and
// checked on a machine without a GPU (scripts/cuda-emulate.sh).
//
// Not part of any build: scripts/cuda-emulate.sh puts this folder first on the
// include path (its cuda_runtime.h, cuda_runtime_api.h and cublas_v2.h include
// this file), rewrites each `kernel<<<grid, block, shm, stream>>>(args)` launch into
// emu::launch(grid, block, [&] { kernel(args); }), and compiles everything with the
// host compiler. Each block runs its CUDA threads as cooperative fibers
// (ucontext) on one OS thread; blocks run one after another, so `__shared__`
// (made `static`) is per block. __syncthreads, __syncwarp and __shfl_xor_sync are
// barriers between fibers, so ordering bugs in the reductions show up as wrong
// results, and a barrier not reached by every thread aborts with "deadlock". Device memory is host memory; "async" copies
// are synchronous; cublasSgemm is a naive column-major reference. What this
// cannot show: real GPU timing, memory coalescing, FMA contraction, or races
// between blocks.
#pragma once

#include <math.h>

#include <algorithm>
#include <atomic>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

using std::isnan;

// ---- types --------------------------------------------------------------------------------
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};
struct CUstream_st {
  int unused;
};
typedef CUstream_st* cudaStream_t;
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem;
};

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0 };
struct cublasContext {
  cudaStream_t stream;
};
typedef cublasContext* cublasHandle_t;

// ---- runtime ------------------------------------------------------------------------------
namespace emu {
inline constexpr size_t kTotalMemory = size_t{16} << 30;
inline std::atomic<size_t> allocated{0};
inline thread_local int current_device = 0;
// EMU_CUDA_DEVICES=0 emulates a machine without a GPU.
inline int device_count() {
  const char* env = std::getenv("EMU_CUDA_DEVICES");
  return env ? std::atoi(env) : 1;
}
}  // namespace emu

inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "invalid argument";
  }
}
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorInvalidValue";
  }
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = emu::device_count();
  return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}
inline cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= emu::device_count()) return cudaErrorInvalidDevice;
  emu::current_device = d;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = emu::current_device;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::strcpy(p->name, "Emulated GPU");
  p->major = 8;
  p->minor = 0;
  p->totalGlobalMem = emu::kTotalMemory;
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new CUstream_st{};
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (bytes > emu::kTotalMemory - emu::allocated.load()) return cudaErrorMemoryAllocation;
  *p = std::malloc(bytes + sizeof(size_t));
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memcpy(*p, &bytes, sizeof bytes);
  *p = static_cast<char*>(*p) + sizeof(size_t);
  std::memset(*p, 0xff, bytes);  // garbage (NaN floats), like fresh device memory
  emu::allocated += bytes;
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  char* base = static_cast<char*>(p) - sizeof(size_t);
  size_t bytes;
  std::memcpy(&bytes, base, sizeof bytes);
  emu::allocated -= bytes;
  std::free(base);
  return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  *total = emu::kTotalMemory;
  *free_bytes = emu::kTotalMemory - emu::allocated.load();
  return cudaSuccess;
}
inline cudaError_t emu_get_last_error() { return cudaSuccess; }
#define cudaGetLastError emu_get_last_error

inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext{nullptr};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
// Column-major C(m,n) = alpha op(A) op(B) + beta C, with cuBLAS's argument checks.
inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float* alpha, const float* a, int lda, const float* b, int ldb,
                                  const float* beta, float* c, int ldc) {
  const int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, rows_a) || ldb < std::max(1, rows_b) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        const float av = ta == CUBLAS_OP_N ? a[i + static_cast<int64_t>(p) * lda] : a[p + static_cast<int64_t>(i) * lda];
        const float bv = tb == CUBLAS_OP_N ? b[p + static_cast<int64_t>(j) * ldb] : b[j + static_cast<int64_t>(p) * ldb];
        acc += static_cast<double>(av) * bv;
      }
      float& out = c[i + static_cast<int64_t>(j) * ldc];
      out = static_cast<float>(*alpha * acc + (*beta == 0.f ? 0.0 : static_cast<double>(*beta) * out));
    }
  return CUBLAS_STATUS_SUCCESS;
}

// ---- kernels ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

namespace emu {
// CUDA threads of one block as cooperative fibers on the calling OS thread.
struct Fiber {
  ucontext_t ctx;
  bool done = false;
};
inline constexpr size_t kStack = 64 * 1024;
inline ucontext_t scheduler;
inline std::vector<Fiber> fibers;
inline std::vector<std::vector<char>> stacks;
inline int current = 0;
inline bool progress = false;
inline uint3 block_idx, thread_idx;
inline int linear_tid = 0;
inline dim3 grid_dim, block_dim;
inline const std::function<void()>* body = nullptr;

inline void yield() { swapcontext(&fibers[current].ctx, &scheduler); }

// Barrier over `expected` fibers; waiting fibers yield until the last arrives.
struct Barrier {
  int expected = 0, count = 0;
  unsigned generation = 0;
  void wait() {
    const unsigned g = generation;
    if (++count == expected) {
      count = 0;
      ++generation;
      progress = true;
      return;
    }
    while (generation == g) yield();
  }
};
inline Barrier block_barrier;
inline std::vector<Barrier> warp_barriers;
inline std::vector<uint64_t> slots;  // one shuffle slot per thread

inline void entry() {
  (*body)();
  fibers[current].done = true;
  progress = true;
}

template <class F>
void launch(dim3 grid, dim3 block, F&& kernel_call) {
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    std::fprintf(stderr, "emu: invalid launch configuration\n");
    std::abort();
  }
  const std::function<void()> fn = kernel_call;
  body = &fn;
  grid_dim = grid;
  block_dim = block;
  if (stacks.size() < threads) stacks.resize(threads, std::vector<char>(kStack));
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        block_idx = uint3{bx, by, bz};
        block_barrier = Barrier{static_cast<int>(threads)};
        warp_barriers.assign((threads + 31) / 32, Barrier{});
        for (unsigned w = 0; w < warp_barriers.size(); ++w)
          warp_barriers[w].expected = static_cast<int>(std::min(32u, threads - 32 * w));
        slots.assign(threads, 0);
        fibers.assign(threads, Fiber{});
        for (unsigned t = 0; t < threads; ++t) {
          getcontext(&fibers[t].ctx);
          fibers[t].ctx.uc_stack.ss_sp = stacks[t].data();
          fibers[t].ctx.uc_stack.ss_size = kStack;
          fibers[t].ctx.uc_link = &scheduler;
          makecontext(&fibers[t].ctx, entry, 0);
        }
        for (bool live = true; live;) {
          live = false;
          progress = false;
          for (unsigned t = 0; t < threads; ++t) {
            if (fibers[t].done) continue;
            live = true;
            current = static_cast<int>(t);
            linear_tid = static_cast<int>(t);
            thread_idx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            swapcontext(&scheduler, &fibers[t].ctx);
          }
          if (live && !progress) {
            std::fprintf(stderr, "emu: deadlock: a barrier (__syncthreads/__syncwarp/shuffle) is not reached by all threads\n");
            std::abort();
          }
        }
      }
  body = nullptr;
}
}  // namespace emu

#define blockIdx (::emu::block_idx)
#define threadIdx (::emu::thread_idx)
#define blockDim (::emu::block_dim)
#define gridDim (::emu::grid_dim)

inline void __syncthreads() { emu::block_barrier.wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barriers[emu::linear_tid / 32].wait(); }
template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  const int tid = emu::linear_tid;
  emu::Barrier& warp = emu::warp_barriers[tid / 32];
  std::memcpy(&emu::slots[tid], &v, sizeof(T));
  warp.wait();
  T out;
  std::memcpy(&out, &emu::slots[(tid & ~31) | ((tid & 31) ^ lane_mask)], sizeof(T));
  warp.wait();
  return out;
}
