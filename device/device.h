// device.h: what a compute backend (CPU, OpenCL, CUDA) must provide.
//
// A Device owns memory and runs the ops that layers, losses and optimizers are
// made of. Layers never touch memory themselves: they call these ops, so the same
// layer code runs on every backend, and each backend is checked op by op against
// the CPU (tests/device/test_parity.cpp). All tensors passed to an op must live on
// that device. Ops may be asynchronous; download()/synchronize() wait.
//
// Conventions: row-major; images are NCHW; "rows x cols" matrices are (rows, cols).
// Ops that say "accumulates" add into their output; the rest overwrite it.
// Class labels travel as float tensors holding integer class indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "device/tensor.h"

namespace cleave {

enum class Backend { cpu, opencl, cuda };
const char* backend_name(Backend b);
// The backend backend_name() calls `name`, or nullopt.
std::optional<Backend> backend_named(std::string_view name);

struct MemoryInfo {
  size_t total = 0;  // bytes the device has
  size_t free = 0;   // bytes currently free
};

// gelu: the exact erf form (PyTorch nn.GELU()); gelu_tanh: the tanh approximation
// (nn.GELU(approximate='tanh'), GPT-2 and llm.c), on every backend.
enum class Activation { relu, gelu, tanh, gelu_tanh };

// Geometry of a 2-D convolution or pooling window over NCHW input.
struct Window2d {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input (batch, channels, height, width)
  int64_t kh = 1, kw = 1;              // window
  int64_t sh = 1, sw = 1;              // stride
  int64_t ph = 0, pw = 0;              // zero padding
  int64_t out_h() const { return (h + 2 * ph - kh) / sh + 1; }
  int64_t out_w() const { return (w + 2 * pw - kw) / sw + 1; }
};

// Hyper-parameters of one optimizer step, already resolved for this step.
struct SgdStep {
  float lr = 0.01f, momentum = 0.f, dampening = 0.f, weight_decay = 0.f;
  bool nesterov = false;
  bool first = false;  // first step: momentum buffer := gradient (PyTorch semantics)
};
struct AdamStep {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  bool decoupled = false;  // AdamW: decay applied to weights, not gradient
  int64_t step = 1;        // 1-based, for bias correction
};

class Device {
 public:
  virtual ~Device() = default;

  // --- identity and memory ---------------------------------------------------
  virtual Backend backend() const = 0;
  virtual std::string name() const = 0;  // e.g. "cpu (2 threads, OpenBLAS)"
  virtual MemoryInfo memory() const = 0;
  virtual bool host_accessible() const = 0;  // Buffer::handle is a host float*
  // Allocates `bytes` (throws cleave::OutOfMemory when the device or its limit is exhausted).
  virtual std::shared_ptr<Buffer> allocate(size_t bytes) = 0;
  virtual void upload(const Tensor& dst, const float* src) = 0;  // dst.numel() floats
  virtual void download(const Tensor& src, float* dst) = 0;      // waits for pending work
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;   // same numel
  virtual void fill(const Tensor& t, float value) = 0;
  virtual void synchronize() = 0;
  // Gives memory the device keeps for reuse (released blocks) back to the
  // system, e.g. when a daemon's job ends. Live tensors are untouched.
  virtual void release_cached_memory() {}
  // The most bytes this device had allocated at once since it was opened or
  // reset_peak() was last called: every allocation it made, tensors and its ops'
  // own scratch, counted as requested (what --memory-limit counts). 0 when the
  // backend does not track it (unknown, not "nothing").
  virtual size_t peak_bytes_in_use() const { return 0; }
  // The bytes this device has allocated now, counted as peak_bytes_in_use
  // counts them (0 when the backend does not track it). Safe to call from
  // any thread (a metrics scrape reads it while a job runs).
  virtual size_t bytes_in_use() const { return 0; }
  // Starts a new peak from the bytes in use now.
  virtual void reset_peak() {}

  // --- dense linear algebra ----------------------------------------------------
  // C(m,n) = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
  // lda/ldb/ldc are the row strides of A, B, C as stored.
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const Tensor& a, int64_t lda, const Tensor& b, int64_t ldb, float beta,
                    const Tensor& c, int64_t ldc) = 0;

  // --- elementwise ---------------------------------------------------------------
  virtual void axpy(float alpha, const Tensor& x, const Tensor& y) = 0;  // y += alpha * x
  virtual void scale(const Tensor& x, float alpha) = 0;                  // x *= alpha
  virtual void mul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;  // out = a * b
  virtual void activation_forward(Activation act, const Tensor& x, const Tensor& y) = 0;
  // dx = dy * f'(x); y = f(x) is given for activations whose derivative uses it.
  virtual void activation_backward(Activation act, const Tensor& x, const Tensor& y,
                                   const Tensor& dy, const Tensor& dx) = 0;

  // --- bias ------------------------------------------------------------------------
  // y (rows, features) += b (features) on every row.
  virtual void add_bias_rows(const Tensor& y, const Tensor& b, int64_t rows, int64_t features) = 0;
  // db (features) += column sums of dy (rows, features).  Accumulates.
  virtual void bias_grad_rows(const Tensor& dy, const Tensor& db, int64_t rows, int64_t features) = 0;
  // y (n, c, hw) += b (c) on every plane.
  virtual void add_bias_channels(const Tensor& y, const Tensor& b, int64_t n, int64_t c, int64_t hw) = 0;
  // db (c) += sum over n and hw of dy (n, c, hw).  Accumulates.
  virtual void bias_grad_channels(const Tensor& dy, const Tensor& db, int64_t n, int64_t c, int64_t hw) = 0;

  // --- convolution helpers -------------------------------------------------------
  // cols (c*kh*kw, n*oh*ow) from x (n, c, h, w); row index (ci*kh + i)*kw + j,
  // column index (ni*oh + y)*ow + x. Padding reads as zero.
  virtual void im2col(const Tensor& x, const Tensor& cols, const Window2d& g) = 0;
  // dx (n, c, h, w) = scatter-add of cols back to image positions (overwrites dx).
  virtual void col2im(const Tensor& cols, const Tensor& dx, const Window2d& g) = 0;
  // dst (b, a, r) = src (a, b, r) with the first two axes swapped.
  virtual void swap_axes01(const Tensor& src, const Tensor& dst, int64_t a, int64_t b, int64_t r) = 0;

  // --- convolution (NCHW, groups 1, dilation 1) ------------------------------------
  // y (n, oc, oh, ow) = w (oc, c*kh*kw) applied to every window of x (n, c, h, w),
  // plus b (oc) on every plane of channel o; b may be undefined (no bias).
  // The default lowers the whole batch onto im2col, one gemm and swap_axes01 with a
  // (c*kh*kw, n*oh*ow) temporary (device/conv2d_lowering.cpp); a backend may override
  // it with something faster that gives the same result up to rounding.
  virtual void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                              const Window2d& g, int64_t oc);
  // The gradients of conv2d_forward for dy (n, oc, oh, ow): dw (oc, c*kh*kw) and
  // db (oc) accumulate; dx (n, c, h, w) is overwritten. db and dx may be undefined
  // (no bias; no input gradient wanted).
  virtual void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw,
                               const Tensor& db, const Tensor& dx, const Window2d& g, int64_t oc);

  // --- pooling (NCHW, padding counts as -inf for max and 0 for average) -----------
  // y (n, c, oh, ow); argmax (same shape) receives the index (0..h*w-1) in the input
  // plane of each maximum (first one wins on ties), as a float.
  virtual void maxpool_forward(const Tensor& x, const Tensor& y, const Tensor& argmax, const Window2d& g) = 0;
  // dx (n, c, h, w) := 0 then dx[argmax] += dy (overwrites dx).
  virtual void maxpool_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx, const Window2d& g) = 0;
  // Average over the window, dividing by kh*kw (PyTorch's count_include_pad=True).
  virtual void avgpool_forward(const Tensor& x, const Tensor& y, const Window2d& g) = 0;
  virtual void avgpool_backward(const Tensor& dy, const Tensor& dx, const Window2d& g) = 0;  // overwrites dx

  // --- layer norm over the last dimension -------------------------------------------
  // x, y (rows, cols); gamma, beta (cols); mean, rstd (rows) saved for backward.
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& y, const Tensor& mean, const Tensor& rstd,
                                 int64_t rows, int64_t cols, float eps) = 0;
  // dx overwritten; dgamma, dbeta accumulate.
  virtual void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                                  const Tensor& dgamma, const Tensor& dbeta, int64_t rows,
                                  int64_t cols) = 0;

  // --- losses (per-row values; the caller sums / averages on the host) ----------------
  // logits (rows, classes), labels (rows) -> loss (rows) = -log softmax(logits)[label];
  // dlogits = (softmax - onehot) * grad_scale.  Labels outside [0, classes) are a
  // caller error (checked on the host before upload).
  virtual void softmax_xent(const Tensor& logits, const Tensor& labels, const Tensor& loss,
                            const Tensor& dlogits, int64_t rows, int64_t classes, float grad_scale) = 0;
  // loss (rows) = sum_j (pred - target)^2 over cols; dpred = 2 (pred - target) * grad_scale.
  virtual void mse(const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred,
                   int64_t rows, int64_t cols, float grad_scale) = 0;
  // correct (rows) = 1 where argmax(logits row) == label else 0.
  virtual void argmax_match(const Tensor& logits, const Tensor& labels, const Tensor& correct,
                            int64_t rows, int64_t classes) = 0;

  // --- optimizers (PyTorch semantics, in place over whole parameter blocks) ------------
  virtual void sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
                        const SgdStep& s) = 0;
  virtual void adam_step(const Tensor& params, const Tensor& grads, const Tensor& m,
                         const Tensor& v, const AdamStep& s) = 0;
  // Sum of squares of t (for gradient-norm reporting and clipping).
  virtual float sum_squares(const Tensor& t) = 0;

  // --- transformer ops -------------------------------------------------------------------
  // Every backend implements these (CPU, OpenCL, CUDA); a backend that does
  // not inherits the defaults (device.cpp), which throw std::runtime_error
  // "... is not implemented on this backend yet".
  // y (rows, width) row r = table (vocab, width) row ids[r]; ids (rows) hold token
  // indices as floats (an index outside [0, vocab) or not an integer throws).
  virtual void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y, int64_t rows,
                                 int64_t vocab, int64_t width);
  // dtable (vocab, width) row ids[r] += dy (rows, width) row r.  Accumulates.
  virtual void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, int64_t rows,
                                  int64_t vocab, int64_t width);
  // n matrices (t, t): probs[i][j] = exp(scale s[i][j]) / sum_{k <= i} exp(scale s[i][k]) for
  // j <= i, and 0 for j > i (causal attention weights). scores above the diagonal are not read.
  virtual void causal_softmax_forward(const Tensor& scores, const Tensor& probs, int64_t n, int64_t t, float scale);
  // dscores = scale * probs * (dprobs - sum_j probs dprobs) row by row, 0 above the
  // diagonal (overwrites dscores; may not alias dprobs).
  virtual void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores, int64_t n,
                                       int64_t t, float scale);
};

// Thrown by Device::allocate when memory (or the configured limit) runs out.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Options for opening a device.
struct DeviceOptions {
  int threads = 0;            // CPU threads; 0 = all cores
  size_t memory_limit = 0;    // bytes; 0 = no limit beyond the hardware
  int ordinal = 0;            // which GPU / OpenCL device
  std::string cache_dir;      // OpenCL program cache ("" = default under $XDG_CACHE_HOME)
};

// Backends compiled into this build, in `auto` preference order (cuda, opencl, cpu).
std::vector<Backend> compiled_backends();
// Opens a device by name: "auto", "cpu", "opencl", "cuda". "auto" prefers CUDA,
// then OpenCL on a GPU, then CPU. Throws std::runtime_error with a clear message
// when the backend is not compiled in or no usable device is present.
std::unique_ptr<Device> open_device(const std::string& name, const DeviceOptions& opts = {});
// Memory plans (core/planner/memory_model.h): upper bounds of the bytes of
// temporaries an op holds while it runs on a device of `backend`, whatever its
// thread count, beyond its arguments. conv2d: forward or backward (with dx) for
// g.n samples; the GPU backends run the portable lowering (conv2d_lowering.cpp),
// the CPU its per-thread columns. bias_grad_rows and layernorm_backward: the
// CPU's per-thread partial sums (0 elsewhere).
size_t conv2d_workspace_bytes(Backend backend, const Window2d& g, int64_t oc);
size_t bias_grad_rows_workspace_bytes(Backend backend, int64_t rows, int64_t features);
size_t layernorm_backward_workspace_bytes(Backend backend, int64_t rows, int64_t cols);

// Parses "512M", "4G", "1024" (bytes) -> bytes; throws std::invalid_argument.
size_t parse_bytes(const std::string& text);
// bytes -> "12.5" (MiB, one decimal), for the backends' OutOfMemory messages.
std::string mib_text(size_t bytes);

}  // namespace cleave
