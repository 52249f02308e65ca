// pool.cl: max and average pooling over NCHW planes, forward and backward.
//
// Forward: one work-item per output element. Max pooling treats padding as
// -inf and records the index (0..h*w-1) of the first maximum in the input plane
// as a float (NaN propagates). Average pooling divides by kh*kw (padding counts
// as zero).
// Backward gathers: one work-item per input element sums the outputs whose
// window covers it, so no atomics are needed and dx is overwritten.

__kernel void maxpool_forward(long n, long c, long h, long w, long kh, long kw, long sh, long sw,
                              long ph, long pw, long oh, long ow, __global const float* x,
                              long x_off, __global float* y, long y_off, __global float* argmax,
                              long am_off) {
  const long idx = get_global_id(0);
  if (idx >= n * c * oh * ow) return;
  const long ox = idx % ow, oy = (idx / ow) % oh, plane = idx / (ow * oh);
  const long base = x_off + plane * h * w;
  // Window clipped to the plane; NaN wins over numbers (it propagates, as in PyTorch).
  const long hs = max(oy * sh - ph, 0L), he = min(oy * sh - ph + kh, h);
  const long ws = max(ox * sw - pw, 0L), we = min(ox * sw - pw + kw, w);
  float best = -INFINITY;
  long best_i = (hs < he && ws < we) ? hs * w + ws : -1;
  for (long iy = hs; iy < he; ++iy) {
    for (long ix = ws; ix < we; ++ix) {
      const float v = x[base + iy * w + ix];
      if (v > best || (isnan(v) && !isnan(best))) {
        best = v;
        best_i = iy * w + ix;
      }
    }
  }
  y[y_off + idx] = best;
  argmax[am_off + idx] = (float)best_i;
}

// dx (n, c, h, w) = sum of dy over the outputs whose argmax is this element.
__kernel void maxpool_backward(long n, long c, long h, long w, long kh, long kw, long sh, long sw,
                               long ph, long pw, long oh, long ow, __global const float* dy,
                               long dy_off, __global const float* argmax, long am_off,
                               __global float* dx, long dx_off) {
  const long idx = get_global_id(0);
  if (idx >= n * c * h * w) return;
  const long ix = idx % w, iy = (idx / w) % h, plane = idx / (w * h);
  const float me = (float)(iy * w + ix);
  // Outputs oy whose window rows cover iy: oy*sh - ph <= iy <= oy*sh - ph + kh - 1.
  long oy0 = iy + ph - kh + 1;
  oy0 = oy0 <= 0 ? 0 : (oy0 + sh - 1) / sh;
  long ox0 = ix + pw - kw + 1;
  ox0 = ox0 <= 0 ? 0 : (ox0 + sw - 1) / sw;
  const long oy1 = min((iy + ph) / sh, oh - 1);
  const long ox1 = min((ix + pw) / sw, ow - 1);
  float s = 0.0f;
  for (long oy = oy0; oy <= oy1; ++oy) {
    for (long ox = ox0; ox <= ox1; ++ox) {
      const long o = (plane * oh + oy) * ow + ox;
      if (argmax[am_off + o] == me) s += dy[dy_off + o];
    }
  }
  dx[dx_off + idx] = s;
}

__kernel void avgpool_forward(long n, long c, long h, long w, long kh, long kw, long sh, long sw,
                              long ph, long pw, long oh, long ow, __global const float* x,
                              long x_off, __global float* y, long y_off) {
  const long idx = get_global_id(0);
  if (idx >= n * c * oh * ow) return;
  const long ox = idx % ow, oy = (idx / ow) % oh, plane = idx / (ow * oh);
  const long base = x_off + plane * h * w;
  float s = 0.0f;
  for (long i = 0; i < kh; ++i) {
    const long iy = oy * sh - ph + i;
    if (iy < 0 || iy >= h) continue;
    for (long j = 0; j < kw; ++j) {
      const long ix = ox * sw - pw + j;
      if (ix < 0 || ix >= w) continue;
      s += x[base + iy * w + ix];
    }
  }
  y[y_off + idx] = s * (1.0f / (float)(kh * kw));
}

// dx (n, c, h, w) = sum over covering outputs of dy / (kh*kw).
__kernel void avgpool_backward(long n, long c, long h, long w, long kh, long kw, long sh, long sw,
                               long ph, long pw, long oh, long ow, __global const float* dy,
                               long dy_off, __global float* dx, long dx_off) {
  const long idx = get_global_id(0);
  if (idx >= n * c * h * w) return;
  const long ix = idx % w, iy = (idx / w) % h, plane = idx / (w * h);
  long oy0 = iy + ph - kh + 1;
  oy0 = oy0 <= 0 ? 0 : (oy0 + sh - 1) / sh;
  long ox0 = ix + pw - kw + 1;
  ox0 = ox0 <= 0 ? 0 : (ox0 + sw - 1) / sw;
  const long oy1 = min((iy + ph) / sh, oh - 1);
  const long ox1 = min((ix + pw) / sw, ow - 1);
  const float inv = 1.0f / (float)(kh * kw);
  float s = 0.0f;
  for (long oy = oy0; oy <= oy1; ++oy) {
    for (long ox = ox0; ox <= ox1; ++ox) s += dy[dy_off + (plane * oh + oy) * ow + ox] * inv;
  }
  dx[dx_off + idx] = s;
}
