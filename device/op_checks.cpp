// op_checks.cpp: the shared argument checks of the Device ops (see op_checks.h).
#include "device/op_checks.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>

namespace cleave {

namespace {

// Checks for one call of one op; every failure names the backend and the op.
struct Checker {
  const Device& dev;
  const char* op;

  [[noreturn]] void fail(const std::string& what) const { throw op_error(dev, op, what); }

  void on_device(const Tensor& t, const char* what) const {
    if (!t.defined()) fail(std::string(what) + " is undefined");
    if (&t.device() != &dev) fail(std::string(what) + " lives on another device (" + t.device().name() + ")");
  }
  // t must hold at least `need` elements.
  void at_least(const Tensor& t, const char* what, int64_t need) const {
    on_device(t, what);
    if (t.numel() < need)
      fail(std::string(what) + " " + shape_str(t.shape()) + " has " + std::to_string(t.numel()) +
           " elements, needs " + std::to_string(need));
  }
  // t must hold exactly `n` elements.
  void same(const Tensor& t, const char* what, int64_t n) const {
    on_device(t, what);
    if (t.numel() != n)
      fail(std::string(what) + " " + shape_str(t.shape()) + " has " + std::to_string(t.numel()) +
           " elements, expected " + std::to_string(n));
  }
  void dims(std::initializer_list<int64_t> ds) const {
    for (int64_t d : ds)
      if (d < 0) fail("negative dimension " + std::to_string(d));
  }
  // Matrix dimensions handed to BLAS, whose integers are 32-bit.
  void blas_range(std::initializer_list<int64_t> ds) const {
    for (int64_t d : ds)
      if (d > INT_MAX)
        fail("dimension " + std::to_string(d) + " exceeds the BLAS integer range (" + std::to_string(INT_MAX) + ")");
  }
  void positive(int64_t v, const char* what) const {
    if (v == 0) fail(std::string(what) + " must be > 0");
  }
  // Input at least 1x1, window and stride >= 1, padding >= 0, window fits the padded input.
  void window(const Window2d& g) const {
    if (g.n < 0 || g.c < 0 || g.h < 1 || g.w < 1 || g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.ph < 0 ||
        g.pw < 0 || g.h + 2 * g.ph < g.kh || g.w + 2 * g.pw < g.kw)
      fail("invalid window (input " + std::to_string(g.n) + "x" + std::to_string(g.c) + "x" + std::to_string(g.h) +
           "x" + std::to_string(g.w) + ", kernel " + std::to_string(g.kh) + "x" + std::to_string(g.kw) +
           ", stride " + std::to_string(g.sh) + "x" + std::to_string(g.sw) + ", padding " + std::to_string(g.ph) +
           "x" + std::to_string(g.pw) + ")");
  }
  // The part both conv2d ops share: window, out channels, BLAS range, x and w.
  void convolution(const Tensor& x, const Tensor& w, const Window2d& g, int64_t oc) const {
    window(g);
    dims({oc});
    positive(oc, "out channels");
    blas_range({oc, g.c * g.kh * g.kw, g.out_h() * g.out_w()});
    at_least(x, "x", g.n * g.c * g.h * g.w);
    at_least(w, "w", oc * g.c * g.kh * g.kw);
  }
  void activation(Activation act) const {
    switch (act) {
      case Activation::relu:
      case Activation::gelu:
      case Activation::tanh:
      case Activation::gelu_tanh: return;
    }
    fail("unknown activation " + std::to_string(static_cast<int>(act)));
  }
};

// Where the first element of t lies: (allocation, element index). On a
// host-accessible device every tensor is placed in one address space (wrap_host
// buffers may alias others); elsewhere distinct buffers never share memory.
struct Place {
  const void* base;
  int64_t first;
};
Place place_of(const Tensor& t) {
  if (t.device().host_accessible())
    return {nullptr, static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(t.host_data()) / sizeof(float))};
  return {t.handle(), t.offset()};
}

}  // namespace

std::invalid_argument op_error(const Device& dev, const char* op, const std::string& what) {
  return std::invalid_argument(std::string(backend_name(dev.backend())) + " " + op + ": " + what);
}

// ---------------------------------------------------------------------------------------------
// memory

void check_upload(const Device& dev, const Tensor& dst, const float* src) {
  const Checker ck{dev, "upload"};
  ck.on_device(dst, "dst");
  if (dst.numel() > 0 && src == nullptr) ck.fail("null source for " + std::to_string(dst.numel()) + " elements");
}

void check_download(const Device& dev, const Tensor& src, const float* dst) {
  const Checker ck{dev, "download"};
  ck.on_device(src, "src");
  if (src.numel() > 0 && dst == nullptr)
    ck.fail("null destination for " + std::to_string(src.numel()) + " elements");
}

void check_copy(const Device& dev, const Tensor& src, const Tensor& dst) {
  const Checker ck{dev, "copy"};
  ck.on_device(src, "src");
  ck.same(dst, "dst", src.numel());
}

void check_fill(const Device& dev, const Tensor& t) { Checker{dev, "fill"}.on_device(t, "tensor"); }

// ---------------------------------------------------------------------------------------------
// GEMM

void check_gemm(const Device& dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a,
                int64_t lda, const Tensor& b, int64_t ldb, const Tensor& c, int64_t ldc) {
  const Checker ck{dev, "gemm"};
  ck.dims({m, n, k});
  if (std::max({m, n, k, lda, ldb, ldc}) > INT_MAX)
    ck.fail("dimensions exceed the BLAS integer range (m " + std::to_string(m) + ", n " + std::to_string(n) +
            ", k " + std::to_string(k) + ", lda " + std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " +
            std::to_string(ldc) + "; the limit is " + std::to_string(INT_MAX) + ")");
  const int64_t rows_a = trans_a ? k : m, cols_a = trans_a ? m : k;
  const int64_t rows_b = trans_b ? n : k, cols_b = trans_b ? k : n;
  if (lda < std::max<int64_t>(1, cols_a) || ldb < std::max<int64_t>(1, cols_b) || ldc < std::max<int64_t>(1, n))
    ck.fail("leading dimension too small (lda " + std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " +
            std::to_string(ldc) + " for m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
            std::to_string(k) + ")");
  if (m == 0 || n == 0) return;
  ck.at_least(c, "C", (m - 1) * ldc + n);
  if (k == 0) return;
  ck.at_least(a, "A", (rows_a - 1) * lda + cols_a);
  ck.at_least(b, "B", (rows_b - 1) * ldb + cols_b);
}

// ---------------------------------------------------------------------------------------------
// elementwise

void check_axpy(const Device& dev, const Tensor& x, const Tensor& y) {
  const Checker ck{dev, "axpy"};
  ck.on_device(x, "x");
  ck.same(y, "y", x.numel());
}

void check_scale(const Device& dev, const Tensor& x) { Checker{dev, "scale"}.on_device(x, "x"); }

void check_mul(const Device& dev, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Checker ck{dev, "mul"};
  ck.on_device(a, "a");
  ck.same(b, "b", a.numel());
  ck.same(out, "out", a.numel());
}

void check_activation_forward(const Device& dev, Activation act, const Tensor& x, const Tensor& y) {
  const Checker ck{dev, "activation_forward"};
  ck.activation(act);
  ck.on_device(x, "x");
  ck.same(y, "y", x.numel());
}

void check_activation_backward(const Device& dev, Activation act, const Tensor& x, const Tensor& y,
                               const Tensor& dy, const Tensor& dx) {
  const Checker ck{dev, "activation_backward"};
  ck.activation(act);
  ck.on_device(dy, "dy");
  const int64_t n = dy.numel();
  ck.same(dx, "dx", n);
  switch (act) {
    case Activation::relu:
      if (x.defined())
        ck.same(x, "x", n);
      else
        ck.same(y, y.defined() ? "y (x being undefined)" : "x (or y)", n);
      return;
    case Activation::gelu:
    case Activation::gelu_tanh: ck.same(x, "x", n); return;
    case Activation::tanh: ck.same(y, "y", n); return;
  }
}

// ---------------------------------------------------------------------------------------------
// bias

void check_add_bias_rows(const Device& dev, const Tensor& y, const Tensor& b, int64_t rows, int64_t features) {
  const Checker ck{dev, "add_bias_rows"};
  ck.dims({rows, features});
  ck.at_least(y, "y", rows * features);
  ck.at_least(b, "b", features);
}

void check_bias_grad_rows(const Device& dev, const Tensor& dy, const Tensor& db, int64_t rows, int64_t features) {
  const Checker ck{dev, "bias_grad_rows"};
  ck.dims({rows, features});
  ck.at_least(dy, "dy", rows * features);
  ck.at_least(db, "db", features);
}

void check_add_bias_channels(const Device& dev, const Tensor& y, const Tensor& b, int64_t n, int64_t c,
                             int64_t hw) {
  const Checker ck{dev, "add_bias_channels"};
  ck.dims({n, c, hw});
  ck.at_least(y, "y", n * c * hw);
  ck.at_least(b, "b", c);
}

void check_bias_grad_channels(const Device& dev, const Tensor& dy, const Tensor& db, int64_t n, int64_t c,
                              int64_t hw) {
  const Checker ck{dev, "bias_grad_channels"};
  ck.dims({n, c, hw});
  ck.at_least(dy, "dy", n * c * hw);
  ck.at_least(db, "db", c);
}

// ---------------------------------------------------------------------------------------------
// convolution helpers

void check_im2col(const Device& dev, const Tensor& x, const Tensor& cols, const Window2d& g) {
  const Checker ck{dev, "im2col"};
  ck.window(g);
  ck.at_least(x, "x", g.n * g.c * g.h * g.w);
  ck.at_least(cols, "cols", g.c * g.kh * g.kw * g.n * g.out_h() * g.out_w());
}

void check_col2im(const Device& dev, const Tensor& cols, const Tensor& dx, const Window2d& g) {
  const Checker ck{dev, "col2im"};
  ck.window(g);
  ck.at_least(cols, "cols", g.c * g.kh * g.kw * g.n * g.out_h() * g.out_w());
  ck.at_least(dx, "dx", g.n * g.c * g.h * g.w);
}

void check_conv2d_forward(const Device& dev, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                          const Window2d& g, int64_t oc) {
  const Checker ck{dev, "conv2d_forward"};
  ck.convolution(x, w, g, oc);
  if (b.defined()) ck.at_least(b, "b", oc);
  ck.at_least(y, "y", g.n * oc * g.out_h() * g.out_w());
}

void check_conv2d_backward(const Device& dev, const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw,
                           const Tensor& db, const Tensor& dx, const Window2d& g, int64_t oc) {
  const Checker ck{dev, "conv2d_backward"};
  ck.convolution(x, w, g, oc);
  ck.at_least(dy, "dy", g.n * oc * g.out_h() * g.out_w());
  ck.at_least(dw, "dw", oc * g.c * g.kh * g.kw);
  if (db.defined()) ck.at_least(db, "db", oc);
  if (dx.defined()) ck.at_least(dx, "dx", g.n * g.c * g.h * g.w);
}

bool check_swap_axes01(const Device& dev, const Tensor& src, const Tensor& dst, int64_t a, int64_t b, int64_t r) {
  const Checker ck{dev, "swap_axes01"};
  ck.dims({a, b, r});
  const int64_t n = a * b * r;
  ck.at_least(src, "src", n);
  ck.at_least(dst, "dst", n);
  if (n == 0) return true;
  const Place s = place_of(src), d = place_of(dst);
  if (s.base != d.base || s.first >= d.first + n || d.first >= s.first + n) return true;
  if (s.first == d.first && (a == 1 || b == 1)) return false;  // the identity permutation in place
  ck.fail("src and dst must not overlap (" + std::to_string(a) + " x " + std::to_string(b) + " x " +
          std::to_string(r) + " elements, dst starts " + std::to_string(d.first - s.first) + " elements after src)");
}

// ---------------------------------------------------------------------------------------------
// pooling

void check_maxpool_forward(const Device& dev, const Tensor& x, const Tensor& y, const Tensor& argmax,
                           const Window2d& g) {
  const Checker ck{dev, "maxpool_forward"};
  ck.window(g);
  const int64_t planes = g.n * g.c, out = planes * g.out_h() * g.out_w();
  ck.at_least(x, "x", planes * g.h * g.w);
  ck.at_least(y, "y", out);
  ck.at_least(argmax, "argmax", out);
}

void check_maxpool_backward(const Device& dev, const Tensor& dy, const Tensor& argmax, const Tensor& dx,
                            const Window2d& g) {
  const Checker ck{dev, "maxpool_backward"};
  ck.window(g);
  const int64_t planes = g.n * g.c, out = planes * g.out_h() * g.out_w();
  ck.at_least(dy, "dy", out);
  ck.at_least(argmax, "argmax", out);
  ck.at_least(dx, "dx", planes * g.h * g.w);
}

void check_avgpool_forward(const Device& dev, const Tensor& x, const Tensor& y, const Window2d& g) {
  const Checker ck{dev, "avgpool_forward"};
  ck.window(g);
  const int64_t planes = g.n * g.c;
  ck.at_least(x, "x", planes * g.h * g.w);
  ck.at_least(y, "y", planes * g.out_h() * g.out_w());
}

void check_avgpool_backward(const Device& dev, const Tensor& dy, const Tensor& dx, const Window2d& g) {
  const Checker ck{dev, "avgpool_backward"};
  ck.window(g);
  const int64_t planes = g.n * g.c;
  ck.at_least(dy, "dy", planes * g.out_h() * g.out_w());
  ck.at_least(dx, "dx", planes * g.h * g.w);
}

// ---------------------------------------------------------------------------------------------
// layer norm

void check_embedding(const Device& dev, const char* op, const Tensor& ids, const Tensor& table, const Tensor& rows_t,
                     int64_t rows, int64_t vocab, int64_t width) {
  const Checker ck{dev, op};
  ck.dims({rows, vocab, width});
  ck.positive(vocab, "vocab");
  ck.at_least(ids, "ids", rows);
  ck.at_least(table, "table", vocab * width);
  ck.at_least(rows_t, "rows", rows * width);
}

void check_causal_softmax(const Device& dev, const char* op, const Tensor& a, const Tensor& b, const Tensor& c,
                          int64_t n, int64_t t) {
  const Checker ck{dev, op};
  ck.dims({n, t});
  ck.at_least(a, "probs or scores", n * t * t);
  ck.at_least(b, "probs or dprobs", n * t * t);
  if (c.defined()) ck.at_least(c, "dscores", n * t * t);
}

void check_layernorm_forward(const Device& dev, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             const Tensor& y, const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols) {
  const Checker ck{dev, "layernorm_forward"};
  ck.dims({rows, cols});
  ck.positive(cols, "cols");
  ck.at_least(x, "x", rows * cols);
  ck.at_least(y, "y", rows * cols);
  ck.at_least(gamma, "gamma", cols);
  ck.at_least(beta, "beta", cols);
  ck.at_least(mean, "mean", rows);
  ck.at_least(rstd, "rstd", rows);
}

void check_layernorm_backward(const Device& dev, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor& dgamma,
                              const Tensor& dbeta, int64_t rows, int64_t cols) {
  const Checker ck{dev, "layernorm_backward"};
  ck.dims({rows, cols});
  ck.positive(cols, "cols");
  ck.at_least(x, "x", rows * cols);
  ck.at_least(dy, "dy", rows * cols);
  ck.at_least(dx, "dx", rows * cols);
  ck.at_least(gamma, "gamma", cols);
  ck.at_least(mean, "mean", rows);
  ck.at_least(rstd, "rstd", rows);
  ck.at_least(dgamma, "dgamma", cols);
  ck.at_least(dbeta, "dbeta", cols);
}

// ---------------------------------------------------------------------------------------------
// losses

void check_softmax_xent(const Device& dev, const Tensor& logits, const Tensor& labels, const Tensor& loss,
                        const Tensor& dlogits, int64_t rows, int64_t classes) {
  const Checker ck{dev, "softmax_xent"};
  ck.dims({rows, classes});
  ck.positive(classes, "classes");
  ck.at_least(logits, "logits", rows * classes);
  ck.at_least(labels, "labels", rows);
  ck.at_least(loss, "loss", rows);
  if (dlogits.defined()) ck.at_least(dlogits, "dlogits", rows * classes);
}

void check_mse(const Device& dev, const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred,
               int64_t rows, int64_t cols) {
  const Checker ck{dev, "mse"};
  ck.dims({rows, cols});
  ck.at_least(pred, "pred", rows * cols);
  ck.at_least(target, "target", rows * cols);
  ck.at_least(loss, "loss", rows);
  if (dpred.defined()) ck.at_least(dpred, "dpred", rows * cols);
}

void check_argmax_match(const Device& dev, const Tensor& logits, const Tensor& labels, const Tensor& correct,
                        int64_t rows, int64_t classes) {
  const Checker ck{dev, "argmax_match"};
  ck.dims({rows, classes});
  ck.positive(classes, "classes");
  ck.at_least(logits, "logits", rows * classes);
  ck.at_least(labels, "labels", rows);
  ck.at_least(correct, "correct", rows);
}

// ---------------------------------------------------------------------------------------------
// optimizers

void check_sgd_step(const Device& dev, const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
                    const SgdStep& s) {
  const Checker ck{dev, "sgd_step"};
  ck.on_device(params, "params");
  const int64_t n = params.numel();
  ck.same(grads, "grads", n);
  if (s.momentum != 0.f) ck.same(momentum_buf, "momentum_buf", n);
}

void check_adam_step(const Device& dev, const Tensor& params, const Tensor& grads, const Tensor& m,
                     const Tensor& v, const AdamStep& s) {
  const Checker ck{dev, "adam_step"};
  ck.on_device(params, "params");
  const int64_t n = params.numel();
  ck.same(grads, "grads", n);
  ck.same(m, "m", n);
  ck.same(v, "v", n);
  if (s.step < 1) ck.fail("step must be >= 1, got " + std::to_string(s.step));
}

void check_sum_squares(const Device& dev, const Tensor& t) { Checker{dev, "sum_squares"}.on_device(t, "tensor"); }

}  // namespace cleave
