// cpu_conv.cpp: the CPU backend's convolution — im2col / col2im over a batch, and
// conv2d_forward / conv2d_backward one sample at a time (see the section below).
#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "device/cpu/cpu_device.h"
#include "device/cpu/cpu_loops.h"
#include "device/op_checks.h"

namespace cleave {

using namespace cpu_detail;

namespace {

// One sample's columns: x (c, h, w) -> the rows of channels [c0, c1) of a
// (c*kh*kw, oh*ow) block whose rows lie ldc floats apart (row (ci*kh + i)*kw + j,
// column y*ow + x). Padding reads as zero.
void im2col_planes(const float* __restrict x, float* __restrict cols, int64_t ldc, const Window2d& g, int64_t c0,
                   int64_t c1) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  const int64_t h = g.h, w = g.w, kh = g.kh, kw = g.kw, sh = g.sh, sw = g.sw, ph = g.ph, pw = g.pw;
  for (int64_t r = c0 * kh * kw; r < c1 * kh * kw; ++r) {
    const int64_t ci = r / (kh * kw), i = (r / kw) % kh, j = r % kw;
    int64_t x_lo, x_hi;
    valid_range(w, ow, sw, pw, j, x_lo, x_hi);
    const float* __restrict src = x + ci * h * w;
    for (int64_t yo = 0; yo < oh; ++yo) {
      float* __restrict o = cols + r * ldc + yo * ow;
      const int64_t iy = yo * sh - ph + i;
      if (iy < 0 || iy >= h) {
        std::memset(o, 0, static_cast<size_t>(ow) * sizeof(float));
        continue;
      }
      const float* __restrict in = src + iy * w - pw + j;  // in[xo*sw] is column xo
      for (int64_t xo = 0; xo < x_lo; ++xo) o[xo] = 0.f;
      if (sw == 1) {
        if (x_hi > x_lo) std::memcpy(o + x_lo, in + x_lo, static_cast<size_t>(x_hi - x_lo) * sizeof(float));
      } else {
        for (int64_t xo = x_lo; xo < x_hi; ++xo) o[xo] = in[xo * sw];
      }
      for (int64_t xo = x_hi; xo < ow; ++xo) o[xo] = 0.f;
    }
  }
}

// The reverse for one sample: planes [c0, c1) of dx (c, h, w) := the scatter-add of
// their rows of a column block laid out as im2col_planes writes it.
void col2im_planes(const float* __restrict cols, int64_t ldc, float* __restrict dx, const Window2d& g, int64_t c0,
                   int64_t c1) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  const int64_t h = g.h, w = g.w, kh = g.kh, kw = g.kw, sh = g.sh, sw = g.sw, ph = g.ph, pw = g.pw;
  for (int64_t ci = c0; ci < c1; ++ci) {
    float* __restrict plane = dx + ci * h * w;
    std::memset(plane, 0, static_cast<size_t>(h * w) * sizeof(float));
    for (int64_t i = 0; i < kh; ++i) {
      for (int64_t j = 0; j < kw; ++j) {
        int64_t x_lo, x_hi;
        valid_range(w, ow, sw, pw, j, x_lo, x_hi);
        const float* __restrict src = cols + ((ci * kh + i) * kw + j) * ldc;
        for (int64_t yo = 0; yo < oh; ++yo) {
          const int64_t iy = yo * sh - ph + i;
          if (iy < 0 || iy >= h) continue;
          float* __restrict out = plane + iy * w - pw + j;
          const float* __restrict in = src + yo * ow;
          if (sw == 1) {
            for (int64_t xo = x_lo; xo < x_hi; ++xo) out[xo] += in[xo];
          } else {
            for (int64_t xo = x_lo; xo < x_hi; ++xo) out[xo * sw] += in[xo];
          }
        }
      }
    }
  }
}

// A 1x1 window with stride 1 and no padding: a sample's columns are the sample itself.
bool pointwise(const Window2d& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}

// conv2d_backward splits a batch of n into this many fixed groups of consecutive
// samples. Each group sums its samples' weight gradients in order into its own
// partial (of partial_floats floats); the partials are then added in group order.
// The grouping depends on the shapes only, so dw comes out bit for bit the same
// whatever the thread count.
int64_t conv_groups(int64_t n, int64_t partial_floats) {
  constexpr int64_t kMaxGroups = 16;
  constexpr int64_t kPartialBudget = int64_t{4} << 20;  // floats (16 MiB) of partials at most
  return std::clamp<int64_t>(std::min(n, kPartialBudget / std::max<int64_t>(partial_floats, 1)), 1, kMaxGroups);
}

// OpenBLAS's thread count for one scope, put back afterwards. While an OpenMP team
// runs one GEMM per thread, OpenBLAS must not start threads of its own.
class BlasThreads {
 public:
  explicit BlasThreads(int inside) : before_(openblas_get_num_threads()) {
    if (inside != before_) openblas_set_num_threads(inside);
  }
  ~BlasThreads() {
    if (openblas_get_num_threads() != before_) openblas_set_num_threads(before_);
  }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;

 private:
  int before_;
};

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// convolution helpers

void CpuDevice::im2col(const Tensor& x, const Tensor& cols, const Window2d& g) {
  check_im2col(*this, x, cols, g);
  const int64_t ohw = g.out_h() * g.out_w(), ncols = g.n * ohw, in_size = g.c * g.h * g.w;
  const float* px = ptr(x);
  float* pc = ptr(cols);
  run_chunks(team_size(g.n * g.c, g.kh * g.kw * ohw), g.n * g.c, [&](int, int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      const int64_t ni = p / g.c, ci = p % g.c;
      im2col_planes(px + ni * in_size, pc + ni * ohw, ncols, g, ci, ci + 1);
    }
  });
}

void CpuDevice::col2im(const Tensor& cols, const Tensor& dx, const Window2d& g) {
  check_col2im(*this, cols, dx, g);
  const int64_t ohw = g.out_h() * g.out_w(), ncols = g.n * ohw, in_size = g.c * g.h * g.w;
  const float* pc = ptr(cols);
  float* pdx = ptr(dx);
  run_chunks(team_size(g.n * g.c, g.kh * g.kw * ohw), g.n * g.c, [&](int, int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      const int64_t ni = p / g.c, ci = p % g.c;
      col2im_planes(pc + ni * ohw, ncols, pdx + ni * in_size, g, ci, ci + 1);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// convolution
//
// One sample at a time, the samples split among the OpenMP team, each thread with
// its own column buffer (c*kh*kw x oh*ow, which fits in L2 for the layers we run)
// and single-threaded GEMMs: the columns are built, used and dropped while still
// in cache, and the output lands directly in NCHW, so the portable lowering's
// batch-wide columns, its axis swaps and their trips through memory all go away.
// A batch of one runs on the calling thread with OpenBLAS threading the GEMMs.

size_t CpuDevice::conv2d_workspace_bytes(const Window2d& g, int64_t oc) {
  if (g.n == 0) return 0;
  const int64_t ckk = g.c * g.kh * g.kw, ohw = g.out_h() * g.out_w();
  const int64_t cols = pointwise(g) ? 0 : ckk * ohw;  // one sample's columns per thread
  const int64_t forward = team_bound(g.n, 2 * oc * ckk * ohw) * cols;
  const int64_t part = oc * ckk + oc;
  const int64_t groups = conv_groups(g.n, part);
  const int64_t backward = groups * part + team_bound(groups, 4 * oc * ckk * ohw * (g.n / groups)) * cols;
  return static_cast<size_t>(std::max(forward, backward)) * sizeof(float);
}

void CpuDevice::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                               const Window2d& g, int64_t oc) {
  check_conv2d_forward(*this, x, w, b, y, g, oc);
  if (g.n == 0) return;
  const int64_t ckk = g.c * g.kh * g.kw, ohw = g.out_h() * g.out_w(), in_size = g.c * g.h * g.w;
  const bool direct = pointwise(g);
  const int team = team_size(g.n, 2 * oc * ckk * ohw);
  const Tensor scratch = direct ? Tensor() : Tensor(*this, {team, ckk * ohw});
  const float* px = ptr(x);
  const float* pw = ptr(w);
  const float* pb = ptr(b);
  float* py = ptr(y);
  const BlasThreads blas(team > 1 ? 1 : threads_);
  run_chunks(team, g.n, [&](int t, int64_t s, int64_t e) {
    float* cols = direct ? nullptr : ptr(scratch) + t * ckk * ohw;
    for (int64_t i = s; i < e; ++i) {
      const float* xi = px + i * in_size;
      if (!direct) im2col_planes(xi, cols, ohw, g, 0, g.c);
      float* yi = py + i * oc * ohw;
      sgemm(false, false, oc, ohw, ckk, pw, ckk, direct ? xi : cols, ohw, 0.0f, yi, ohw);
      if (pb == nullptr) continue;
      for (int64_t o = 0; o < oc; ++o) {
        float* __restrict plane = yi + o * ohw;
        const float v = pb[o];
        for (int64_t k = 0; k < ohw; ++k) plane[k] += v;
      }
    }
  });
}

void CpuDevice::conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw,
                                const Tensor& db, const Tensor& dx, const Window2d& g, int64_t oc) {
  check_conv2d_backward(*this, x, w, dy, dw, db, dx, g, oc);
  if (g.n == 0) return;
  const int64_t ckk = g.c * g.kh * g.kw, ohw = g.out_h() * g.out_w(), in_size = g.c * g.h * g.w;
  const int64_t w_size = oc * ckk, part = w_size + oc;  // a group's partial: dw then db
  const bool direct = pointwise(g);
  const int64_t groups = conv_groups(g.n, part);
  const int team = team_size(groups, (dx.defined() ? 4 : 2) * oc * ckk * ohw * (g.n / groups));
  const Tensor partials(*this, {groups, part});
  const Tensor scratch = direct ? Tensor() : Tensor(*this, {team, ckk * ohw});
  const float* px = ptr(x);
  const float* pw = ptr(w);
  const float* pdy = ptr(dy);
  float* pdx = ptr(dx);
  float* pp = ptr(partials);
  {
    const BlasThreads blas(team > 1 ? 1 : threads_);
    run_chunks(team, groups, [&](int t, int64_t gs, int64_t ge) {
      float* cols = direct ? nullptr : ptr(scratch) + t * ckk * ohw;
      for (int64_t gi = gs; gi < ge; ++gi) {
        float* gdw = pp + gi * part;
        float* gdb = gdw + w_size;
        const int64_t first = g.n * gi / groups, last = g.n * (gi + 1) / groups;
        for (int64_t i = first; i < last; ++i) {
          const float* xi = px + i * in_size;
          const float* dyi = pdy + i * oc * ohw;
          if (!direct) im2col_planes(xi, cols, ohw, g, 0, g.c);
          // dw_g (OC, CKK) (+)= dy_i (OC, ohw) * cols_i^T (ohw, CKK)
          sgemm(false, true, oc, ckk, ohw, dyi, ohw, direct ? xi : cols, ohw, i == first ? 0.0f : 1.0f, gdw, ckk);
          for (int64_t o = 0; o < oc; ++o) {
            const float* __restrict plane = dyi + o * ohw;
            float acc = 0.f;
#pragma omp simd reduction(+ : acc)
            for (int64_t k = 0; k < ohw; ++k) acc += plane[k];
            gdb[o] = i == first ? acc : gdb[o] + acc;
          }
          if (pdx == nullptr) continue;
          // dcols_i (CKK, ohw) = W^T (CKK, OC) * dy_i (OC, ohw), scattered into dx_i
          float* dxi = pdx + i * in_size;
          sgemm(true, false, ckk, ohw, oc, pw, ckk, dyi, ohw, 0.0f, direct ? dxi : cols, ohw);
          if (!direct) col2im_planes(cols, ohw, dxi, g, 0, g.c);
        }
      }
    });
  }
  float* pdw = ptr(dw);
  float* pdb = ptr(db);
  const int64_t total = pdb != nullptr ? part : w_size;
  run_chunks(team_size(total, groups), total, [&](int, int64_t s, int64_t e) {
    for (int64_t j = s; j < e; ++j) {
      float acc = 0.f;
      for (int64_t gi = 0; gi < groups; ++gi) acc += pp[gi * part + j];
      if (j < w_size)
        pdw[j] += acc;
      else
        pdb[j - w_size] += acc;
    }
  });
}

}  // namespace cleave
