// bias.cl: bias broadcast over rows / channel planes and its gradient.
//
// Gradients accumulate into db. Row biases reduce with one work-item per
// feature (coalesced across features); channel biases reduce with one
// work-group per channel and a tree in local memory (group size a power of two).

// y (rows, features) += b (features)
__kernel void add_bias_rows(long rows, long features, __global float* y, long y_off,
                            __global const float* b, long b_off) {
  const long i = get_global_id(0);
  if (i >= rows * features) return;
  y[y_off + i] += b[b_off + i % features];
}

// db (features) += column sums of dy (rows, features)
__kernel void bias_grad_rows(long rows, long features, __global const float* dy, long dy_off,
                             __global float* db, long db_off) {
  const long f = get_global_id(0);
  if (f >= features) return;
  float s = 0.0f;
  for (long r = 0; r < rows; ++r) s += dy[dy_off + r * features + f];
  db[db_off + f] += s;
}

// y (n, c, hw) += b (c)
__kernel void add_bias_channels(long n, long c, long hw, __global float* y, long y_off,
                                __global const float* b, long b_off) {
  const long i = get_global_id(0);
  if (i >= n * c * hw) return;
  y[y_off + i] += b[b_off + (i / hw) % c];
}

// db (c) += sum over n, hw of dy (n, c, hw); one work-group per channel.
__kernel void bias_grad_channels(long n, long c, long hw, __global const float* dy, long dy_off,
                                 __global float* db, long db_off, __local float* scratch) {
  const long ch = get_group_id(0);
  const int lid = get_local_id(0);
  const int lsize = get_local_size(0);
  float s = 0.0f;
  const long total = n * hw;
  for (long k = lid; k < total; k += lsize) {
    const long ni = k / hw, p = k % hw;
    s += dy[dy_off + (ni * c + ch) * hw + p];
  }
  scratch[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int stride = lsize / 2; stride > 0; stride /= 2) {
    if (lid < stride) scratch[lid] += scratch[lid + stride];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) db[db_off + ch] += scratch[0];
}
