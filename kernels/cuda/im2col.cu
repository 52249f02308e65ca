// im2col.cu: im2col / col2im for convolution as GEMM, and the window check every
// windowed op (convolution, pooling) shares. col2im gathers instead of scattering,
// so it needs no atomics and is deterministic.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

// One thread per element of cols (c*kh*kw, n*oh*ow); consecutive threads write
// consecutive columns.
__global__ void im2col_kernel(const float* __restrict__ x, float* __restrict__ cols, Window2d g, int64_t oh,
                              int64_t ow, int64_t total) {
  const int64_t ncols = g.n * oh * ow;
  for (int64_t idx = global_index(); idx < total; idx += global_stride()) {
    const int64_t row = idx / ncols, col = idx - row * ncols;
    const int64_t ci = row / (g.kh * g.kw), i = (row / g.kw) % g.kh, j = row % g.kw;
    const int64_t ni = col / (oh * ow), yo = (col / ow) % oh, xo = col % ow;
    const int64_t iy = yo * g.sh - g.ph + i, ix = xo * g.sw - g.pw + j;
    float v = 0.f;
    if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) v = x[((ni * g.c + ci) * g.h + iy) * g.w + ix];
    cols[idx] = v;
  }
}

// One thread per image element of dx (n, c, h, w): sums every cols entry that
// im2col reads from this pixel, in (i, j, yo, xo) order like the CPU scatter.
__global__ void col2im_kernel(const float* __restrict__ cols, float* __restrict__ dx, Window2d g, int64_t oh,
                              int64_t ow, int64_t total) {
  const int64_t ncols = g.n * oh * ow;
  for (int64_t idx = global_index(); idx < total; idx += global_stride()) {
    const int64_t ix = idx % g.w, iy = (idx / g.w) % g.h;
    const int64_t plane = idx / (g.h * g.w);
    const int64_t ci = plane % g.c, ni = plane / g.c;
    float acc = 0.f;
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t ty = iy + g.ph - i;  // = yo * sh
      if (ty < 0 || ty % g.sh != 0) continue;
      const int64_t yo = ty / g.sh;
      if (yo >= oh) continue;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t tx = ix + g.pw - j;  // = xo * sw
        if (tx < 0 || tx % g.sw != 0) continue;
        const int64_t xo = tx / g.sw;
        if (xo >= ow) continue;
        acc += cols[((ci * g.kh + i) * g.kw + j) * ncols + (ni * oh + yo) * ow + xo];
      }
    }
    dx[idx] = acc;
  }
}

}  // namespace

void check_window(const char* op, const Window2d& g) {
  if (g.n < 0 || g.c < 0 || g.h < 1 || g.w < 1 || g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.ph < 0 ||
      g.pw < 0 || g.h + 2 * g.ph < g.kh || g.w + 2 * g.pw < g.kw)
    throw std::invalid_argument(std::string("cuda ") + op + ": invalid window (input " + std::to_string(g.n) +
                                "x" + std::to_string(g.c) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w) +
                                ", kernel " + std::to_string(g.kh) + "x" + std::to_string(g.kw) + ", stride " +
                                std::to_string(g.sh) + "x" + std::to_string(g.sw) + ", padding " +
                                std::to_string(g.ph) + "x" + std::to_string(g.pw) + ")");
}

void im2col(const float* x, float* cols, const Window2d& g, cudaStream_t s) {
  check_window("im2col", g);
  const int64_t oh = g.out_h(), ow = g.out_w();
  const int64_t total = g.c * g.kh * g.kw * g.n * oh * ow;
  if (total == 0) return;
  im2col_kernel<<<grid_for(total), kBlock, 0, s>>>(x, cols, g, oh, ow, total);
  CUDA_CHECK_LAUNCH();
}

void col2im(const float* cols, float* dx, const Window2d& g, cudaStream_t s) {
  check_window("col2im", g);
  const int64_t total = g.n * g.c * g.h * g.w;
  if (total == 0) return;
  col2im_kernel<<<grid_for(total), kBlock, 0, s>>>(cols, dx, g, g.out_h(), g.out_w(), total);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
