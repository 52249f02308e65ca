// fast_math.h: branch-free float exp and GELU-tanh for the CPU backend's loops.
// Every function is plain + - * / and integer bit moves with selects instead of
// branches, so a loop over them auto-vectorises (SSE2 without CLEAVE_NATIVE,
// AVX2/AVX-512 with it) and gives the same bits either way (the backend is built
// with -ffp-contract=off, and with -fno-trapping-math so that SSE2 too turns the
// float compares into selects: device/cpu/CMakeLists.txt). No libm call is made.
//
// Accuracy (tests/device/test_fast_math.cpp sweeps x in [-20, 20] densely plus
// the edge values against a double-precision evaluation of the same formulas):
//   exp_neg(v), v <= 0      relative error <= 2 ulp (2.4e-7) while the result is
//                           a normal float, absolute error <= 1 subnormal ulp
//                           below (down to 0).
//   gelu_tanh(x)            relative error <= 2.5e-7 (1 + 2|u|), u the tanh
//                           argument sqrt(2/pi) (x + 0.044715 x^3): <= 2.5e-7
//                           (4 ulp) for x >= 0 and <= 1e-6 for x in [-2, 0);
//                           for u << 0 exp amplifies the rounding of u, as it
//                           would in any float evaluation of u.
//   gelu_tanh_grad(x)       error <= 5e-7 (1 + 2|u|) times the sum of the
//                           magnitudes of its two terms (the derivative crosses
//                           0 near x = -0.75, where only such a bound means
//                           anything).
//   Both: absolute error <= 5e-43 where the result is subnormal.
// Special values: NaN gives NaN; gelu_tanh(+inf) = +inf, gelu_tanh(-inf) = -0
// (the limit), gelu_tanh_grad(+inf) = 1, gelu_tanh_grad(-inf) = 0.
//
// GELU-tanh is computed as x * sigmoid(2u), which equals 0.5 x (1 + tanh(u)):
// with s = exp(-2|u|) in (0, 1], 0.5 (1 + tanh(u)) is 1/(1+s) for u >= 0 and
// s/(1+s) for u < 0, so neither sign loses digits to cancellation (the libm
// form 1 + tanh(u) loses all of them once u < -9). Its derivative is
// sigmoid(2u) + 2 x u'(x) s/(1+s)^2 with u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
#pragma once

#include <cstdint>
#include <cstring>

namespace cleave::cpu_detail {

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

// exp(v) for v <= 0, or NaN for NaN: Cody-Waite reduction v = n ln2 + r,
// |r| <= ln2/2, Cephes' degree-6 polynomial for e^r, then 2^n applied in two
// halves so that results down to the smallest subnormal come out right.
// Arguments below -104 give 0 (they are clamped to -110). Not for v > 0.
inline float exp_neg(float x) {
  const float v = x > -110.f ? x : -110.f;  // also turns NaN into -110: restored below
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float nf = (v * kLog2e + kRound) - kRound;
  const float r = (v - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  const int32_t n = static_cast<int32_t>(nf);  // in [-159, 0]
  const int32_t half = n / 2;                  // 2^n = 2^half * 2^(n - half), both normal
  const float e = p * bits_to_float((half + 127) << 23) * bits_to_float((n - half + 127) << 23);
  return x != x ? x : e;
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's GELU.
inline float gelu_tanh(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float au = u < 0.f ? -u : u;
  const float s = exp_neg(-2.f * au);
  const float sig = (u < 0.f ? s : 1.f) / (1.f + s);  // sigmoid(2u)
  return sig == 0.f ? -0.f : x * sig;                 // -inf * 0 would be NaN; the limit is -0
}

// d/dx gelu_tanh(x).
inline float gelu_tanh_grad(float x) {
  const float x2 = x * x;
  const float u = kGeluScale * (x + kGeluCubic * x2 * x);
  const float du = kGeluScale * (1.f + 3.f * kGeluCubic * x2);
  const float au = u < 0.f ? -u : u;
  const float s = exp_neg(-2.f * au);
  const float inv = 1.f / (1.f + s);
  const float sig = (u < 0.f ? s : 1.f) * inv;
  const float tail = s == 0.f ? 0.f : (2.f * x * du) * (s * inv * inv);  // x du may be inf where s is 0
  return x != x ? x : sig + tail;
}

}  // namespace cleave::cpu_detail
