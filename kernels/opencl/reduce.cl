// reduce.cl: sum of squares. Each work-group reduces a grid-strided share of
// the input in local memory (group size a power of two) and writes one partial
// sum; the host adds the partials in double.

__kernel void sum_squares_partial(long n, __global const float* x, long x_off,
                                  __global float* partial, __local float* scratch) {
  const int lid = get_local_id(0);
  const int lsize = get_local_size(0);
  const long stride = (long)get_global_size(0);
  float s = 0.0f;
  for (long i = get_global_id(0); i < n; i += stride) {
    const float v = x[x_off + i];
    s += v * v;
  }
  scratch[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int k = lsize / 2; k > 0; k /= 2) {
    if (lid < k) scratch[lid] += scratch[lid + k];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) partial[get_group_id(0)] = scratch[0];
}
