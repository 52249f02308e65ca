// activation.cu: ReLU, GELU (exact, erf form as in PyTorch), tanh and GPT-2's
// tanh-approximated GELU (gelu_tanh), forward and backward.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace cleave::cuda {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi), gelu_tanh's

// Pointers may alias (in-place activations), so no __restrict__.
template <Activation A>
__global__ void activation_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const float v = x[i];
    if constexpr (A == Activation::relu) {
      y[i] = v > 0.f ? v : 0.f;
    } else if constexpr (A == Activation::gelu) {
      y[i] = 0.5f * v * (1.f + erff(v * kInvSqrt2));
    } else if constexpr (A == Activation::tanh) {
      y[i] = tanhf(v);
    } else {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      y[i] = 0.5f * v * (1.f + tanhf(kGeluScale * (v + 0.044715f * v * v * v)));
    }
  }
}

template <Activation A>
__global__ void activation_backward_kernel(const float* x, const float* y, const float* dy, float* dx,
                                           int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    if constexpr (A == Activation::relu) {
      dx[i] = x[i] > 0.f ? dy[i] : 0.f;
    } else if constexpr (A == Activation::gelu) {
      // d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
      const float v = x[i];
      const float cdf = 0.5f * (1.f + erff(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    } else if constexpr (A == Activation::tanh) {
      const float t = y[i];
      dx[i] = dy[i] * (1.f - t * t);
    } else {
      const float v = x[i];
      const float th = tanhf(kGeluScale * (v + 0.044715f * v * v * v));
      const float sech2 = 1.f - th * th;
      dx[i] = dy[i] * (0.5f * (1.f + th) + 0.5f * v * sech2 * kGeluScale * (1.f + 3.f * 0.044715f * v * v));
    }
  }
}

}  // namespace

void activation_forward(Activation act, const float* x, float* y, int64_t n, cudaStream_t s) {
  require_non_negative("activation_forward", "n", n);
  if (n == 0) return;
  const unsigned grid = grid_for(n);
  switch (act) {
    case Activation::relu: activation_forward_kernel<Activation::relu><<<grid, kBlock, 0, s>>>(x, y, n); break;
    case Activation::gelu: activation_forward_kernel<Activation::gelu><<<grid, kBlock, 0, s>>>(x, y, n); break;
    case Activation::tanh: activation_forward_kernel<Activation::tanh><<<grid, kBlock, 0, s>>>(x, y, n); break;
    case Activation::gelu_tanh:
      activation_forward_kernel<Activation::gelu_tanh><<<grid, kBlock, 0, s>>>(x, y, n);
      break;
    default: throw std::invalid_argument("cuda activation_forward: unknown activation");
  }
  CUDA_CHECK_LAUNCH();
}

void activation_backward(Activation act, const float* x, const float* y, const float* dy, float* dx,
                         int64_t n, cudaStream_t s) {
  require_non_negative("activation_backward", "n", n);
  if (n == 0) return;
  const unsigned grid = grid_for(n);
  switch (act) {
    case Activation::relu:
      activation_backward_kernel<Activation::relu><<<grid, kBlock, 0, s>>>(x, y, dy, dx, n);
      break;
    case Activation::gelu:
      activation_backward_kernel<Activation::gelu><<<grid, kBlock, 0, s>>>(x, y, dy, dx, n);
      break;
    case Activation::tanh:
      activation_backward_kernel<Activation::tanh><<<grid, kBlock, 0, s>>>(x, y, dy, dx, n);
      break;
    case Activation::gelu_tanh:
      activation_backward_kernel<Activation::gelu_tanh><<<grid, kBlock, 0, s>>>(x, y, dy, dx, n);
      break;
    default: throw std::invalid_argument("cuda activation_backward: unknown activation");
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace cleave::cuda
