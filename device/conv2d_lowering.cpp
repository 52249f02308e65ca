// conv2d_lowering.cpp: the portable conv2d ops every backend inherits (device.h).
//
// Forward lowers the whole batch with im2col into cols (C*kh*kw, N*oh*ow) and runs
// one GEMM W (OC, C*kh*kw) x cols -> (OC, N*oh*ow), then swaps the first two axes
// into y (N, OC, oh*ow) and adds the bias per channel. Backward recomputes cols
// with im2col rather than keeping them between the passes: cols are kh*kw times
// larger than x, and x is kept anyway, so recomputing trades one cheap pass for a
// lot of stash memory on small devices. The cols buffer is then reused for
// dcols = W^T dy' before col2im scatters it into dx.
//
// This is a few large GEMMs, which is what a GPU wants. The CPU backend overrides
// both ops with a per-sample form that keeps each sample's columns in cache.
#include "device/backends.h"
#include "device/device.h"
#include "device/op_checks.h"

namespace cleave {

size_t lowered_conv2d_workspace_bytes(const Window2d& g, int64_t oc) {
  // The lowering below: cols (C*kh*kw, N*oh*ow) plus, for a batch of more than one,
  // the (OC, N*oh*ow) output (forward) or gradient (backward) copy.
  const int64_t ckk = g.c * g.kh * g.kw, cols_n = g.n * g.out_h() * g.out_w();
  return static_cast<size_t>((ckk + (g.n > 1 ? oc : 0)) * cols_n) * sizeof(float);
}

void Device::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Window2d& g,
                            int64_t oc) {
  check_conv2d_forward(*this, x, w, b, y, g, oc);
  const int64_t ckk = g.c * g.kh * g.kw, ohw = g.out_h() * g.out_w(), cols_n = g.n * ohw;
  if (g.n == 0) return;
  Tensor cols(*this, {ckk, cols_n});  // (C*kh*kw, N*oh*ow)
  im2col(x, cols, g);
  if (g.n == 1) {
    // (OC, oh*ow) is already (1, OC, oh*ow)
    gemm(false, false, oc, cols_n, ckk, 1.0f, w, ckk, cols, cols_n, 0.0f, y, cols_n);
  } else {
    Tensor tmp(*this, {oc, cols_n});  // (OC, N*oh*ow)
    gemm(false, false, oc, cols_n, ckk, 1.0f, w, ckk, cols, cols_n, 0.0f, tmp, cols_n);
    swap_axes01(tmp, y, oc, g.n, ohw);  // -> (N, OC, oh*ow)
  }
  if (b.defined()) add_bias_channels(y, b, g.n, oc, ohw);
}

void Device::conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw, const Tensor& db,
                             const Tensor& dx, const Window2d& g, int64_t oc) {
  check_conv2d_backward(*this, x, w, dy, dw, db, dx, g, oc);
  const int64_t ckk = g.c * g.kh * g.kw, ohw = g.out_h() * g.out_w(), cols_n = g.n * ohw;
  if (g.n == 0) return;
  Tensor dyt = dy;  // (OC, N*oh*ow)
  if (g.n != 1) {
    dyt = Tensor(*this, {oc, cols_n});
    swap_axes01(dy, dyt, g.n, oc, ohw);
  }
  Tensor cols(*this, {ckk, cols_n});  // recomputed (see the file comment)
  im2col(x, cols, g);
  // dW (OC, CKK) += dy' (OC, N*ohw) * cols^T (N*ohw, CKK)
  gemm(false, true, oc, ckk, cols_n, 1.0f, dyt, cols_n, cols, cols_n, 1.0f, dw, ckk);
  if (db.defined()) bias_grad_channels(dy, db, g.n, oc, ohw);
  if (dx.defined()) {
    // dcols (CKK, N*ohw) = W^T (CKK, OC) * dy' (OC, N*ohw), reusing the cols buffer
    gemm(true, false, ckk, cols_n, oc, 1.0f, w, ckk, dyt, cols_n, 0.0f, cols, cols_n);
    col2im(cols, dx, g);
  }
}

}  // namespace cleave
