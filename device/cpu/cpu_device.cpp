// cpu_device.cpp: CpuDevice ops except convolution (cpu_conv.cpp). GEMM goes to
// OpenBLAS; every other op is a plain contiguous loop (GELU-tanh and the
// softmaxes through fast_math.h's branch-free exp, so that they vectorise),
// split into one contiguous chunk per OpenMP thread when the work is large
// enough to pay for the team (run_chunks, cpu_loops.h).
#include "device/cpu/cpu_device.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "device/backends.h"
#include "device/cpu/cpu_loops.h"
#include "device/cpu/fast_math.h"
#include "device/op_checks.h"

namespace cleave {

using namespace cpu_detail;

namespace {

// An op's host scratch (per-thread partial sums), taken from the device's pool
// so that it counts like a tensor: in the bytes in use, their peak and the
// memory limit. n values of T, zero-initialised.
template <typename T>
class Scratch {
 public:
  Scratch(HostPool& pool, size_t n)
      : pool_(pool), n_(n), bytes_(n * sizeof(T)), data_(static_cast<T*>(pool.allocate(bytes_))) {
    std::fill_n(data_, n_, T{});
  }
  ~Scratch() { pool_.release(data_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* data() const { return data_; }
  T& operator[](size_t i) const { return data_[i]; }
  T* begin() const { return data_; }
  T* end() const { return data_ + n_; }

 private:
  HostPool& pool_;
  size_t n_, bytes_;
  T* data_;
};

inline float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
inline float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * std::exp(-0.5f * x * x);
  return cdf + x * pdf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// identity and memory

CpuDevice::CpuDevice(const DeviceOptions& opts)
    : limit_(opts.memory_limit), pool_(std::make_shared<HostPool>(opts.memory_limit)) {
  if (opts.threads < 0)
    throw std::invalid_argument("cpu: thread count must be >= 0 (0 = all cores), got " +
                                std::to_string(opts.threads));
  threads_ = opts.threads > 0 ? opts.threads : std::max(1, omp_get_num_procs());
  openblas_set_num_threads(threads_);
}

std::string CpuDevice::name() const {
  return "cpu (" + std::to_string(threads_) + (threads_ == 1 ? " thread" : " threads") + ", OpenBLAS)";
}

namespace {

// What the kernel says can be allocated without swapping (MemAvailable: free
// pages plus the page cache and other memory it can reclaim), or, where
// /proc/meminfo does not say, the free pages alone.
size_t available_host_bytes(long page) {
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[128];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    std::fclose(f);
    if (found) return static_cast<size_t>(kib) * 1024;
  }
  const long avail = sysconf(_SC_AVPHYS_PAGES);
  return page > 0 && avail > 0 ? static_cast<size_t>(page) * static_cast<size_t>(avail) : 0;
}

}  // namespace

MemoryInfo CpuDevice::memory() const {
  const long page = sysconf(_SC_PAGESIZE);
  const long pages = sysconf(_SC_PHYS_PAGES);
  const size_t phys = page > 0 && pages > 0 ? static_cast<size_t>(page) * static_cast<size_t>(pages) : 0;
  const size_t avail = available_host_bytes(page);
  const size_t phys_free = phys > 0 ? std::min(avail, phys) : avail;
  MemoryInfo info;
  const size_t used = pool_->in_use();
  if (limit_ > 0) {
    info.total = limit_;
    info.free = std::min(limit_ > used ? limit_ - used : 0, phys_free > 0 ? phys_free : limit_);
  } else {
    info.total = phys;
    info.free = phys_free;
  }
  return info;
}

std::shared_ptr<Buffer> CpuDevice::allocate(size_t bytes) {
  auto buf = std::make_shared<Buffer>();
  buf->device = this;
  buf->handle = pool_->allocate(bytes);
  buf->bytes = bytes;
  buf->release = [pool = pool_](Buffer& b) {
    pool->release(b.handle, b.bytes);
    b.handle = nullptr;
  };
  return buf;
}

int CpuDevice::team_size(int64_t n, int64_t cost) const {
  if (threads_ <= 1) return 1;
  return static_cast<int>(std::min<int64_t>(threads_, team_bound(n, cost)));
}

size_t CpuDevice::bias_grad_rows_workspace_bytes(int64_t rows, int64_t features) {
  return static_cast<size_t>(team_bound(rows, features) * features) * sizeof(float);  // bias_grad_rows' partials
}

size_t CpuDevice::layernorm_backward_workspace_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(team_bound(rows, cols * 6) * 2 * cols) * sizeof(float);  // layernorm_backward's partials
}

void CpuDevice::upload(const Tensor& dst, const float* src) {
  check_upload(*this, dst, src);
  if (dst.numel() > 0) std::memcpy(ptr(dst), src, dst.bytes());
}

void CpuDevice::download(const Tensor& src, float* dst) {
  check_download(*this, src, dst);
  if (src.numel() > 0) std::memcpy(dst, ptr(src), src.bytes());
}

void CpuDevice::copy(const Tensor& src, const Tensor& dst) {
  check_copy(*this, src, dst);
  if (src.numel() > 0) std::memmove(ptr(dst), ptr(src), src.bytes());
}

void CpuDevice::fill(const Tensor& t, float value) {
  check_fill(*this, t);
  float* p = ptr(t);
  run_chunks(team_size(t.numel(), 1), t.numel(), [&](int, int64_t b, int64_t e) { std::fill(p + b, p + e, value); });
}

// ---------------------------------------------------------------------------------------------
// GEMM

void CpuDevice::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Tensor& a,
                     int64_t lda, const Tensor& b, int64_t ldb, float beta, const Tensor& c, int64_t ldc) {
  check_gemm(*this, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    float* pc = ptr(c);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) pc[i * ldc + j] = beta == 0.f ? 0.f : beta * pc[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, ptr(a), static_cast<int>(lda),
              ptr(b), static_cast<int>(ldb), beta, ptr(c), static_cast<int>(ldc));
}

// ---------------------------------------------------------------------------------------------
// elementwise (outputs may alias inputs element for element, so no __restrict here)

void CpuDevice::axpy(float alpha, const Tensor& x, const Tensor& y) {
  check_axpy(*this, x, y);
  const float* px = ptr(x);
  float* py = ptr(y);
  run_chunks(team_size(x.numel(), 1), x.numel(), [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) py[i] += alpha * px[i];
  });
}

void CpuDevice::scale(const Tensor& x, float alpha) {
  check_scale(*this, x);
  float* px = ptr(x);
  run_chunks(team_size(x.numel(), 1), x.numel(), [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) px[i] *= alpha;
  });
}

void CpuDevice::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_mul(*this, a, b, out);
  const float* pa = ptr(a);
  const float* pb = ptr(b);
  float* po = ptr(out);
  run_chunks(team_size(a.numel(), 1), a.numel(), [&](int, int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) po[i] = pa[i] * pb[i];
  });
}

void CpuDevice::activation_forward(Activation act, const Tensor& x, const Tensor& y) {
  check_activation_forward(*this, act, x, y);
  const float* px = ptr(x);
  float* py = ptr(y);
  const int64_t n = x.numel();
  switch (act) {
    case Activation::relu:
      run_chunks(team_size(n, 1), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) py[i] = px[i] > 0.f ? px[i] : 0.f;
      });
      return;
    case Activation::gelu:
      run_chunks(team_size(n, 16), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) py[i] = gelu(px[i]);
      });
      return;
    case Activation::tanh:
      run_chunks(team_size(n, 16), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) py[i] = std::tanh(px[i]);
      });
      return;
    case Activation::gelu_tanh:
      run_chunks(team_size(n, 16), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) py[i] = gelu_tanh(px[i]);
      });
      return;
  }
  throw op_error(*this, "activation_forward", "unknown activation");
}

void CpuDevice::activation_backward(Activation act, const Tensor& x, const Tensor& y, const Tensor& dy,
                                    const Tensor& dx) {
  check_activation_backward(*this, act, x, y, dy, dx);
  const int64_t n = dy.numel();
  const float* pdy = ptr(dy);
  float* pdx = ptr(dx);
  switch (act) {
    case Activation::relu: {
      // relu'(x) = 1 where x > 0 (equivalently y > 0); use whichever the caller kept.
      const Tensor& ref = x.defined() ? x : y;
      const float* pr = ptr(ref);
      run_chunks(team_size(n, 1), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const float gi = pdy[i];  // unconditional load: the select compiles to a blend, not a branch
          pdx[i] = pr[i] > 0.f ? gi : 0.f;
        }
      });
      return;
    }
    case Activation::gelu: {
      const float* px = ptr(x);
      run_chunks(team_size(n, 24), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) pdx[i] = pdy[i] * gelu_grad(px[i]);
      });
      return;
    }
    case Activation::tanh: {
      const float* py = ptr(y);
      run_chunks(team_size(n, 1), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) pdx[i] = pdy[i] * (1.f - py[i] * py[i]);
      });
      return;
    }
    case Activation::gelu_tanh: {
      const float* px = ptr(x);
      run_chunks(team_size(n, 24), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) pdx[i] = pdy[i] * gelu_tanh_grad(px[i]);
      });
      return;
    }
  }
  throw op_error(*this, "activation_backward", "unknown activation");
}

// ---------------------------------------------------------------------------------------------
// bias

void CpuDevice::add_bias_rows(const Tensor& y, const Tensor& b, int64_t rows, int64_t features) {
  check_add_bias_rows(*this, y, b, rows, features);
  float* py = ptr(y);
  const float* __restrict pb = ptr(b);
  run_chunks(team_size(rows, features), rows, [&](int, int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      float* __restrict row = py + r * features;
      for (int64_t f = 0; f < features; ++f) row[f] += pb[f];
    }
  });
}

void CpuDevice::bias_grad_rows(const Tensor& dy, const Tensor& db, int64_t rows, int64_t features) {
  check_bias_grad_rows(*this, dy, db, rows, features);
  const float* pdy = ptr(dy);
  float* pdb = ptr(db);
  const int team = team_size(rows, features);
  const Scratch<float> partial(*pool_, static_cast<size_t>(team * features));
  run_chunks(team, rows, [&](int t, int64_t s, int64_t e) {
    float* __restrict acc = partial.data() + t * features;
    for (int64_t r = s; r < e; ++r) {
      const float* __restrict row = pdy + r * features;
      for (int64_t f = 0; f < features; ++f) acc[f] += row[f];
    }
  });
  for (int t = 0; t < team; ++t)
    for (int64_t f = 0; f < features; ++f) pdb[f] += partial[t * features + f];
}

void CpuDevice::add_bias_channels(const Tensor& y, const Tensor& b, int64_t n, int64_t c, int64_t hw) {
  check_add_bias_channels(*this, y, b, n, c, hw);
  float* py = ptr(y);
  const float* pb = ptr(b);
  run_chunks(team_size(n * c, hw), n * c, [&](int, int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      float* __restrict plane = py + p * hw;
      const float v = pb[p % c];
      for (int64_t i = 0; i < hw; ++i) plane[i] += v;
    }
  });
}

void CpuDevice::bias_grad_channels(const Tensor& dy, const Tensor& db, int64_t n, int64_t c, int64_t hw) {
  check_bias_grad_channels(*this, dy, db, n, c, hw);
  const float* pdy = ptr(dy);
  float* pdb = ptr(db);
  run_chunks(team_size(c, n * hw), c, [&](int, int64_t s, int64_t e) {
    for (int64_t ci = s; ci < e; ++ci) {
      double total = 0;
      for (int64_t ni = 0; ni < n; ++ni) {
        const float* __restrict plane = pdy + (ni * c + ci) * hw;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < hw; ++i) acc += plane[i];
        total += acc;
      }
      pdb[ci] += static_cast<float>(total);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// convolution helpers

void CpuDevice::swap_axes01(const Tensor& src, const Tensor& dst, int64_t a, int64_t b, int64_t r) {
  if (!check_swap_axes01(*this, src, dst, a, b, r)) return;
  const float* __restrict ps = ptr(src);
  float* __restrict pd = ptr(dst);
  if (r >= 8) {
    // Contiguous runs of r floats: one memcpy per (b, a) pair, dst written in order.
    run_chunks(team_size(a * b, r), a * b, [&](int, int64_t s, int64_t e) {
      for (int64_t idx = s; idx < e; ++idx) {
        const int64_t bi = idx / a, ai = idx % a;
        std::memcpy(pd + idx * r, ps + (ai * b + bi) * r, static_cast<size_t>(r) * sizeof(float));
      }
    });
    return;
  }
  // Short runs: a blocked transpose of (a, b) matrices whose elements are r floats.
  constexpr int64_t kTile = 32;
  const int64_t tiles_b = (b + kTile - 1) / kTile;
  run_chunks(team_size(tiles_b, kTile * a * r), tiles_b, [&](int, int64_t s, int64_t e) {
    for (int64_t tb = s; tb < e; ++tb) {
      const int64_t b0 = tb * kTile, b1 = std::min(b, b0 + kTile);
      for (int64_t a0 = 0; a0 < a; a0 += kTile) {
        const int64_t a1 = std::min(a, a0 + kTile);
        for (int64_t bi = b0; bi < b1; ++bi)
          for (int64_t ai = a0; ai < a1; ++ai)
            for (int64_t k = 0; k < r; ++k) pd[(bi * a + ai) * r + k] = ps[(ai * b + bi) * r + k];
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// pooling

void CpuDevice::maxpool_forward(const Tensor& x, const Tensor& y, const Tensor& argmax, const Window2d& g) {
  check_maxpool_forward(*this, x, y, argmax, g);
  const int64_t oh = g.out_h(), ow = g.out_w();
  const int64_t planes = g.n * g.c;
  const float* __restrict px = ptr(x);
  float* __restrict py = ptr(y);
  float* __restrict pa = ptr(argmax);
  const int64_t h = g.h, w = g.w, kh = g.kh, kw = g.kw, sh = g.sh, sw = g.sw, ph = g.ph, pw = g.pw;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto better = [](float v, float best) { return v > best || (std::isnan(v) && !std::isnan(best)); };
  if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0) {
    // The common 2x2 / stride 2 pooling: every window lies inside the plane. The
    // comparisons are selects, not branches, so the loop over xo vectorises.
    run_chunks(team_size(planes, oh * ow * 4), planes, [&](int, int64_t s, int64_t e) {
      for (int64_t p = s; p < e; ++p) {
        const float* __restrict in = px + p * h * w;
        float* __restrict out = py + p * oh * ow;
        float* __restrict arg = pa + p * oh * ow;
        for (int64_t yo = 0; yo < oh; ++yo) {
          const float* __restrict r0 = in + 2 * yo * w;
          const float* __restrict r1 = r0 + w;
          const float row = static_cast<float>(2 * yo * w);
          const float fw = static_cast<float>(w);
#pragma omp simd
          for (int64_t xo = 0; xo < ow; ++xo) {
            float best = r0[2 * xo], at = 0.f;
            const float b = r0[2 * xo + 1], c = r1[2 * xo], d = r1[2 * xo + 1];
            // better(v, best): v > best, or v is NaN and best is not (first NaN wins)
            bool t = b > best || (b != b && best == best);
            best = t ? b : best;
            at = t ? 1.f : at;
            t = c > best || (c != c && best == best);
            best = t ? c : best;
            at = t ? fw : at;
            t = d > best || (d != d && best == best);
            best = t ? d : best;
            at = t ? fw + 1.f : at;
            out[yo * ow + xo] = best;
            arg[yo * ow + xo] = row + static_cast<float>(2 * xo) + at;
          }
        }
      }
    });
    return;
  }
  run_chunks(team_size(planes, oh * ow * kh * kw), planes, [&](int, int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      const float* __restrict in = px + p * h * w;
      float* __restrict out = py + p * oh * ow;
      float* __restrict arg = pa + p * oh * ow;
      for (int64_t yo = 0; yo < oh; ++yo) {
        const int64_t hs0 = yo * sh - ph;
        const int64_t hs = std::max<int64_t>(hs0, 0), he = std::min(hs0 + kh, h);
        for (int64_t xo = 0; xo < ow; ++xo) {
          const int64_t ws0 = xo * sw - pw;
          const int64_t ws = std::max<int64_t>(ws0, 0), we = std::min(ws0 + kw, w);
          float best = neg_inf;
          int64_t best_i = (hs < he && ws < we) ? hs * w + ws : -1;
          for (int64_t iy = hs; iy < he; ++iy) {
            for (int64_t ix = ws; ix < we; ++ix) {
              const float v = in[iy * w + ix];
              if (better(v, best)) {
                best = v;
                best_i = iy * w + ix;
              }
            }
          }
          out[yo * ow + xo] = best;
          arg[yo * ow + xo] = static_cast<float>(best_i);
        }
      }
    }
  });
}

void CpuDevice::maxpool_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx, const Window2d& g) {
  check_maxpool_backward(*this, dy, argmax, dx, g);
  const int64_t oh = g.out_h(), ow = g.out_w();
  const int64_t planes = g.n * g.c, hw = g.h * g.w, ohw = oh * ow;
  const float* __restrict pdy = ptr(dy);
  const float* __restrict pa = ptr(argmax);
  float* __restrict pdx = ptr(dx);
  run_chunks(team_size(planes, hw + ohw), planes, [&](int, int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      float* __restrict out = pdx + p * hw;
      std::memset(out, 0, static_cast<size_t>(hw) * sizeof(float));
      const float* __restrict d = pdy + p * ohw;
      const float* __restrict a = pa + p * ohw;
      for (int64_t i = 0; i < ohw; ++i) {
        const int64_t idx = static_cast<int64_t>(a[i]);
        if (idx >= 0 && idx < hw) out[idx] += d[i];
      }
    }
  });
}

void CpuDevice::avgpool_forward(const Tensor& x, const Tensor& y, const Window2d& g) {
  check_avgpool_forward(*this, x, y, g);
  const int64_t oh = g.out_h(), ow = g.out_w();
  const int64_t planes = g.n * g.c;
  const float* __restrict px = ptr(x);
  float* __restrict py = ptr(y);
  const int64_t h = g.h, w = g.w, kh = g.kh, kw = g.kw, sh = g.sh, sw = g.sw, ph = g.ph, pw = g.pw;
  const float inv = 1.f / static_cast<float>(kh * kw);
  run_chunks(team_size(planes, oh * ow * kh * kw), planes, [&](int, int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      const float* __restrict in = px + p * h * w;
      float* __restrict out = py + p * oh * ow;
      for (int64_t yo = 0; yo < oh; ++yo) {
        const int64_t hs = std::max<int64_t>(yo * sh - ph, 0), he = std::min(yo * sh - ph + kh, h);
        for (int64_t xo = 0; xo < ow; ++xo) {
          const int64_t ws = std::max<int64_t>(xo * sw - pw, 0), we = std::min(xo * sw - pw + kw, w);
          float acc = 0.f;
          for (int64_t iy = hs; iy < he; ++iy)
            for (int64_t ix = ws; ix < we; ++ix) acc += in[iy * w + ix];
          out[yo * ow + xo] = acc * inv;
        }
      }
    }
  });
}

void CpuDevice::avgpool_backward(const Tensor& dy, const Tensor& dx, const Window2d& g) {
  check_avgpool_backward(*this, dy, dx, g);
  const int64_t oh = g.out_h(), ow = g.out_w();
  const int64_t planes = g.n * g.c;
  const float* __restrict pdy = ptr(dy);
  float* __restrict pdx = ptr(dx);
  const int64_t h = g.h, w = g.w, kh = g.kh, kw = g.kw, sh = g.sh, sw = g.sw, ph = g.ph, pw = g.pw;
  const float inv = 1.f / static_cast<float>(kh * kw);
  run_chunks(team_size(planes, oh * ow * kh * kw), planes, [&](int, int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      float* __restrict out = pdx + p * h * w;
      const float* __restrict d = pdy + p * oh * ow;
      std::memset(out, 0, static_cast<size_t>(h * w) * sizeof(float));
      for (int64_t yo = 0; yo < oh; ++yo) {
        const int64_t hs = std::max<int64_t>(yo * sh - ph, 0), he = std::min(yo * sh - ph + kh, h);
        for (int64_t xo = 0; xo < ow; ++xo) {
          const int64_t ws = std::max<int64_t>(xo * sw - pw, 0), we = std::min(xo * sw - pw + kw, w);
          const float v = d[yo * ow + xo] * inv;
          for (int64_t iy = hs; iy < he; ++iy)
            for (int64_t ix = ws; ix < we; ++ix) out[iy * w + ix] += v;
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// layer norm

void CpuDevice::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                  const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols, float eps) {
  check_layernorm_forward(*this, x, gamma, beta, y, mean, rstd, rows, cols);
  const float* px = ptr(x);
  float* py = ptr(y);
  const float* __restrict pg = ptr(gamma);
  const float* __restrict pb = ptr(beta);
  float* __restrict pm = ptr(mean);
  float* __restrict pr = ptr(rstd);
  run_chunks(team_size(rows, cols * 4), rows, [&](int, int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      const float* in = px + r * cols;
      float* out = py + r * cols;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j) sum += in[j];
      const float mu = sum / static_cast<float>(cols);
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t j = 0; j < cols; ++j) sq += (in[j] - mu) * (in[j] - mu);
      const float rs = 1.f / std::sqrt(sq / static_cast<float>(cols) + eps);
      for (int64_t j = 0; j < cols; ++j) out[j] = (in[j] - mu) * rs * pg[j] + pb[j];
      pm[r] = mu;
      pr[r] = rs;
    }
  });
}

void CpuDevice::layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& dy, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                                   int64_t rows, int64_t cols) {
  check_layernorm_backward(*this, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols);
  const float* px = ptr(x);
  const float* pdy = ptr(dy);
  float* pdx = ptr(dx);
  const float* __restrict pg = ptr(gamma);
  const float* __restrict pm = ptr(mean);
  const float* __restrict pr = ptr(rstd);
  const int team = team_size(rows, cols * 6);
  const Scratch<float> partial(*pool_, static_cast<size_t>(team) * 2 * static_cast<size_t>(cols));
  run_chunks(team, rows, [&](int t, int64_t s, int64_t e) {
    float* __restrict dg = partial.data() + static_cast<int64_t>(t) * 2 * cols;
    float* __restrict dbt = dg + cols;
    for (int64_t r = s; r < e; ++r) {
      const float* in = px + r * cols;
      const float* d = pdy + r * cols;
      float* out = pdx + r * cols;
      const float mu = pm[r], rs = pr[r];
      float sum_dxhat = 0.f, sum_dxhat_xhat = 0.f;
      for (int64_t j = 0; j < cols; ++j) {
        const float xhat = (in[j] - mu) * rs;
        const float dxhat = d[j] * pg[j];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        dg[j] += d[j] * xhat;
        dbt[j] += d[j];
      }
      const float m1 = sum_dxhat / static_cast<float>(cols), m2 = sum_dxhat_xhat / static_cast<float>(cols);
      for (int64_t j = 0; j < cols; ++j) {
        const float xhat = (in[j] - mu) * rs;
        out[j] = rs * (d[j] * pg[j] - m1 - xhat * m2);
      }
    }
  });
  float* pdg = ptr(dgamma);
  float* pdb = ptr(dbeta);
  for (int t = 0; t < team; ++t) {
    const float* dg = partial.data() + static_cast<int64_t>(t) * 2 * cols;
    for (int64_t j = 0; j < cols; ++j) {
      pdg[j] += dg[j];
      pdb[j] += dg[cols + j];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// losses

namespace {

// Class index of a float label, or throws naming the row.
int64_t label_index(const char* op, float label, int64_t row, int64_t classes) {
  if (!(label >= 0.f) || !(label < static_cast<float>(classes)) || label != std::floor(label))
    throw std::invalid_argument(std::string("cpu ") + op + ": label " + std::to_string(label) + " in row " +
                                std::to_string(row) + " is not a class index in [0, " + std::to_string(classes) +
                                ")");
  return static_cast<int64_t>(label);
}

}  // namespace

void CpuDevice::softmax_xent(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                             int64_t rows, int64_t classes, float grad_scale) {
  check_softmax_xent(*this, logits, labels, loss, dlogits, rows, classes);
  const float* pl = ptr(logits);
  const float* plab = ptr(labels);
  for (int64_t r = 0; r < rows; ++r) label_index("softmax_xent", plab[r], r, classes);
  float* ploss = ptr(loss);
  float* pd = ptr(dlogits);
  run_chunks(team_size(rows, classes * 8), rows, [&](int, int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      const float* z = pl + r * classes;
      const int64_t label = static_cast<int64_t>(plab[r]);
      const float zl = z[label];  // read first: dlogits may be the logits themselves
      float mx = z[0];
      for (int64_t j = 1; j < classes; ++j) mx = std::max(mx, z[j]);
      // exp(z - max) once, into the gradient row (or a row of the thread's stack
      // scratch when there is none); summed in double blocks for the loss.
      float* ez = pd != nullptr ? pd + r * classes : nullptr;
      double sum = 0;
      float block[256];
      for (int64_t j0 = 0; j0 < classes; j0 += 256) {
        const int64_t len = std::min<int64_t>(256, classes - j0);
        float* out = ez != nullptr ? ez + j0 : block;
        float part = 0.f;
#pragma omp simd reduction(+ : part)
        for (int64_t j = 0; j < len; ++j) part += (out[j] = exp_neg(z[j0 + j] - mx));
        sum += part;
      }
      const double lse = static_cast<double>(mx) + std::log(sum);
      ploss[r] = static_cast<float>(lse - static_cast<double>(zl));
      if (ez != nullptr) {
        const float scale = static_cast<float>(1.0 / sum) * grad_scale;
        for (int64_t j = 0; j < classes; ++j) ez[j] *= scale;
        ez[label] -= grad_scale;
      }
    }
  });
}

void CpuDevice::embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& y, int64_t rows,
                                  int64_t vocab, int64_t width) {
  check_embedding(*this, "embedding_forward", ids, table, y, rows, vocab, width);
  const float* pid = ptr(ids);
  for (int64_t r = 0; r < rows; ++r) label_index("embedding_forward", pid[r], r, vocab);
  const float* pt = ptr(table);
  float* py = ptr(y);
  run_chunks(team_size(rows, width), rows, [&](int, int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r)
      std::memcpy(py + r * width, pt + static_cast<int64_t>(pid[r]) * width, static_cast<size_t>(width) * 4);
  });
}

void CpuDevice::embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, int64_t rows,
                                   int64_t vocab, int64_t width) {
  check_embedding(*this, "embedding_backward", ids, dtable, dy, rows, vocab, width);
  const float* pid = ptr(ids);
  for (int64_t r = 0; r < rows; ++r) label_index("embedding_backward", pid[r], r, vocab);
  const float* pdy = ptr(dy);
  float* pdt = ptr(dtable);
  // Split by column so that no two threads add into the same table element.
  run_chunks(team_size(width, rows), width, [&](int, int64_t s, int64_t e) {
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = pdt + static_cast<int64_t>(pid[r]) * width;
      const float* src = pdy + r * width;
      for (int64_t j = s; j < e; ++j) dst[j] += src[j];
    }
  });
}

void CpuDevice::causal_softmax_forward(const Tensor& scores, const Tensor& probs, int64_t n, int64_t t, float scale) {
  check_causal_softmax(*this, "causal_softmax_forward", scores, probs, Tensor(), n, t);
  const float* ps = ptr(scores);
  float* pp = ptr(probs);
  run_chunks(team_size(n * t, t * 4), n * t, [&](int, int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      const int64_t i = r % t;  // query position: keys 0..i are visible
      const float* z = ps + r * t;
      float* p = pp + r * t;
      float mx = scale * z[0];
      for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, scale * z[j]);
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j <= i; ++j) sum += (p[j] = exp_neg(scale * z[j] - mx));
      const float inv = 1.f / sum;
      for (int64_t j = 0; j <= i; ++j) p[j] *= inv;
      for (int64_t j = i + 1; j < t; ++j) p[j] = 0.f;
    }
  });
}

void CpuDevice::causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores, int64_t n,
                                        int64_t t, float scale) {
  check_causal_softmax(*this, "causal_softmax_backward", probs, dprobs, dscores, n, t);
  const float* pp = ptr(probs);
  const float* pdp = ptr(dprobs);
  float* pds = ptr(dscores);
  run_chunks(team_size(n * t, t * 4), n * t, [&](int, int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      const int64_t i = r % t;
      const float* p = pp + r * t;
      const float* dp = pdp + r * t;
      float* ds = pds + r * t;
      float dot = 0.f;
      for (int64_t j = 0; j <= i; ++j) dot += p[j] * dp[j];
      for (int64_t j = 0; j <= i; ++j) ds[j] = scale * p[j] * (dp[j] - dot);
      for (int64_t j = i + 1; j < t; ++j) ds[j] = 0.f;
    }
  });
}

void CpuDevice::mse(const Tensor& pred, const Tensor& target, const Tensor& loss, const Tensor& dpred,
                    int64_t rows, int64_t cols, float grad_scale) {
  check_mse(*this, pred, target, loss, dpred, rows, cols);
  const float* pp = ptr(pred);
  const float* pt = ptr(target);
  float* pl = ptr(loss);
  float* pd = ptr(dpred);
  run_chunks(team_size(rows, cols * 3), rows, [&](int, int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      const float* p = pp + r * cols;
      const float* t = pt + r * cols;
      float acc = 0.f;
      for (int64_t j = 0; j < cols; ++j) {
        const float diff = p[j] - t[j];
        acc += diff * diff;
      }
      if (pd != nullptr) {
        float* d = pd + r * cols;
        for (int64_t j = 0; j < cols; ++j) d[j] = 2.f * (p[j] - t[j]) * grad_scale;
      }
      pl[r] = acc;
    }
  });
}

void CpuDevice::argmax_match(const Tensor& logits, const Tensor& labels, const Tensor& correct, int64_t rows,
                             int64_t classes) {
  check_argmax_match(*this, logits, labels, correct, rows, classes);
  const float* pl = ptr(logits);
  const float* plab = ptr(labels);
  float* pc = ptr(correct);
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = pl + r * classes;
    int64_t best = 0;
    for (int64_t j = 1; j < classes; ++j)
      if (z[j] > z[best]) best = j;
    pc[r] = static_cast<float>(best) == plab[r] ? 1.f : 0.f;
  }
}

// ---------------------------------------------------------------------------------------------
// optimizers

void CpuDevice::sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf, const SgdStep& s) {
  check_sgd_step(*this, params, grads, momentum_buf, s);
  const int64_t n = params.numel();
  const bool use_momentum = s.momentum != 0.f;
  float* __restrict p = ptr(params);
  const float* __restrict g = ptr(grads);
  float* __restrict buf = use_momentum ? ptr(momentum_buf) : nullptr;
  const float lr = s.lr, wd = s.weight_decay, mom = s.momentum, damp = 1.f - s.dampening;
  const bool first = s.first, nesterov = s.nesterov;
  run_chunks(team_size(n, 4), n, [&](int, int64_t b, int64_t e) {
    if (!use_momentum) {
      for (int64_t i = b; i < e; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    } else if (first) {
      for (int64_t i = b; i < e; ++i) {
        const float d = g[i] + wd * p[i];
        buf[i] = d;
        p[i] -= lr * (nesterov ? d + mom * d : d);
      }
    } else {
      for (int64_t i = b; i < e; ++i) {
        const float d = g[i] + wd * p[i];
        const float m = mom * buf[i] + damp * d;
        buf[i] = m;
        p[i] -= lr * (nesterov ? d + mom * m : m);
      }
    }
  });
}

void CpuDevice::adam_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                          const AdamStep& s) {
  check_adam_step(*this, params, grads, m, v, s);
  const int64_t n = params.numel();
  float* __restrict p = ptr(params);
  const float* __restrict g = ptr(grads);
  float* __restrict pm = ptr(m);
  float* __restrict pv = ptr(v);
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  const float step_size = static_cast<float>(static_cast<double>(s.lr) / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float b1 = s.beta1, b2 = s.beta2, eps = s.eps;
  const float decay = s.decoupled ? 1.f - s.lr * s.weight_decay : 1.f;
  const float l2 = s.decoupled ? 0.f : s.weight_decay;
  run_chunks(team_size(n, 8), n, [&, p, g, pm, pv, step_size, inv_sqrt_bc2, b1, b2, eps, decay, l2](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float pi = p[i] * decay;
      const float gi = g[i] + l2 * pi;
      const float mi = b1 * pm[i] + (1.f - b1) * gi;
      const float vi = b2 * pv[i] + (1.f - b2) * gi * gi;
      pm[i] = mi;
      pv[i] = vi;
      p[i] = pi - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    }
  });
}

float CpuDevice::sum_squares(const Tensor& t) {
  check_sum_squares(*this, t);
  const float* p = ptr(t);
  const int64_t n = t.numel();
  const int team = team_size(n, 1);
  const Scratch<double> partial(*pool_, static_cast<size_t>(team));
  run_chunks(team, n, [&](int tid, int64_t b, int64_t e) {
    double total = 0;
    constexpr int64_t kBlock = 4096;
    for (int64_t s = b; s < e; s += kBlock) {
      const int64_t stop = std::min(e, s + kBlock);
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = s; i < stop; ++i) acc += p[i] * p[i];
      total += acc;
    }
    partial[static_cast<size_t>(tid)] = total;
  });
  double total = 0;
  for (double x : partial) total += x;
  return static_cast<float>(total);
}

std::unique_ptr<Device> make_cpu_device(const DeviceOptions& opts) { return std::make_unique<CpuDevice>(opts); }

}  // namespace cleave
