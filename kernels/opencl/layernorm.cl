// layernorm.cl: layer normalisation over the last dimension.
//
// Forward and the dx part of backward use one work-item per row (two passes
// over the row: mean, then variance, as the CPU backend does); dgamma / dbeta
// use one work-item per column looping over rows, and accumulate.

// x, y (rows, cols); gamma, beta (cols); mean, rstd (rows).
__kernel void layernorm_forward(long rows, long cols, float eps, __global const float* x, long x_off,
                                __global const float* gamma, long g_off, __global const float* beta,
                                long b_off, __global float* y, long y_off, __global float* mean,
                                long m_off, __global float* rstd, long r_off) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* xr = x + x_off + r * cols;
  __global float* yr = y + y_off + r * cols;
  float s = 0.0f;
  for (long j = 0; j < cols; ++j) s += xr[j];
  const float mu = s / (float)cols;
  float v = 0.0f;
  for (long j = 0; j < cols; ++j) {
    const float d = xr[j] - mu;
    v += d * d;
  }
  const float rs = 1.0f / sqrt(v / (float)cols + eps);
  for (long j = 0; j < cols; ++j) yr[j] = (xr[j] - mu) * rs * gamma[g_off + j] + beta[b_off + j];
  mean[m_off + r] = mu;
  rstd[r_off + r] = rs;
}

// dx (rows, cols) = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma (overwrites).
__kernel void layernorm_backward_dx(long rows, long cols, __global const float* x, long x_off,
                                    __global const float* gamma, long g_off,
                                    __global const float* mean, long m_off,
                                    __global const float* rstd, long r_off,
                                    __global const float* dy, long dy_off, __global float* dx,
                                    long dx_off) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* xr = x + x_off + r * cols;
  __global const float* dyr = dy + dy_off + r * cols;
  __global float* dxr = dx + dx_off + r * cols;
  const float mu = mean[m_off + r], rs = rstd[r_off + r];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (long j = 0; j < cols; ++j) {
    const float g = dyr[j] * gamma[g_off + j];
    sum_g += g;
    sum_gx += g * ((xr[j] - mu) * rs);
  }
  const float mean_g = sum_g / (float)cols, mean_gx = sum_gx / (float)cols;
  for (long j = 0; j < cols; ++j) {
    const float xhat = (xr[j] - mu) * rs;
    const float g = dyr[j] * gamma[g_off + j];
    dxr[j] = rs * (g - mean_g - xhat * mean_gx);
  }
}

// dgamma (cols) += sum_r dy * xhat; dbeta (cols) += sum_r dy.
__kernel void layernorm_backward_params(long rows, long cols, __global const float* x, long x_off,
                                        __global const float* mean, long m_off,
                                        __global const float* rstd, long r_off,
                                        __global const float* dy, long dy_off,
                                        __global float* dgamma, long dg_off, __global float* dbeta,
                                        long db_off) {
  const long j = get_global_id(0);
  if (j >= cols) return;
  float sg = 0.0f, sb = 0.0f;
  for (long r = 0; r < rows; ++r) {
    const float g = dy[dy_off + r * cols + j];
    sg += g * ((x[x_off + r * cols + j] - mean[m_off + r]) * rstd[r_off + r]);
    sb += g;
  }
  dgamma[dg_off + j] += sg;
  dbeta[db_off + j] += sb;
}
