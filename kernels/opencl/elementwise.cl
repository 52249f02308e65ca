// elementwise.cl: one work-item per element — axpy, scale, mul and the
// activations (ReLU, exact-erf GELU, tanh, GPT-2's tanh-approximated GELU)
// forward and backward.
//
// Every tensor argument is a (buffer, element offset) pair; n is the element
// count and work-items past n return at once (the launcher rounds the grid up).

__kernel void axpy(long n, float alpha, __global const float* x, long x_off,
                   __global float* y, long y_off) {
  const long i = get_global_id(0);
  if (i >= n) return;
  y[y_off + i] += alpha * x[x_off + i];
}

__kernel void scale(long n, __global float* x, long x_off, float alpha) {
  const long i = get_global_id(0);
  if (i >= n) return;
  x[x_off + i] *= alpha;
}

__kernel void mul(long n, __global const float* a, long a_off, __global const float* b, long b_off,
                  __global float* out, long out_off) {
  const long i = get_global_id(0);
  if (i >= n) return;
  out[out_off + i] = a[a_off + i] * b[b_off + i];
}

// sqrt(2 / pi), the scale inside GPT-2's tanh approximation of GELU.
#define CLEAVE_GELU_SCALE 0.7978845608028654f

// act: 0 = relu, 1 = gelu (0.5 x (1 + erf(x / sqrt 2))), 2 = tanh,
// 3 = gelu_tanh (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
__kernel void activation_forward(long n, int act, __global const float* x, long x_off,
                                 __global float* y, long y_off) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float v = x[x_off + i];
  float r;
  if (act == 0) {
    r = v > 0.0f ? v : 0.0f;
  } else if (act == 1) {
    r = 0.5f * v * (1.0f + erf(v * M_SQRT1_2_F));
  } else if (act == 2) {
    r = tanh(v);
  } else {
    r = 0.5f * v * (1.0f + tanh(CLEAVE_GELU_SCALE * (v + 0.044715f * v * v * v)));
  }
  y[y_off + i] = r;
}

// dx = dy * f'(x); tanh uses y = tanh(x), the others x.
__kernel void activation_backward(long n, int act, __global const float* x, long x_off,
                                  __global const float* y, long y_off, __global const float* dy,
                                  long dy_off, __global float* dx, long dx_off) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float g = dy[dy_off + i];
  float d;
  if (act == 0) {
    d = x[x_off + i] > 0.0f ? g : 0.0f;
  } else if (act == 1) {
    const float v = x[x_off + i];
    const float cdf = 0.5f * (1.0f + erf(v * M_SQRT1_2_F));
    const float pdf = exp(-0.5f * v * v) * 0.3989422804014327f;  // 1/sqrt(2 pi)
    d = g * (cdf + v * pdf);
  } else if (act == 2) {
    const float t = y[y_off + i];
    d = g * (1.0f - t * t);
  } else {
    const float v = x[x_off + i];
    const float th = tanh(CLEAVE_GELU_SCALE * (v + 0.044715f * v * v * v));
    const float sech2 = 1.0f - th * th;
    d = g * (0.5f * (1.0f + th) + 0.5f * v * sech2 * CLEAVE_GELU_SCALE * (1.0f + 3.0f * 0.044715f * v * v));
  }
  dx[dx_off + i] = d;
}

// C (m, n) with row stride ldc := beta * C; beta == 0 writes zeros whatever C held
// (BLAS semantics, used by gemm when k == 0 or beta == 0).
__kernel void scale_matrix(long m, long n, long ldc, float beta, __global float* c, long c_off) {
  const long i = get_global_id(0);
  if (i >= m * n) return;
  const long at = c_off + (i / n) * ldc + i % n;
  c[at] = beta == 0.0f ? 0.0f : beta * c[at];
}
