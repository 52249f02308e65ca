// optim.cl: optimizer steps in place over whole parameter blocks, with
// PyTorch's single-tensor semantics (torch.optim.SGD / Adam / AdamW).
// Step-dependent scalars (bias corrections) are computed on the host.

// SGD: g = grad + wd*p; buf = first ? g : momentum*buf + (1-dampening)*g;
// g = nesterov ? g + momentum*buf : buf (when momentum != 0); p -= lr*g.
__kernel void sgd_step(long n, float lr, float momentum, float dampening, float weight_decay,
                       int nesterov, int first, __global float* p, long p_off,
                       __global const float* grad, long g_off, __global float* buf, long b_off) {
  const long i = get_global_id(0);
  if (i >= n) return;
  float g = grad[g_off + i];
  if (weight_decay != 0.0f) g = g + weight_decay * p[p_off + i];
  if (momentum != 0.0f) {
    float b;
    if (first) {
      b = g;
    } else {
      b = momentum * buf[b_off + i] + (1.0f - dampening) * g;
    }
    buf[b_off + i] = b;
    g = nesterov ? g + momentum * b : b;
  }
  p[p_off + i] = p[p_off + i] - lr * g;
}

// Adam / AdamW: step_size = lr / (1 - beta1^t), inv_bc2_sqrt = 1 / sqrt(1 - beta2^t).
// AdamW (decoupled) scales the weight by (1 - lr*wd) first; Adam adds wd*p to g.
__kernel void adam_step(long n, float beta1, float beta2, float eps, float decay, float l2,
                        float step_size, float inv_bc2_sqrt, __global float* p, long p_off,
                        __global const float* grad, long g_off, __global float* m, long m_off,
                        __global float* v, long v_off) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float w = p[p_off + i] * decay;
  const float g = grad[g_off + i] + l2 * w;
  const float mi = beta1 * m[m_off + i] + (1.0f - beta1) * g;
  const float vi = beta2 * v[v_off + i] + (1.0f - beta2) * g * g;
  m[m_off + i] = mi;
  v[v_off + i] = vi;
  p[p_off + i] = w - step_size * mi / (sqrt(vi) * inv_bc2_sqrt + eps);
}
