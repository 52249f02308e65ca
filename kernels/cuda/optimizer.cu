// optimizer.cu: SGD (momentum, dampening, Nesterov, weight decay) and Adam / AdamW
// steps in place over a whole parameter block, with PyTorch's update rules
// (torch.optim.SGD and the single-tensor torch.optim.Adam / AdamW paths).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

struct SgdConsts {
  float lr, wd, mom, damp;  // damp = 1 - dampening
  bool first, nesterov;
};

// d = g + wd p; buf = first ? d : mom buf + (1 - dampening) d; p -= lr (nesterov ? d + mom buf : buf).
template <bool kMomentum>
__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf, int64_t n,
                           SgdConsts c) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const float d = g[i] + c.wd * p[i];
    if constexpr (!kMomentum) {
      p[i] -= c.lr * d;
    } else {
      const float m = c.first ? d : c.mom * buf[i] + c.damp * d;
      buf[i] = m;
      p[i] -= c.lr * (c.nesterov ? d + c.mom * m : m);
    }
  }
}

struct AdamConsts {
  float decay;         // AdamW: 1 - lr * weight_decay (1 otherwise)
  float l2;            // Adam: weight_decay added to the gradient (0 for AdamW)
  float w1;            // 1 - beta1, the lerp weight of exp_avg
  float beta2, w2;     // w2 = 1 - beta2
  float step_size;     // lr / (1 - beta1^step)
  float bc2_sqrt;      // sqrt(1 - beta2^step)
  float eps;
};

// torch.lerp: start + weight (end - start), evaluated from the nearer end.
__device__ __forceinline__ float lerp(float start, float end, float weight) {
  return weight < 0.5f ? start + weight * (end - start) : end - (end - start) * (1.f - weight);
}

__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, int64_t n, AdamConsts c) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const float pi = p[i] * c.decay;
    const float gi = g[i] + c.l2 * p[i];
    const float mi = lerp(m[i], gi, c.w1);
    const float vi = v[i] * c.beta2 + c.w2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    p[i] = pi - c.step_size * (mi / denom);
  }
}

}  // namespace

void sgd_step(float* params, const float* grads, float* momentum_buf, int64_t n, const SgdStep& step,
              cudaStream_t s) {
  require_non_negative("sgd_step", "n", n);
  const bool use_momentum = step.momentum != 0.f;
  if (use_momentum && momentum_buf == nullptr && n > 0)
    throw std::invalid_argument("cuda sgd_step: momentum " + std::to_string(step.momentum) +
                                " needs a momentum buffer");
  if (n == 0) return;
  const SgdConsts c{step.lr, step.weight_decay, step.momentum, 1.f - step.dampening, step.first, step.nesterov};
  if (use_momentum)
    sgd_kernel<true><<<grid_for(n), kBlock, 0, s>>>(params, grads, momentum_buf, n, c);
  else
    sgd_kernel<false><<<grid_for(n), kBlock, 0, s>>>(params, grads, nullptr, n, c);
  CUDA_CHECK_LAUNCH();
}

void adam_step(float* params, const float* grads, float* m, float* v, int64_t n, const AdamStep& step,
               cudaStream_t s) {
  require_non_negative("adam_step", "n", n);
  if (step.step < 1)
    throw std::invalid_argument("cuda adam_step: step must be >= 1, got " + std::to_string(step.step));
  if (n == 0) return;
  // Scalars as PyTorch computes them: Python floats (double), rounded to float once.
  const double lr = step.lr, wd = step.weight_decay, b1 = step.beta1, b2 = step.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step.step));
  AdamConsts c{};
  c.decay = step.decoupled ? static_cast<float>(1.0 - lr * wd) : 1.f;
  c.l2 = step.decoupled ? 0.f : step.weight_decay;
  c.w1 = static_cast<float>(1.0 - b1);
  c.beta2 = step.beta2;
  c.w2 = static_cast<float>(1.0 - b2);
  c.step_size = static_cast<float>(lr / bc1);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = step.eps;
  adam_kernel<<<grid_for(n), kBlock, 0, s>>>(params, grads, m, v, n, c);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
