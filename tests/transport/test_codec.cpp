// test_codec.cpp: float16 / int8 codecs: exact cases, clamping, error bounds.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "transport/codec.h"

using namespace cleave::transport;

TEST_CASE("float16 exact values, rounding and clamping", "[transport][codec]") {
  CHECK(float_to_half(0.0f) == 0x0000);
  CHECK(float_to_half(-0.0f) == 0x8000);
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(-2.0f) == 0xc000);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(1e6f) == 0x7bff);    // clamped, not inf
  CHECK(float_to_half(-1e6f) == 0xfbff);
  CHECK(float_to_half(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  CHECK(float_to_half(0x1p-24f) == 0x0001);  // smallest subnormal
  CHECK(float_to_half(0x1p-25f) == 0x0000);  // tie rounds to even (zero)
  CHECK(float_to_half(0x1.8p-25f) == 0x0001);
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: rounds to even (1.0)
  CHECK(float_to_half(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(float_to_half(1.0f + 0x1.8p-11f) == 0x3c01);
  // Every half value round-trips exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(float_to_half(f) == h);
  }
}

TEST_CASE("float16 error bound on random data", "[transport][codec]") {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(10000);
  for (auto& x : v) x = u(rng) * std::pow(10.0f, static_cast<float>(rng() % 9) - 4.0f);
  auto enc = encode_payload(v, Encoding::kF16);
  REQUIRE(enc.bytes.size() == v.size() * 2);
  auto back = decode_payload(enc.bytes, Encoding::kF16, 0.0f);
  REQUIRE(back.size() == v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float a = std::fabs(v[i]);
    const float bound = a >= 0x1p-14f ? a * 0x1p-11f : 0x1p-25f;
    REQUIRE(std::fabs(back[i] - v[i]) <= bound);
  }
}

TEST_CASE("int8 error bound, scale and special values", "[transport][codec]") {
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> v(5000);
  for (auto& x : v) x = n(rng);
  auto enc = encode_payload(v, Encoding::kInt8);
  REQUIRE(enc.bytes.size() == v.size());
  float max_abs = 0;
  for (float x : v) max_abs = std::max(max_abs, std::fabs(x));
  CHECK(enc.scale == Approx(max_abs / 127.0f));
  auto back = decode_payload(enc.bytes, Encoding::kInt8, enc.scale);
  for (size_t i = 0; i < v.size(); ++i)
    REQUIRE(std::fabs(back[i] - v[i]) <= enc.scale * 0.5f * (1.0f + 1e-5f));
  // The extreme value is exact up to float rounding.
  // All zeros: scale 0, decodes to zeros.
  std::vector<float> zeros(10, 0.0f);
  auto z = encode_payload(zeros, Encoding::kInt8);
  CHECK(z.scale == 0.0f);
  for (float x : decode_payload(z.bytes, Encoding::kInt8, z.scale)) CHECK(x == 0.0f);
  // Non-finite values: NaN -> 0, inf -> +-127 * scale; scale from finite values.
  std::vector<float> special = {1.0f, std::nanf(""), std::numeric_limits<float>::infinity(), -2.0f};
  auto s = encode_payload(special, Encoding::kInt8);
  CHECK(s.scale == Approx(2.0f / 127.0f));
  auto sb = decode_payload(s.bytes, Encoding::kInt8, s.scale);
  CHECK(sb[1] == 0.0f);
  CHECK(sb[2] == Approx(2.0f));
  CHECK(sb[3] == Approx(-2.0f));
}

TEST_CASE("encodings cut bytes 2x / 4x and reject bad payloads", "[transport][codec]") {
  std::vector<float> v(1024, 0.5f);
  CHECK(encode_payload(v, Encoding::kF32).bytes.size() == 4096);
  CHECK(encode_payload(v, Encoding::kF16).bytes.size() == 2048);
  CHECK(encode_payload(v, Encoding::kInt8).bytes.size() == 1024);
  std::vector<std::byte> odd(7);
  CHECK_THROWS_WITH(decode_payload(odd, Encoding::kF32, 0.0f), Catch::Contains("not a multiple"));
  CHECK_THROWS_AS(decode_payload(odd, Encoding::kInt8, -1.0f), std::invalid_argument);
  CHECK_THROWS_AS(decode_payload(odd, Encoding::kInt8, std::nanf("")), std::invalid_argument);
  CHECK(parse_encoding("f16") == Encoding::kF16);
  CHECK(parse_encoding("int8") == Encoding::kInt8);
  CHECK_THROWS_WITH(parse_encoding("bf16"), Catch::Contains("unknown encoding 'bf16'"));
}

TEST_CASE("unaligned payload buffers decode correctly", "[transport][codec]") {
  std::vector<float> v = {1.5f, -2.25f, 3.0f};
  auto enc = encode_payload(v, Encoding::kF32);
  std::vector<std::byte> shifted(enc.bytes.size() + 1);
  std::copy(enc.bytes.begin(), enc.bytes.end(), shifted.begin() + 1);
  auto back = decode_payload(std::span<const std::byte>(shifted).subspan(1), Encoding::kF32, 0.0f);
  CHECK(back == v);
}
