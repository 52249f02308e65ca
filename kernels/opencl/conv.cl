// conv.cl: im2col / col2im for convolution as GEMM, and the axis swap that
// moves between (n, c, hw) images and (c, n, hw) GEMM results.
//
// cols (c*kh*kw, n*oh*ow): row (ci*kh + i)*kw + j, column (ni*oh + oy)*ow + ox.
// col2im gathers (one work-item per image element), so it needs no atomics and
// sums each pixel's contributions in a fixed order.

__kernel void im2col(long n, long c, long h, long w, long kh, long kw, long sh, long sw, long ph,
                     long pw, long oh, long ow, __global const float* x, long x_off,
                     __global float* cols, long cols_off) {
  const long idx = get_global_id(0);
  const long ncols = n * oh * ow;
  if (idx >= c * kh * kw * ncols) return;
  const long row = idx / ncols, col = idx % ncols;
  const long j = row % kw, i = (row / kw) % kh, ci = row / (kw * kh);
  const long ox = col % ow, oy = (col / ow) % oh, ni = col / (ow * oh);
  const long iy = oy * sh - ph + i, ix = ox * sw - pw + j;
  float v = 0.0f;
  if (iy >= 0 && iy < h && ix >= 0 && ix < w) v = x[x_off + ((ni * c + ci) * h + iy) * w + ix];
  cols[cols_off + idx] = v;
}

// dx (n, c, h, w) = sum of the cols entries that im2col read from each pixel (overwrites).
__kernel void col2im(long n, long c, long h, long w, long kh, long kw, long sh, long sw, long ph,
                     long pw, long oh, long ow, __global const float* cols, long cols_off,
                     __global float* dx, long dx_off) {
  const long idx = get_global_id(0);
  if (idx >= n * c * h * w) return;
  const long ix = idx % w, iy = (idx / w) % h, ci = (idx / (w * h)) % c, ni = idx / (w * h * c);
  const long ncols = n * oh * ow;
  float s = 0.0f;
  for (long i = 0; i < kh; ++i) {
    const long ty = iy + ph - i;
    if (ty < 0 || ty % sh != 0) continue;
    const long oy = ty / sh;
    if (oy >= oh) continue;
    for (long j = 0; j < kw; ++j) {
      const long tx = ix + pw - j;
      if (tx < 0 || tx % sw != 0) continue;
      const long ox = tx / sw;
      if (ox >= ow) continue;
      const long row = (ci * kh + i) * kw + j;
      s += cols[cols_off + row * ncols + (ni * oh + oy) * ow + ox];
    }
  }
  dx[dx_off + idx] = s;
}

// dst (b, a, r) = src (a, b, r)
__kernel void swap_axes01(long a, long b, long r, __global const float* src, long src_off,
                          __global float* dst, long dst_off) {
  const long idx = get_global_id(0);
  if (idx >= a * b * r) return;
  const long k = idx % r, bi = (idx / r) % b, ai = idx / (r * b);
  dst[dst_off + (bi * a + ai) * r + k] = src[src_off + idx];
}
