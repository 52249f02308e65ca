// secagg_crypto.cpp: see secagg_crypto.h.
#include "core/fed/secagg_crypto.h"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace cleave::secagg {

void init_crypto() {
  static const int status = sodium_init();  // 0 first time, 1 already done, -1 failure
  if (status < 0) throw std::runtime_error("libsodium could not initialise (sodium_init failed)");
}

void wipe(void* data, size_t size) {
  if (size > 0) sodium_memzero(data, size);
}

void random_bytes(void* data, size_t size) {
  if (size == 0) return;  // an empty vector's data() may be null, which randombytes_buf may not take
  init_crypto();
  randombytes_buf(data, size);
}

KeyPair make_key_pair() {
  init_crypto();
  KeyPair kp;
  crypto_box_keypair(kp.public_key.data(), kp.secret_key.bytes.data());
  return kp;
}

Key32 public_key_of(const Key32& secret_key) {
  init_crypto();
  Key32 pk{};
  crypto_scalarmult_base(pk.data(), secret_key.data());
  return pk;
}

Key32 agree(const Key32& secret_key, const Key32& peer_public_key, std::string_view context,
            std::span<const uint8_t> info) {
  init_crypto();
  SecretKey shared;
  if (crypto_scalarmult(shared.bytes.data(), secret_key.data(), peer_public_key.data()) != 0)
    throw std::runtime_error("X25519 with a low-order public key (its shared secret would be public)");
  crypto_generichash_state state;
  crypto_generichash_init(&state, shared.bytes.data(), shared.bytes.size(), 32);
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(context.data()), context.size());
  const unsigned char zero = 0;  // ends the context, so no context is a prefix of another's input
  crypto_generichash_update(&state, &zero, 1);
  crypto_generichash_update(&state, info.data(), info.size());
  Key32 out{};
  crypto_generichash_final(&state, out.data(), out.size());
  wipe(&state, sizeof state);
  return out;
}

Key32 mac(const Key32& key, std::span<const uint8_t> message) {
  init_crypto();
  Key32 out{};
  crypto_generichash(out.data(), out.size(), message.data(), message.size(), key.data(), key.size());
  return out;
}

bool equal_ct(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  return a.empty() || sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::vector<uint8_t> seal(const Key32& sender_secret_key, const Key32& recipient_public_key,
                          std::span<const uint8_t> plaintext) {
  static_assert(crypto_box_NONCEBYTES + crypto_box_MACBYTES == kBoxOverhead);
  init_crypto();
  std::vector<uint8_t> box(kBoxOverhead + plaintext.size());
  randombytes_buf(box.data(), crypto_box_NONCEBYTES);
  if (crypto_box_easy(box.data() + crypto_box_NONCEBYTES, plaintext.data(), plaintext.size(), box.data(),
                      recipient_public_key.data(), sender_secret_key.data()) != 0)
    throw std::runtime_error("cannot seal a box to a low-order public key");
  return box;
}

std::optional<std::vector<uint8_t>> open(const Key32& recipient_secret_key, const Key32& sender_public_key,
                                         std::span<const uint8_t> box) {
  init_crypto();
  if (box.size() < kBoxOverhead) return std::nullopt;
  std::vector<uint8_t> plain(box.size() - kBoxOverhead);
  if (crypto_box_open_easy(plain.data(), box.data() + crypto_box_NONCEBYTES, box.size() - crypto_box_NONCEBYTES,
                           box.data(), sender_public_key.data(), recipient_secret_key.data()) != 0)
    return std::nullopt;
  return plain;
}

// ---------------------------------------------------------------------------

uint8_t gf256_mul(uint8_t a, uint8_t b) {
  uint8_t r = 0;
  for (int i = 0; i < 8; ++i) {
    r ^= static_cast<uint8_t>(-(b & 1)) & a;                     // add a when b's low bit is set
    const uint8_t carry = static_cast<uint8_t>(-(a >> 7));        // 0xff when a * x overflows 8 bits
    a = static_cast<uint8_t>((a << 1) ^ (carry & 0x1b));          // a * x mod 0x11b
    b = static_cast<uint8_t>(b >> 1);
  }
  return r;
}

uint8_t gf256_inv(uint8_t a) {
  // a^254 = a^2 * a^4 * ... * a^128 (the multiplicative group has order 255).
  uint8_t result = 1, power = a;
  for (int k = 1; k < 8; ++k) {
    power = gf256_mul(power, power);
    result = gf256_mul(result, power);
  }
  return result;
}

namespace {

void check_xs(std::span<const uint8_t> xs) {
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == 0) throw std::invalid_argument("Shamir: x = 0 is the secret itself, not a share");
    for (size_t j = 0; j < i; ++j)
      if (xs[i] == xs[j]) throw std::invalid_argument("Shamir: x = " + std::to_string(xs[i]) + " appears twice");
  }
}

}  // namespace

std::vector<Share> shamir_split(std::span<const uint8_t> secret, int threshold, std::span<const uint8_t> xs) {
  if (secret.empty()) throw std::invalid_argument("Shamir: empty secret");
  if (threshold < 1 || static_cast<size_t>(threshold) > xs.size())
    throw std::invalid_argument("Shamir: threshold " + std::to_string(threshold) + " outside [1, " +
                                std::to_string(xs.size()) + "] (the number of shares)");
  check_xs(xs);
  const size_t len = secret.size(), degree = static_cast<size_t>(threshold) - 1;
  // coefficients[k * len + i]: the x^(k+1) coefficient of byte i's polynomial.
  std::vector<uint8_t> coefficients(degree * len);
  random_bytes(coefficients.data(), coefficients.size());
  std::vector<Share> shares;
  shares.reserve(xs.size());
  for (uint8_t x : xs) {
    std::vector<uint8_t> y(len);
    for (size_t i = 0; i < len; ++i) {
      uint8_t acc = 0;  // Horner from the highest coefficient down to the secret byte
      for (size_t k = degree; k > 0; --k) acc = gf256_mul(acc, x) ^ coefficients[(k - 1) * len + i];
      y[i] = gf256_mul(acc, x) ^ secret[i];
    }
    shares.emplace_back(x, std::move(y));
  }
  wipe(coefficients.data(), coefficients.size());
  return shares;
}

std::vector<uint8_t> shamir_combine(std::span<const Share> shares, int threshold) {
  if (threshold < 1) throw std::invalid_argument("Shamir: threshold " + std::to_string(threshold) + " below 1");
  if (shares.size() < static_cast<size_t>(threshold))
    throw std::invalid_argument("Shamir: " + std::to_string(shares.size()) + " shares, " +
                                std::to_string(threshold) + " needed");
  std::vector<uint8_t> xs;
  for (const Share& s : shares) xs.push_back(s.x);
  check_xs(xs);
  const size_t len = shares[0].y.size();
  for (const Share& s : shares)
    if (s.y.size() != len) throw std::invalid_argument("Shamir: shares of different lengths");
  std::vector<uint8_t> secret(len, 0);
  const size_t t = static_cast<size_t>(threshold);
  for (size_t i = 0; i < t; ++i) {
    // Lagrange basis at 0: prod_{j != i} x_j / (x_j - x_i); subtraction is XOR here.
    uint8_t basis = 1;
    for (size_t j = 0; j < t; ++j)
      if (j != i) basis = gf256_mul(basis, gf256_mul(xs[j], gf256_inv(xs[j] ^ xs[i])));
    for (size_t k = 0; k < len; ++k) secret[k] ^= gf256_mul(basis, shares[i].y[k]);
  }
  return secret;
}

// ---------------------------------------------------------------------------

void apply_mask(std::span<uint64_t> values, const Key32& seed, int64_t round, MaskSign sign) {
  constexpr size_t kChunkWords = 512;  // 4096 bytes: 64 ChaCha20 blocks
  constexpr size_t kBlocksPerChunk = kChunkWords * 8 / 64;
  if (values.size() > (size_t{1} << 35))
    throw std::invalid_argument("a secure-aggregation mask covers at most 2^35 values, not " +
                                std::to_string(values.size()));
  init_crypto();
  std::array<uint8_t, crypto_stream_chacha20_ietf_NONCEBYTES> nonce{};
  for (size_t i = 0; i < 8; ++i) nonce[i] = static_cast<uint8_t>(static_cast<uint64_t>(round) >> (8 * i));
  std::array<uint8_t, kChunkWords * 8> zeros{}, stream{};
  for (size_t start = 0, chunk = 0; start < values.size(); start += kChunkWords, ++chunk) {
    const size_t words = std::min(kChunkWords, values.size() - start);
    crypto_stream_chacha20_ietf_xor_ic(stream.data(), zeros.data(), words * 8, nonce.data(),
                                       static_cast<uint32_t>(chunk * kBlocksPerChunk), seed.data());
    for (size_t w = 0; w < words; ++w) {
      const uint64_t m = read_u64(stream, w * 8);
      values[start + w] = sign == MaskSign::kAdd ? values[start + w] + m : values[start + w] - m;
    }
  }
  wipe(stream.data(), stream.size());
}

uint64_t quantize(double value, int frac_bits) {
  if (frac_bits < 0 || frac_bits > 62)
    throw std::invalid_argument("quantize: frac_bits " + std::to_string(frac_bits) + " outside [0, 62]");
  const double scaled = std::ldexp(value, frac_bits);
  if (!std::isfinite(scaled) || std::fabs(scaled) >= 0x1p62)
    throw std::invalid_argument("quantize: " + std::to_string(value) + " x 2^" + std::to_string(frac_bits) +
                                " is not a finite number below 2^62 in magnitude");
  return static_cast<uint64_t>(std::llround(scaled));  // two's complement: int64 -> Z/2^64
}

double dequantize(uint64_t value, int frac_bits) {
  return std::ldexp(static_cast<double>(static_cast<int64_t>(value)), -frac_bits);
}

namespace {
constexpr std::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
}  // namespace

Key32 z85_decode_key(std::string_view z85, const std::string& what) {
  const std::string_view kAlphabet = kZ85Alphabet;
  if (z85.size() != 40)
    throw std::invalid_argument(what + ": a Z85 CURVE key has 40 characters, not " + std::to_string(z85.size()));
  Key32 out{};
  for (size_t group = 0; group < 8; ++group) {
    uint64_t value = 0;
    for (size_t i = 0; i < 5; ++i) {
      const size_t digit = kAlphabet.find(z85[group * 5 + i]);
      if (digit == std::string_view::npos) throw std::invalid_argument(what + ": not a Z85 character in the key");
      value = value * 85 + digit;
    }
    if (value > 0xffffffffu) throw std::invalid_argument(what + ": a Z85 group above 2^32 - 1");
    for (size_t i = 0; i < 4; ++i) out[group * 4 + i] = static_cast<uint8_t>(value >> (24 - 8 * i));  // big-endian
  }
  return out;
}

std::string z85_encode_key(const Key32& key) {
  std::string out(40, ' ');
  for (size_t group = 0; group < 8; ++group) {
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i) value = (value << 8) | key[group * 4 + i];
    for (size_t i = 5; i-- > 0; value /= 85) out[group * 5 + i] = kZ85Alphabet[value % 85];
  }
  return out;
}

void append_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void append_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t read_u32(std::span<const uint8_t> in, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | in[at + static_cast<size_t>(i)];
  return v;
}

uint64_t read_u64(std::span<const uint8_t> in, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | in[at + static_cast<size_t>(i)];
  return v;
}

}  // namespace cleave::secagg
