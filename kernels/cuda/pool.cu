// pool.cu: max and average pooling over NCHW planes, forward and backward.
//
// Forward: one thread per output element, scanning its window clipped to the
// image in row-major order (max: first maximum wins, NaN propagates, exactly as
// the CPU backend). Backward gathers: one thread per input pixel sums the output
// gradients of the windows that cover it, in ascending output order, so the
// result is deterministic and matches the CPU scatter bit for bit.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

// Output index range [lo, hi) along one axis whose windows cover input position i.
__device__ __forceinline__ void covering(int64_t i, int64_t pad, int64_t k, int64_t stride, int64_t out,
                                         int64_t& lo, int64_t& hi) {
  const int64_t first = i + pad - k + 1;  // yo * stride >= first
  lo = first > 0 ? (first + stride - 1) / stride : 0;
  hi = (i + pad) / stride + 1;  // yo * stride <= i + pad
  if (hi > out) hi = out;
}

__global__ void maxpool_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       float* __restrict__ argmax, Window2d g, int64_t oh, int64_t ow,
                                       int64_t total) {
  for (int64_t idx = global_index(); idx < total; idx += global_stride()) {
    const int64_t xo = idx % ow, yo = (idx / ow) % oh, plane = idx / (oh * ow);
    const float* in = x + plane * g.h * g.w;
    const int64_t hs0 = yo * g.sh - g.ph, ws0 = xo * g.sw - g.pw;
    const int64_t hs = hs0 > 0 ? hs0 : 0, he = hs0 + g.kh < g.h ? hs0 + g.kh : g.h;
    const int64_t ws = ws0 > 0 ? ws0 : 0, we = ws0 + g.kw < g.w ? ws0 + g.kw : g.w;
    float best = -INFINITY;
    int64_t best_i = (hs < he && ws < we) ? hs * g.w + ws : -1;
    for (int64_t iy = hs; iy < he; ++iy)
      for (int64_t ix = ws; ix < we; ++ix) {
        const float v = in[iy * g.w + ix];
        if (v > best || (isnan(v) && !isnan(best))) {
          best = v;
          best_i = iy * g.w + ix;
        }
      }
    y[idx] = best;
    argmax[idx] = static_cast<float>(best_i);
  }
}

__global__ void maxpool_backward_kernel(const float* __restrict__ dy, const float* __restrict__ argmax,
                                        float* __restrict__ dx, Window2d g, int64_t oh, int64_t ow,
                                        int64_t total) {
  for (int64_t idx = global_index(); idx < total; idx += global_stride()) {
    const int64_t ix = idx % g.w, iy = (idx / g.w) % g.h, plane = idx / (g.h * g.w);
    const int64_t pos = iy * g.w + ix;
    int64_t y_lo, y_hi, x_lo, x_hi;
    covering(iy, g.ph, g.kh, g.sh, oh, y_lo, y_hi);
    covering(ix, g.pw, g.kw, g.sw, ow, x_lo, x_hi);
    const float* d = dy + plane * oh * ow;
    const float* a = argmax + plane * oh * ow;
    float acc = 0.f;
    for (int64_t yo = y_lo; yo < y_hi; ++yo)
      for (int64_t xo = x_lo; xo < x_hi; ++xo) {
        const int64_t o = yo * ow + xo;
        if (static_cast<int64_t>(a[o]) == pos) acc += d[o];
      }
    dx[idx] = acc;
  }
}

__global__ void avgpool_forward_kernel(const float* __restrict__ x, float* __restrict__ y, Window2d g, int64_t oh,
                                       int64_t ow, int64_t total, float inv) {
  for (int64_t idx = global_index(); idx < total; idx += global_stride()) {
    const int64_t xo = idx % ow, yo = (idx / ow) % oh, plane = idx / (oh * ow);
    const float* in = x + plane * g.h * g.w;
    const int64_t hs0 = yo * g.sh - g.ph, ws0 = xo * g.sw - g.pw;
    const int64_t hs = hs0 > 0 ? hs0 : 0, he = hs0 + g.kh < g.h ? hs0 + g.kh : g.h;
    const int64_t ws = ws0 > 0 ? ws0 : 0, we = ws0 + g.kw < g.w ? ws0 + g.kw : g.w;
    float acc = 0.f;
    for (int64_t iy = hs; iy < he; ++iy)
      for (int64_t ix = ws; ix < we; ++ix) acc += in[iy * g.w + ix];
    y[idx] = acc * inv;
  }
}

__global__ void avgpool_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, Window2d g,
                                        int64_t oh, int64_t ow, int64_t total, float inv) {
  for (int64_t idx = global_index(); idx < total; idx += global_stride()) {
    const int64_t ix = idx % g.w, iy = (idx / g.w) % g.h, plane = idx / (g.h * g.w);
    int64_t y_lo, y_hi, x_lo, x_hi;
    covering(iy, g.ph, g.kh, g.sh, oh, y_lo, y_hi);
    covering(ix, g.pw, g.kw, g.sw, ow, x_lo, x_hi);
    const float* d = dy + plane * oh * ow;
    float acc = 0.f;
    for (int64_t yo = y_lo; yo < y_hi; ++yo)
      for (int64_t xo = x_lo; xo < x_hi; ++xo) acc += d[yo * ow + xo] * inv;
    dx[idx] = acc;
  }
}

}  // namespace

void maxpool_forward(const float* x, float* y, float* argmax, const Window2d& g, cudaStream_t s) {
  check_window("maxpool_forward", g);
  const int64_t oh = g.out_h(), ow = g.out_w(), total = g.n * g.c * oh * ow;
  if (total == 0) return;
  maxpool_forward_kernel<<<grid_for(total), kBlock, 0, s>>>(x, y, argmax, g, oh, ow, total);
  CUDA_CHECK_LAUNCH();
}

void maxpool_backward(const float* dy, const float* argmax, float* dx, const Window2d& g, cudaStream_t s) {
  check_window("maxpool_backward", g);
  const int64_t total = g.n * g.c * g.h * g.w;
  if (total == 0) return;
  maxpool_backward_kernel<<<grid_for(total), kBlock, 0, s>>>(dy, argmax, dx, g, g.out_h(), g.out_w(), total);
  CUDA_CHECK_LAUNCH();
}

void avgpool_forward(const float* x, float* y, const Window2d& g, cudaStream_t s) {
  check_window("avgpool_forward", g);
  const int64_t oh = g.out_h(), ow = g.out_w(), total = g.n * g.c * oh * ow;
  if (total == 0) return;
  const float inv = 1.f / static_cast<float>(g.kh * g.kw);
  avgpool_forward_kernel<<<grid_for(total), kBlock, 0, s>>>(x, y, g, oh, ow, total, inv);
  CUDA_CHECK_LAUNCH();
}

void avgpool_backward(const float* dy, float* dx, const Window2d& g, cudaStream_t s) {
  check_window("avgpool_backward", g);
  const int64_t total = g.n * g.c * g.h * g.w;
  if (total == 0) return;
  const float inv = 1.f / static_cast<float>(g.kh * g.kw);
  avgpool_backward_kernel<<<grid_for(total), kBlock, 0, s>>>(dy, dx, g, g.out_h(), g.out_w(), total, inv);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
