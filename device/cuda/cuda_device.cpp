// cuda_device.cpp: CudaDevice — memory, copies, cuBLAS GEMM, and the calls into
// the kernel launchers of kernels/cuda/. Every op checks its arguments with the
// checks shared by all backends (device/op_checks.h) before anything is queued,
// then binds the GPU to the calling thread and launches on the device's stream.
#include "device/cuda/cuda_device.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "device/backends.h"
#include "device/op_checks.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace cleave {

namespace {

std::string unusable(const std::string& why) {
  return "CUDA backend compiled in but no CUDA device is usable: " + why + "; use --backend cpu or opencl";
}

float* ptr(const Tensor& t) { return t.defined() ? static_cast<float*>(t.handle()) + t.offset() : nullptr; }

cudaStream_t as_stream(CUstream_st* s) { return s; }
cublasHandle_t as_handle(cublasContext* h) { return h; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// identity and memory

CudaDevice::CudaDevice(const DeviceOptions& opts)
    : ordinal_(opts.ordinal), limit_(opts.memory_limit), in_use_(std::make_shared<std::atomic<size_t>>(0)) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(unusable(cudaGetErrorString(e)));
  }
  if (count == 0) throw std::runtime_error(unusable("no CUDA GPU found"));
  if (ordinal_ < 0 || ordinal_ >= count)
    throw std::runtime_error("cuda: no GPU with ordinal " + std::to_string(ordinal_) + " (this machine has " +
                             std::to_string(count) + ", numbered from 0)");
  try {
    CUDA_CHECK(cudaSetDevice(ordinal_));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
    char desc[512];
    std::snprintf(desc, sizeof desc, "cuda:%d (%s, sm_%d%d, %.1f GiB)", ordinal_, prop.name, prop.major, prop.minor,
                  static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    name_ = desc;
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreate(&stream));
    stream_ = stream;
    cublasHandle_t handle = nullptr;
    CUBLAS_CHECK(cublasCreate(&handle));
    cublas_ = handle;
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    // Plain float math (no TF32), results comparable with the CPU's BLAS.
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    void* scratch = nullptr;
    CUDA_CHECK(cudaMalloc(&scratch, (cuda::kSumSquaresPartials + 1) * sizeof(double)));
    scratch_ = static_cast<double*>(scratch);
  } catch (...) {
    destroy();
    throw;
  }
}

CudaDevice::~CudaDevice() { destroy(); }

void CudaDevice::destroy() noexcept {
  if (cudaSetDevice(ordinal_) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (stream_ != nullptr) cudaStreamSynchronize(as_stream(stream_));
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (cublas_ != nullptr) cublasDestroy(as_handle(cublas_));
  if (stream_ != nullptr) cudaStreamDestroy(as_stream(stream_));
  scratch_ = nullptr;
  cublas_ = nullptr;
  stream_ = nullptr;
  cudaGetLastError();  // errors at teardown are not actionable
}

void CudaDevice::bind() const { CUDA_CHECK(cudaSetDevice(ordinal_)); }

MemoryInfo CudaDevice::memory() const {
  bind();
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  MemoryInfo info;
  if (limit_ > 0) {
    const size_t used = in_use_->load();
    info.total = std::min(limit_, total_bytes);
    info.free = std::min(limit_ > used ? limit_ - used : 0, free_bytes);
  } else {
    info.total = total_bytes;
    info.free = free_bytes;
  }
  return info;
}

std::shared_ptr<Buffer> CudaDevice::allocate(size_t bytes) {
  const size_t used = in_use_->fetch_add(bytes) + bytes;
  if (limit_ > 0 && used > limit_) {
    in_use_->fetch_sub(bytes);
    throw OutOfMemory(name_ + ": cannot allocate " + mib_text(bytes) + " MiB: " + mib_text(used - bytes) +
                      " MiB in use of the " + mib_text(limit_) + " MiB limit (--memory-limit)");
  }
  void* p = nullptr;
  if (bytes > 0) {
    try {
      bind();
    } catch (...) {
      in_use_->fetch_sub(bytes);
      throw;
    }
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      in_use_->fetch_sub(bytes);
      cudaGetLastError();
      if (e == cudaErrorMemoryAllocation)
        throw OutOfMemory(name_ + ": cannot allocate " + mib_text(bytes) + " MiB: the GPU is out of memory (" +
                          mib_text(used - bytes) + " MiB in use by this device)");
      cuda::check(e, "cudaMalloc(&p, bytes)", __FILE__, __LINE__);
    }
  }
  auto buf = std::make_shared<Buffer>();
  buf->device = this;
  buf->handle = p;
  buf->bytes = bytes;
  buf->release = [counter = in_use_, ordinal = ordinal_](Buffer& b) {
    if (b.handle != nullptr) {
      // May run on any thread, after the device is gone: restore the caller's GPU.
      int previous = -1;
      const bool had = cudaGetDevice(&previous) == cudaSuccess;
      if (cudaSetDevice(ordinal) == cudaSuccess) cudaFree(b.handle);
      if (had && previous != ordinal) cudaSetDevice(previous);
      cudaGetLastError();
    }
    counter->fetch_sub(b.bytes);
    b.handle = nullptr;
  };
  return buf;
}

void CudaDevice::upload(const Tensor& dst, const float* src) {
  check_upload(*this, dst, src);
  if (dst.numel() == 0) return;
  bind();
  // Pageable source: returns once src has been staged, so the caller may reuse it.
  CUDA_CHECK(cudaMemcpyAsync(ptr(dst), src, dst.bytes(), cudaMemcpyHostToDevice, as_stream(stream_)));
}

void CudaDevice::download(const Tensor& src, float* dst) {
  check_download(*this, src, dst);
  if (src.numel() == 0) return;
  bind();
  CUDA_CHECK(cudaMemcpyAsync(dst, ptr(src), src.bytes(), cudaMemcpyDeviceToHost, as_stream(stream_)));
  CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
}

void CudaDevice::copy(const Tensor& src, const Tensor& dst) {
  check_copy(*this, src, dst);
  if (src.numel() == 0) return;
  const float* s = ptr(src);
  float* d = ptr(dst);
  if (s == d) return;
  bind();
  const cudaStream_t stream = as_stream(stream_);
  const int64_t n = src.numel();
  if (d < s + n && s < d + n) {
    // Overlapping ranges (memmove semantics): go through a temporary.
    void* tmp = nullptr;
    CUDA_CHECK(cudaMallocAsync(&tmp, src.bytes(), stream));
    CUDA_CHECK(cudaMemcpyAsync(tmp, s, src.bytes(), cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(d, tmp, src.bytes(), cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaFreeAsync(tmp, stream));
    return;
  }
  CUDA_CHECK(cudaMemcpyAsync(d, s, src.bytes(), cudaMemcpyDeviceToDevice, stream));
}

void CudaDevice::fill(const Tensor& t, float value) {
  check_fill(*this, t);
  bind();
  cuda::fill(ptr(t), t.numel(), value, as_stream(stream_));
}

void CudaDevice::synchronize() {
  bind();
  CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
}

// ---------------------------------------------------------------------------------------------
// GEMM: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so cuBLAS
// gets B first and A second, with m and n exchanged, and the same row strides.

void CudaDevice::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Tensor& a,
                      int64_t lda, const Tensor& b, int64_t ldb, float beta, const Tensor& c, int64_t ldc) {
  check_gemm(*this, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  if (m == 0 || n == 0) return;
  bind();
  if (k == 0) {
    cuda::scale_matrix(ptr(c), m, n, ldc, beta, as_stream(stream_));
    return;
  }
  CUBLAS_CHECK(cublasSgemm(as_handle(cublas_), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                           static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, ptr(b),
                           static_cast<int>(ldb), ptr(a), static_cast<int>(lda), &beta, ptr(c),
                           static_cast<int>(ldc)));
}

// ---------------------------------------------------------------------------------------------
// elementwise

void CudaDevice::axpy(float alpha, const Tensor& x, const Tensor& y) {
  check_axpy(*this, x, y);
  bind();
  cuda::axpy(alpha, ptr(x), ptr(y), x.numel(), as_stream(stream_));
}

void CudaDevice::scale(const Tensor& x, float alpha) {
  check_scale(*this, x);
  bind();
  cuda::scale(ptr(x), alpha, x.numel(), as_stream(stream_));
}

void CudaDevice::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_mul(*this, a, b, out);
  bind();
  cuda::mul(ptr(a), ptr(b), ptr(out), a.numel(), as_stream(stream_));
}

void CudaDevice::activation_forward(Activation act, const Tensor& x, const Tensor& y) {
  check_activation_forward(*this, act, x, y);
  bind();
  cuda::activation_forward(act, ptr(x), ptr(y), x.numel(), as_stream(stream_));
}

void CudaDevice::activation_backward(Activation act, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& dx) {
  check_activation_backward(*this, act, x, y, dy, dx);
  const float* px = nullptr;
  const float* py = nullptr;
  switch (act) {
    case Activation::relu: px = ptr(x.defined() ? x : y); break;  // x > 0 exactly where y > 0: either will do
    case Activation::gelu:
    case Activation::gelu_tanh: px = ptr(x); break;
    case Activation::tanh: py = ptr(y); break;
  }
  const int64_t n = dy.numel();
  bind();
  cuda::activation_backward(act, px, py, ptr(dy), ptr(dx), n, as_stream(stream_));
}

// ---------------------------------------------------------------------------------------------
// bias

void CudaDevice::add_bias_rows(const Tensor& y, const Tensor& b, int64_t rows, int64_t features) {
  check_add_bias_rows(*this, y, b, rows, features);
  bind();
  cuda::add_bias_rows(ptr(y), ptr(b), rows, features, as_stream(stream_));
}

void CudaDevice::bias_grad_rows(const Tensor& dy, const Tensor& db, int64_t rows, int64_t features) {
  check_bias_grad_rows(*this, dy, db, rows, features);
  bind();
  cuda::bias_grad_rows(ptr(dy), ptr(db), rows, features, as_stream(stream_));
}

void CudaDevice::add_bias_channels(const Tensor& y, const Tensor& b, int64_t n, int64_t c, int64_t hw) {
  check_add_bias_channels(*this, y, b, n, c, hw);
  bind();
  cuda::add_bias_channels(ptr(y), ptr(b), n, c, hw, as_stream(stream_));
}

void CudaDevice::bias_grad_channels(const Tensor& dy, const Tensor& db, int64_t n, int64_t c, int64_t hw) {
  check_bias_grad_channels(*this, dy, db, n, c, hw);
  bind();
  cuda::bias_grad_channels(ptr(dy), ptr(db), n, c, hw, as_stream(stream_));
}

// ---------------------------------------------------------------------------------------------
// convolution helpers

void CudaDevice::im2col(const Tensor& x, const Tensor& cols, const Window2d& g) {
  check_im2col(*this, x, cols, g);
  bind();
  cuda::im2col(ptr(x), ptr(cols), g, as_stream(stream_));
}

void CudaDevice::col2im(const Tensor& cols, const Tensor& dx, const Window2d& g) {
  check_col2im(*this, cols, dx, g);
  bind();
  cuda::col2im(ptr(cols), ptr(dx), g, as_stream(stream_));
}

void CudaDevice::swap_axes01(const Tensor& src, const Tensor& dst, int64_t a, int64_t b, int64_t r) {
  if (!check_swap_axes01(*this, src, dst, a, b, r)) return;
  bind();
  cuda::swap_axes01(ptr(src), ptr(dst), a, b, r, as_stream(stream_));
}

// ---------------------------------------------------------------------------------------------
// pooling

void CudaDevice::maxpool_forward(const Tensor& x, const Tensor& y, const Tensor& argmax, const Window2d& g) {
  check_maxpool_forward(*this, x, y, argmax, g);
  bind();
  cuda::maxpool_forward(ptr(x), ptr(y), ptr(argmax), g, as_stream(stream_));
}

void CudaDevice::maxpool_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx, const Window2d& g) {
  check_maxpool_backward(*this, dy, argmax, dx, g);
  bind();
  cuda::maxpool_backward(ptr(dy), ptr(argmax), ptr(dx), g, as_stream(stream_));
}

void CudaDevice::avgpool_forward(const Tensor& x, const Tensor& y, const Window2d& g) {
  check_avgpool_forward(*this, x, y, g);
  bind();
  cuda::avgpool_forward(ptr(x), ptr(y), g, as_stream(stream_));
}

void CudaDevice::avgpool_backward(const Tensor& dy, const Tensor& dx, const Window2d& g) {
  check_avgpool_backward(*this, dy, dx, g);
  bind();
  cuda::avgpool_backward(ptr(dy), ptr(dx), g, as_stream(stream_));
}

// ---------------------------------------------------------------------------------------------
// layer norm

void CudaDevice::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                   const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols, float eps) {
  check_layernorm_forward(*this, x, gamma, beta, y, mean, rstd, rows, cols);
  bind();
  cuda::layernorm_forward(ptr(x), ptr(gamma), ptr(beta), ptr(y), ptr(mean), ptr(rstd), rows, cols, eps,
                          as_stream(stream_));
}

void CudaDevice::layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                    const Tensor& dy, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                                    int64_t rows, int64_t cols) {
  check_layernorm_backward(*this, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols);
  bind();
  cuda::layernorm_backward(ptr(x), ptr(gamma), ptr(mean), ptr(rstd), ptr(dy), ptr(dx), ptr(dgamma), ptr(dbeta),
                           rows, cols, as_stream(stream_));
}

// ---------------------------------------------------------------------------------------------
// losses

void CudaDevice::softmax_xent(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                              const Tensor& dlogits, int64_t rows, int64_t classes, float grad_scale) {
  check_softmax_xent(*this, logits, labels, loss, dlogits, rows, classes);
  bind();
  cuda::softmax_xent(ptr(logits), ptr(labels), ptr(loss), ptr(dlogits), rows, classes, grad_scale,
                     as_stream(stream_));
}

void CudaDevice::mse(const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred,
                     int64_t rows, int64_t cols, float grad_scale) {
  check_mse(*this, pred, target, loss, dpred, rows, cols);
  bind();
  cuda::mse(ptr(pred), ptr(target), ptr(loss), ptr(dpred), rows, cols, grad_scale, as_stream(stream_));
}

void CudaDevice::argmax_match(const Tensor& logits, const Tensor& labels, const Tensor& correct, int64_t rows,
                              int64_t classes) {
  check_argmax_match(*this, logits, labels, correct, rows, classes);
  bind();
  cuda::argmax_match(ptr(logits), ptr(labels), ptr(correct), rows, classes, as_stream(stream_));
}

// ---------------------------------------------------------------------------------------------
// optimizers

void CudaDevice::sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
                          const SgdStep& s) {
  check_sgd_step(*this, params, grads, momentum_buf, s);
  const int64_t n = params.numel();
  const bool use_momentum = s.momentum != 0.f;
  bind();
  cuda::sgd_step(ptr(params), ptr(grads), use_momentum ? ptr(momentum_buf) : nullptr, n, s, as_stream(stream_));
}

void CudaDevice::adam_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                           const AdamStep& s) {
  check_adam_step(*this, params, grads, m, v, s);
  const int64_t n = params.numel();
  bind();
  cuda::adam_step(ptr(params), ptr(grads), ptr(m), ptr(v), n, s, as_stream(stream_));
}

// ---------------------------------------------------------------------------------------------
// transformer ops

namespace {
// Throws, as the CPU backend does, when an id of ids (rows, on the GPU) is not an
// index in [0, vocab). The ids are read back (rows floats, a blocking copy).
void check_token_ids(Device& dev, const char* op, const Tensor& ids, int64_t rows, int64_t vocab) {
  if (rows == 0) return;
  std::vector<float> host(static_cast<size_t>(rows));
  dev.download(Tensor::view(ids, 0, {rows}), host.data());
  for (int64_t r = 0; r < rows; ++r) {
    const float id = host[static_cast<size_t>(r)];
    if (!(id >= 0.f) || !(id < static_cast<float>(vocab)) || id != std::floor(id))
      throw std::invalid_argument(std::string("cuda ") + op + ": label " + std::to_string(id) + " in row " +
                                  std::to_string(r) + " is not a class index in [0, " + std::to_string(vocab) + ")");
  }
}
}  // namespace

void CudaDevice::embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y, int64_t rows,
                                   int64_t vocab, int64_t width) {
  check_embedding(*this, "embedding_forward", ids, table, y, rows, vocab, width);
  check_token_ids(*this, "embedding_forward", ids, rows, vocab);
  bind();
  cuda::embedding_forward(ptr(ids), ptr(table), ptr(y), rows, vocab, width, as_stream(stream_));
}

void CudaDevice::embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, int64_t rows,
                                    int64_t vocab, int64_t width) {
  check_embedding(*this, "embedding_backward", ids, dtable, dy, rows, vocab, width);
  check_token_ids(*this, "embedding_backward", ids, rows, vocab);
  bind();
  cuda::embedding_backward(ptr(ids), ptr(dy), ptr(dtable), rows, vocab, width, as_stream(stream_));
}

void CudaDevice::causal_softmax_forward(const Tensor& scores, const Tensor& probs, int64_t n, int64_t t,
                                        float scale) {
  check_causal_softmax(*this, "causal_softmax_forward", scores, probs, Tensor(), n, t);
  bind();
  cuda::causal_softmax_forward(ptr(scores), ptr(probs), n, t, scale, as_stream(stream_));
}

void CudaDevice::causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores,
                                         int64_t n, int64_t t, float scale) {
  check_causal_softmax(*this, "causal_softmax_backward", probs, dprobs, dscores, n, t);
  bind();
  cuda::causal_softmax_backward(ptr(probs), ptr(dprobs), ptr(dscores), n, t, scale, as_stream(stream_));
}

float CudaDevice::sum_squares(const Tensor& t) {
  check_sum_squares(*this, t);
  bind();
  const cudaStream_t stream = as_stream(stream_);
  double* result = scratch_ + cuda::kSumSquaresPartials;
  cuda::sum_squares(ptr(t), t.numel(), scratch_, result, stream);
  double host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof host, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return static_cast<float>(host);
}

// ---------------------------------------------------------------------------------------------

std::unique_ptr<Device> make_cuda_device(const DeviceOptions& opts) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(unusable(std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)));
  }
  if (count == 0) throw std::runtime_error(unusable("the driver reports no CUDA GPU"));
  return std::make_unique<CudaDevice>(opts);
}

}  // namespace cleave
