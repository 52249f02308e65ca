// reference_ops.h: naive, obviously-correct host implementations of the Device ops.
//
// Written independently of every backend (double accumulation, direct index
// formulas, no blocking) so that tests can check any backend against them. All
// functions work on std::vector<float> in the layouts documented in device/device.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "device/device.h"

namespace cleave::ref {

using Vec = std::vector<float>;

// C(m,n) = alpha * op(A) op(B) + beta * C with row strides lda, ldb, ldc.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const Vec& a, int64_t lda,
                 const Vec& b, int64_t ldb, float beta, Vec& c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      const double old = beta == 0.f ? 0.0 : static_cast<double>(beta) * c[i * ldc + j];
      c[i * ldc + j] = static_cast<float>(alpha * acc + old);
    }
}

inline float act(Activation a, float x) {
  const double d = x;
  switch (a) {
    case Activation::relu: return x > 0 ? x : 0.f;
    case Activation::gelu: return static_cast<float>(0.5 * d * (1.0 + std::erf(d / std::sqrt(2.0))));
    case Activation::tanh: return static_cast<float>(std::tanh(d));
    case Activation::gelu_tanh: {
      const double k = std::sqrt(2.0 / 3.14159265358979323846);
      return static_cast<float>(0.5 * d * (1.0 + std::tanh(k * (d + 0.044715 * d * d * d))));
    }
  }
  return 0.f;
}
// Derivative of act at x.
inline float act_grad(Activation a, float x) {
  const double d = x;
  switch (a) {
    case Activation::relu: return x > 0 ? 1.f : 0.f;
    case Activation::gelu: {
      const double pi = 3.14159265358979323846;
      return static_cast<float>(0.5 * (1.0 + std::erf(d / std::sqrt(2.0))) + d * std::exp(-d * d / 2) / std::sqrt(2 * pi));
    }
    case Activation::tanh: return static_cast<float>(1.0 - std::tanh(d) * std::tanh(d));
    case Activation::gelu_tanh: {
      const double k = std::sqrt(2.0 / 3.14159265358979323846);
      const double th = std::tanh(k * (d + 0.044715 * d * d * d));
      return static_cast<float>(0.5 * (1.0 + th) + 0.5 * d * (1.0 - th * th) * k * (1.0 + 3 * 0.044715 * d * d));
    }
  }
  return 0.f;
}

// Input value at (ni, ci, iy, ix) with zero padding outside the image.
inline float at(const Vec& x, const Window2d& g, int64_t ni, int64_t ci, int64_t iy, int64_t ix) {
  if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return 0.f;
  return x[((ni * g.c + ci) * g.h + iy) * g.w + ix];
}

inline Vec im2col(const Vec& x, const Window2d& g) {
  const int64_t oh = g.out_h(), ow = g.out_w(), ncols = g.n * oh * ow;
  Vec cols(static_cast<size_t>(g.c * g.kh * g.kw * ncols));
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j)
        for (int64_t ni = 0; ni < g.n; ++ni)
          for (int64_t y = 0; y < oh; ++y)
            for (int64_t xo = 0; xo < ow; ++xo)
              cols[((ci * g.kh + i) * g.kw + j) * ncols + (ni * oh + y) * ow + xo] =
                  at(x, g, ni, ci, y * g.sh - g.ph + i, xo * g.sw - g.pw + j);
  return cols;
}

inline Vec col2im(const Vec& cols, const Window2d& g) {
  const int64_t oh = g.out_h(), ow = g.out_w(), ncols = g.n * oh * ow;
  std::vector<double> dx(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.0);
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j)
        for (int64_t ni = 0; ni < g.n; ++ni)
          for (int64_t y = 0; y < oh; ++y)
            for (int64_t xo = 0; xo < ow; ++xo) {
              const int64_t iy = y * g.sh - g.ph + i, ix = xo * g.sw - g.pw + j;
              if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
              dx[((ni * g.c + ci) * g.h + iy) * g.w + ix] +=
                  cols[((ci * g.kh + i) * g.kw + j) * ncols + (ni * oh + y) * ow + xo];
            }
  return Vec(dx.begin(), dx.end());
}

inline Vec swap_axes01(const Vec& src, int64_t a, int64_t b, int64_t r) {
  Vec dst(src.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < r; ++k) dst[(j * a + i) * r + k] = src[(i * b + j) * r + k];
  return dst;
}

// Direct convolution: y (n, oc, oh, ow) from x (n, c, h, w), w (oc, c*kh*kw) and
// b (oc; empty = no bias), summed in double.
inline Vec conv2d(const Vec& x, const Vec& w, const Vec& b, const Window2d& g, int64_t oc) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  Vec y(static_cast<size_t>(g.n * oc * oh * ow));
  for (int64_t ni = 0; ni < g.n; ++ni)
    for (int64_t o = 0; o < oc; ++o)
      for (int64_t yo = 0; yo < oh; ++yo)
        for (int64_t xo = 0; xo < ow; ++xo) {
          double acc = b.empty() ? 0.0 : b[o];
          for (int64_t ci = 0; ci < g.c; ++ci)
            for (int64_t i = 0; i < g.kh; ++i)
              for (int64_t j = 0; j < g.kw; ++j)
                acc += static_cast<double>(w[((o * g.c + ci) * g.kh + i) * g.kw + j]) *
                       at(x, g, ni, ci, yo * g.sh - g.ph + i, xo * g.sw - g.pw + j);
          y[((ni * oc + o) * oh + yo) * ow + xo] = static_cast<float>(acc);
        }
  return y;
}

// Gradients of conv2d for dy (n, oc, oh, ow): dw (oc, c*kh*kw), db (oc), dx (n, c, h, w).
inline void conv2d_backward(const Vec& x, const Vec& w, const Vec& dy, const Window2d& g, int64_t oc, Vec& dw,
                            Vec& db, Vec& dx) {
  const int64_t oh = g.out_h(), ow = g.out_w(), ckk = g.c * g.kh * g.kw;
  std::vector<double> gw(static_cast<size_t>(oc * ckk)), gb(static_cast<size_t>(oc)),
      gx(static_cast<size_t>(g.n * g.c * g.h * g.w));
  for (int64_t ni = 0; ni < g.n; ++ni)
    for (int64_t o = 0; o < oc; ++o)
      for (int64_t yo = 0; yo < oh; ++yo)
        for (int64_t xo = 0; xo < ow; ++xo) {
          const double d = dy[((ni * oc + o) * oh + yo) * ow + xo];
          gb[o] += d;
          for (int64_t ci = 0; ci < g.c; ++ci)
            for (int64_t i = 0; i < g.kh; ++i)
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t iy = yo * g.sh - g.ph + i, ix = xo * g.sw - g.pw + j;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                const int64_t wi = (o * g.c + ci) * g.kh * g.kw + i * g.kw + j;
                const int64_t xi = ((ni * g.c + ci) * g.h + iy) * g.w + ix;
                gw[wi] += d * x[xi];
                gx[xi] += d * w[wi];
              }
        }
  dw.assign(gw.begin(), gw.end());
  db.assign(gb.begin(), gb.end());
  dx.assign(gx.begin(), gx.end());
}

// Max pooling: y and argmax (index in the input plane, first maximum in row-major window order).
inline void maxpool(const Vec& x, const Window2d& g, Vec& y, Vec& arg) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  y.assign(static_cast<size_t>(g.n * g.c * oh * ow), 0.f);
  arg = y;
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t yo = 0; yo < oh; ++yo)
      for (int64_t xo = 0; xo < ow; ++xo) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t best_i = -1;
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iy = yo * g.sh - g.ph + i, ix = xo * g.sw - g.pw + j;
            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
            const float v = x[p * g.h * g.w + iy * g.w + ix];
            if (best_i < 0 || v > best) {
              best = v;
              best_i = iy * g.w + ix;
            }
          }
        y[p * oh * ow + yo * ow + xo] = best;
        arg[p * oh * ow + yo * ow + xo] = static_cast<float>(best_i);
      }
}

inline Vec maxpool_backward(const Vec& dy, const Vec& arg, const Window2d& g) {
  const int64_t ohw = g.out_h() * g.out_w(), hw = g.h * g.w;
  Vec dx(static_cast<size_t>(g.n * g.c * hw), 0.f);
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t o = 0; o < ohw; ++o) dx[p * hw + static_cast<int64_t>(arg[p * ohw + o])] += dy[p * ohw + o];
  return dx;
}

inline Vec avgpool(const Vec& x, const Window2d& g) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  Vec y(static_cast<size_t>(g.n * g.c * oh * ow));
  for (int64_t ni = 0; ni < g.n; ++ni)
    for (int64_t ci = 0; ci < g.c; ++ci)
      for (int64_t yo = 0; yo < oh; ++yo)
        for (int64_t xo = 0; xo < ow; ++xo) {
          double acc = 0;
          for (int64_t i = 0; i < g.kh; ++i)
            for (int64_t j = 0; j < g.kw; ++j) acc += at(x, g, ni, ci, yo * g.sh - g.ph + i, xo * g.sw - g.pw + j);
          y[((ni * g.c + ci) * oh + yo) * ow + xo] = static_cast<float>(acc / static_cast<double>(g.kh * g.kw));
        }
  return y;
}

inline Vec avgpool_backward(const Vec& dy, const Window2d& g) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  std::vector<double> dx(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.0);
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t yo = 0; yo < oh; ++yo)
      for (int64_t xo = 0; xo < ow; ++xo)
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iy = yo * g.sh - g.ph + i, ix = xo * g.sw - g.pw + j;
            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
            dx[p * g.h * g.w + iy * g.w + ix] += dy[p * oh * ow + yo * ow + xo] / static_cast<double>(g.kh * g.kw);
          }
  return Vec(dx.begin(), dx.end());
}

// Layer norm forward in double; returns y and fills mean / rstd.
inline Vec layernorm(const Vec& x, const Vec& gamma, const Vec& beta, int64_t rows, int64_t cols, double eps,
                     Vec* mean = nullptr, Vec* rstd = nullptr) {
  Vec y(x.size());
  if (mean) mean->assign(static_cast<size_t>(rows), 0.f);
  if (rstd) rstd->assign(static_cast<size_t>(rows), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mu += x[r * cols + j];
    mu /= static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) var += (x[r * cols + j] - mu) * (x[r * cols + j] - mu);
    var /= static_cast<double>(cols);
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < cols; ++j)
      y[r * cols + j] = static_cast<float>((x[r * cols + j] - mu) * rs * gamma[j] + beta[j]);
    if (mean) (*mean)[r] = static_cast<float>(mu);
    if (rstd) (*rstd)[r] = static_cast<float>(rs);
  }
  return y;
}

}  // namespace cleave::ref
