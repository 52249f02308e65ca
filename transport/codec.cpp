// codec.cpp: float16 and int8 payload codecs (see codec.h for the contracts).
#include "transport/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace cleave::transport {

static_assert(std::endian::native == std::endian::little,
              "cleave's wire format is little-endian; big-endian hosts need byte swaps here");

const char* encoding_name(Encoding encoding) {
  switch (encoding) {
    case Encoding::kF32: return "f32";
    case Encoding::kF16: return "f16";
    case Encoding::kInt8: return "int8";
  }
  return "?";
}

Encoding parse_encoding(std::string_view text) {
  if (text == "f32" || text == "float32" || text == "fp32") return Encoding::kF32;
  if (text == "f16" || text == "float16" || text == "fp16" || text == "half") return Encoding::kF16;
  if (text == "int8" || text == "i8") return Encoding::kInt8;
  throw std::invalid_argument("unknown encoding '" + std::string(text) +
                              "' (use f32, f16 or int8)");
}

size_t encoded_element_size(Encoding encoding) {
  switch (encoding) {
    case Encoding::kF32: return 4;
    case Encoding::kF16: return 2;
    case Encoding::kInt8: return 1;
  }
  throw std::invalid_argument("encoded_element_size: invalid encoding");
}

uint16_t float_to_half(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // quiet NaN
  }
  // Largest float that rounds to 65504 under RNE is just below 65520; clamp above.
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7bffu);
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero (2^-25 ties to even 0)
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int exp = static_cast<int>(abs >> 23);  // biased float exponent
    const int shift = 126 - exp;                  // 113 - exp + 13
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits.
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: fine
  return static_cast<uint16_t>(sign | half);
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  uint32_t f;
  if (exp == 0) {
    if (mant == 0) {
      f = sign;
    } else {  // subnormal: value = mant * 2^-24, exact in float
      const float v = static_cast<float>(mant) * 0x1p-24f;
      return sign ? -v : v;
    }
  } else if (exp == 31) {
    f = sign | 0x7f800000u | (mant << 13);
  } else {
    f = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(f);
}

EncodedPayload encode_payload(std::span<const float> values, Encoding encoding) {
  EncodedPayload out;
  const size_t n = values.size();
  out.bytes.resize(n * encoded_element_size(encoding));
  std::byte* dst = out.bytes.data();
  switch (encoding) {
    case Encoding::kF32:
      if (n) std::memcpy(dst, values.data(), n * sizeof(float));
      break;
    case Encoding::kF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = float_to_half(values[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      break;
    case Encoding::kInt8: {
      float max_abs = 0.0f;
      for (float v : values)
        if (std::isfinite(v)) max_abs = std::max(max_abs, std::fabs(v));
      const float scale = max_abs / 127.0f;
      out.scale = scale;
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (size_t i = 0; i < n; ++i) {
        const float v = values[i];
        float q;
        if (std::isnan(v)) q = 0.0f;
        else if (std::isinf(v)) q = v > 0 ? 127.0f : -127.0f;
        else q = std::clamp(std::nearbyint(v * inv), -127.0f, 127.0f);
        dst[i] = static_cast<std::byte>(static_cast<int8_t>(q));
      }
      break;
    }
  }
  return out;
}

void decode_payload(std::span<const std::byte> bytes, Encoding encoding, float scale,
                    std::vector<float>& out) {
  const size_t es = encoded_element_size(encoding);
  if (bytes.size() % es != 0)
    throw std::invalid_argument("payload of " + std::to_string(bytes.size()) +
                                " bytes is not a multiple of the " + encoding_name(encoding) +
                                " element size " + std::to_string(es));
  const size_t n = bytes.size() / es;
  out.resize(n);
  const std::byte* src = bytes.data();
  switch (encoding) {
    case Encoding::kF32:
      if (n) std::memcpy(out.data(), src, n * sizeof(float));
      break;
    case Encoding::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = half_to_float(h);
      }
      break;
    case Encoding::kInt8:
      if (!std::isfinite(scale) || scale < 0.0f)
        throw std::invalid_argument("int8 payload scale " + std::to_string(scale) +
                                    " is not finite and >= 0");
      for (size_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(static_cast<int8_t>(src[i])) * scale;
      break;
  }
}

std::vector<float> decode_payload(std::span<const std::byte> bytes, Encoding encoding, float scale) {
  std::vector<float> out;
  decode_payload(bytes, encoding, scale, out);
  return out;
}

}  // namespace cleave::transport
