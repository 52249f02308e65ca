// loss.cl: per-row losses and accuracy — softmax cross-entropy, squared error,
// argmax match. One work-item per row; labels are float class indices
// (validated on the host). When has_grad is 0 no gradient is written (the
// gradient buffer argument is then a placeholder).

// loss (rows) = -log softmax(logits)[label]; dlogits = (softmax - onehot) * grad_scale.
__kernel void softmax_xent(long rows, long classes, float grad_scale, int has_grad,
                           __global const float* logits, long l_off, __global const float* labels,
                           long lab_off, __global float* loss, long loss_off,
                           __global float* dlogits, long d_off) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* z = logits + l_off + r * classes;
  float mx = z[0];
  for (long j = 1; j < classes; ++j) mx = fmax(mx, z[j]);
  float s = 0.0f;
  for (long j = 0; j < classes; ++j) s += exp(z[j] - mx);
  const float lf = labels[lab_off + r];
  if (!(lf >= 0.0f && lf < (float)classes && lf == floor(lf))) {
    // Not a class index (the host should have refused it): poison, never read out of bounds.
    loss[loss_off + r] = NAN;
    if (has_grad)
      for (long j = 0; j < classes; ++j) dlogits[d_off + r * classes + j] = NAN;
    return;
  }
  const long label = (long)lf;
  loss[loss_off + r] = log(s) - (z[label] - mx);
  if (has_grad) {
    __global float* d = dlogits + d_off + r * classes;
    const float inv = 1.0f / s;
    for (long j = 0; j < classes; ++j) d[j] = exp(z[j] - mx) * inv * grad_scale;
    d[label] -= grad_scale;
  }
}

// loss (rows) = sum_j (pred - target)^2; dpred = 2 (pred - target) * grad_scale.
__kernel void mse(long rows, long cols, float grad_scale, int has_grad, __global const float* pred,
                  long p_off, __global const float* target, long t_off, __global float* loss,
                  long loss_off, __global float* dpred, long d_off) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  float s = 0.0f;
  for (long j = 0; j < cols; ++j) {
    const float d = pred[p_off + r * cols + j] - target[t_off + r * cols + j];
    s += d * d;
    if (has_grad) dpred[d_off + r * cols + j] = 2.0f * d * grad_scale;
  }
  loss[loss_off + r] = s;
}

// correct (rows) = 1 where the first maximum of the logits row is at the label.
__kernel void argmax_match(long rows, long classes, __global const float* logits, long l_off,
                           __global const float* labels, long lab_off, __global float* correct,
                           long c_off) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* z = logits + l_off + r * classes;
  long best = 0;
  for (long j = 1; j < classes; ++j)
    if (z[j] > z[best]) best = j;
  correct[c_off + r] = (float)best == labels[lab_off + r] ? 1.0f : 0.0f;
}
