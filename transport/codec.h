// codec.h: payload encodings for activations and gradients.
//
// A link chooses one encoding; decoding always restores float32.
//   kF32:  4 bytes per element, little-endian IEEE float32 (lossless).
//   kF16:  2 bytes per element, IEEE binary16, round-to-nearest-even.
//          Finite values beyond the half range clamp to +-65504 (the largest
//          finite half); +-inf stay +-inf and NaN stays NaN. Relative error
//          <= 2^-11 for |x| in [2^-14, 65504]; absolute error <= 2^-25 below.
//   kInt8: 1 byte per element, symmetric per-tensor scale:
//          scale = max|x| / 127 over the finite elements, q = round(x / scale)
//          clamped to [-127, 127], decoded as q * scale. Absolute error <=
//          scale / 2 for every finite element. NaN encodes as 0, +-inf as
//          +-127 (documented loss: quantized links cannot carry non-finite values).
// Byte order on the wire is little-endian; buffers may be unaligned, so every
// function here reads and writes through memcpy-like byte access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cleave::transport {

enum class Encoding : uint8_t { kF32 = 0, kF16 = 1, kInt8 = 2 };

// "f32" / "f16" / "int8".
const char* encoding_name(Encoding encoding);
// Parses "f32"|"float32"|"f16"|"float16"|"half"|"int8"|"i8"; throws std::invalid_argument.
Encoding parse_encoding(std::string_view text);
// Bytes per element on the wire.
size_t encoded_element_size(Encoding encoding);

// IEEE half <-> float, round-to-nearest-even, clamping as described above.
uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);

// An encoded payload: bytes on the wire plus the int8 scale (0 otherwise).
struct EncodedPayload {
  std::vector<std::byte> bytes;
  float scale = 0.0f;
};

// Encodes `values` (any length). kF32 copies (callers that want zero-copy send
// the float memory directly instead of calling this).
EncodedPayload encode_payload(std::span<const float> values, Encoding encoding);

// Decodes `bytes` (unaligned is fine) into `out` (resized to the element count).
// Throws std::invalid_argument when bytes.size() is not a multiple of the
// element size or the int8 scale is negative / non-finite.
void decode_payload(std::span<const std::byte> bytes, Encoding encoding, float scale,
                    std::vector<float>& out);
std::vector<float> decode_payload(std::span<const std::byte> bytes, Encoding encoding, float scale);

}  // namespace cleave::transport
