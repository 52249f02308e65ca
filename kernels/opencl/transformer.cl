// transformer.cl: the ops a GPT adds — token embedding lookup and its
// gradient, causal (lower-triangular) softmax over attention scores and its
// gradient.
//
// Token ids are float indices, checked on the host before the launch; an id
// that is not an index in [0, vocab) still never reads or writes out of bounds
// (its output row is NaN, its gradient row is dropped). The softmax works one
// row per work-item and sums in the CPU backend's order, so it rounds like it.

// y (rows, width) row r = table (vocab, width) row ids[r]; one work-item per element.
__kernel void embedding_forward(long rows, long vocab, long width, __global const float* ids, long ids_off,
                                __global const float* table, long t_off, __global float* y, long y_off) {
  const long i = get_global_id(0);
  if (i >= rows * width) return;
  const long r = i / width, j = i % width;
  const float id = ids[ids_off + r];
  if (!(id >= 0.0f && id < (float)vocab && id == floor(id))) {
    y[y_off + i] = NAN;
    return;
  }
  y[y_off + i] = table[t_off + (long)id * width + j];
}

// dtable (vocab, width) row ids[r] += dy (rows, width) row r, accumulating.
// One work-item per column, walking the rows in order: no two work-items touch
// the same table element and every sum is taken in the same order as on the
// CPU, so the result is deterministic (no atomics) and equal to the CPU's.
__kernel void embedding_backward(long rows, long vocab, long width, __global const float* ids, long ids_off,
                                 __global const float* dy, long dy_off, __global float* dtable, long t_off) {
  const long j = get_global_id(0);
  if (j >= width) return;
  for (long r = 0; r < rows; ++r) {
    const float id = ids[ids_off + r];
    if (!(id >= 0.0f && id < (float)vocab && id == floor(id))) continue;
    dtable[t_off + (long)id * width + j] += dy[dy_off + r * width + j];
  }
}

// n matrices (t, t), one work-item per row r = (matrix, query i): over keys
// j <= i, probs = exp(scale s - max) / sum; probs above the diagonal are 0 and
// scores there are not read.
__kernel void causal_softmax_forward(long n, long t, float scale, __global const float* scores, long s_off,
                                     __global float* probs, long p_off) {
  const long r = get_global_id(0);
  if (r >= n * t) return;
  const long i = r % t;
  __global const float* z = scores + s_off + r * t;
  __global float* p = probs + p_off + r * t;
  float mx = scale * z[0];
  for (long j = 1; j <= i; ++j) mx = fmax(mx, scale * z[j]);
  float sum = 0.0f;
  for (long j = 0; j <= i; ++j) {
    const float e = exp(scale * z[j] - mx);
    p[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (long j = 0; j <= i; ++j) p[j] *= inv;
  for (long j = i + 1; j < t; ++j) p[j] = 0.0f;
}

// dscores = scale * probs * (dprobs - sum_j probs dprobs) per row, 0 above the
// diagonal (overwrites dscores, which must not alias dprobs).
__kernel void causal_softmax_backward(long n, long t, float scale, __global const float* probs, long p_off,
                                      __global const float* dprobs, long dp_off, __global float* dscores,
                                      long ds_off) {
  const long r = get_global_id(0);
  if (r >= n * t) return;
  const long i = r % t;
  __global const float* p = probs + p_off + r * t;
  __global const float* dp = dprobs + dp_off + r * t;
  __global float* ds = dscores + ds_off + r * t;
  float dot = 0.0f;
  for (long j = 0; j <= i; ++j) dot += p[j] * dp[j];
  for (long j = 0; j <= i; ++j) ds[j] = scale * p[j] * (dp[j] - dot);
  for (long j = i + 1; j < t; ++j) ds[j] = 0.0f;
}
