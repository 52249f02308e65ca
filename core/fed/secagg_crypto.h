// secagg_crypto.h: the cryptographic primitives of secure aggregation
// (Bonawitz et al. 2017, "Practical Secure Aggregation for Privacy-Preserving
// Machine Learning"; issue 18). The protocol's state machines are in
// core/runtime/common/secagg_round.h; this file holds only what they are made of:
//
//   - X25519 key pairs and key agreement, hashed into 32-byte keys with keyed
//     BLAKE2b (libsodium's crypto_generichash) under a context string, so a key
//     made for one purpose (a MAC key, a pairwise mask seed) is never another's;
//   - MACs (keyed BLAKE2b-256) compared in constant time;
//   - authenticated public-key boxes (crypto_box_easy: X25519 + XSalsa20-Poly1305)
//     with a random 24-byte nonce prepended to the box;
//   - Shamir secret sharing over GF(2^8), byte-wise, for secrets of any length;
//   - the ChaCha20 pseudo-random masks added to or subtracted from a vector of
//     uint64 (the ring Z/2^64 the masked updates live in);
//   - fixed-point quantization into that ring, and Z85 (ZeroMQ's CURVE key text).
//
// No header here includes sodium.h. Every randomness comes from libsodium's
// randombytes_buf. Functions that could be handed a secret wipe their
// temporaries; the types holding secrets (SecretKey) wipe themselves.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cleave::secagg {

using Key32 = std::array<uint8_t, 32>;

// Throws std::runtime_error if libsodium cannot initialise (it is safe to call
// often; every function below calls it first).
void init_crypto();
// Overwrites `size` bytes at `data` with zeros in a way the compiler keeps (sodium_memzero).
void wipe(void* data, size_t size);
// `size` bytes of cryptographic randomness (randombytes_buf).
void random_bytes(void* data, size_t size);

// A 32-byte secret that wipes itself when it goes. Copyable (the protocol
// needs a copy in a share), but each copy wipes its own bytes.
struct SecretKey {
  Key32 bytes{};
  SecretKey() = default;
  explicit SecretKey(const Key32& k) : bytes(k) {}
  SecretKey(const SecretKey&) = default;
  SecretKey& operator=(const SecretKey&) = default;
  ~SecretKey() { wipe(bytes.data(), bytes.size()); }
};

struct KeyPair {
  Key32 public_key{};
  SecretKey secret_key;
};

// A fresh X25519 key pair (crypto_box_keypair).
KeyPair make_key_pair();
// The X25519 public key of `secret_key` (crypto_scalarmult_base).
Key32 public_key_of(const Key32& secret_key);

// KDF(X25519(secret_key, peer_public_key)) = BLAKE2b-256 keyed with the raw
// X25519 output over (context, 0x00, info). Throws std::runtime_error when
// `peer_public_key` is a low-order point (the shared secret would be all zeros,
// known to everyone).
Key32 agree(const Key32& secret_key, const Key32& peer_public_key, std::string_view context,
            std::span<const uint8_t> info);
// BLAKE2b-256 keyed with `key` over `message`.
Key32 mac(const Key32& key, std::span<const uint8_t> message);
// Constant-time equality of two byte strings (false for unequal lengths, which
// are public).
bool equal_ct(std::span<const uint8_t> a, std::span<const uint8_t> b);

// Bytes crypto_box adds to a plaintext here: nonce (24) + Poly1305 tag (16).
inline constexpr size_t kBoxOverhead = 24 + 16;
// nonce || crypto_box_easy(plaintext, nonce, recipient_public_key, sender_secret_key),
// the nonce random. Throws std::runtime_error for a low-order recipient key.
std::vector<uint8_t> seal(const Key32& sender_secret_key, const Key32& recipient_public_key,
                          std::span<const uint8_t> plaintext);
// The plaintext of a box made by seal(sender, recipient, ...); nullopt when it
// does not open (wrong keys, tampered, truncated).
std::optional<std::vector<uint8_t>> open(const Key32& recipient_secret_key, const Key32& sender_public_key,
                                         std::span<const uint8_t> box);

// ---------------------------------------------------------------------------
// GF(2^8) with the AES polynomial x^8 + x^4 + x^3 + x + 1 (0x11b). Both are
// branch-free and table-free, so their time does not depend on the bytes of a
// secret (Shamir shares are secret).
uint8_t gf256_mul(uint8_t a, uint8_t b);
uint8_t gf256_inv(uint8_t a);  // a^254: the inverse of a != 0; 0 for 0

// One Shamir share of a byte string: the share polynomial of every byte
// evaluated at x (x != 0; the secret is the value at 0).
struct Share {
  uint8_t x = 0;
  std::vector<uint8_t> y;  // as long as the secret
  ~Share() { wipe(y.data(), y.size()); }
  Share() = default;
  Share(uint8_t x_, std::vector<uint8_t> y_) : x(x_), y(std::move(y_)) {}
  Share(const Share&) = default;
  Share(Share&&) = default;
  Share& operator=(const Share&) = default;
  Share& operator=(Share&&) = default;
};
// Splits `secret` into one share per x in `xs` (distinct, non-zero), any
// `threshold` of which reconstruct it and fewer of which say nothing about it:
// byte i of the secret is the constant term of a random polynomial of degree
// threshold - 1. Throws std::invalid_argument for threshold outside
// [1, xs.size()], a zero or repeated x, or an empty secret.
std::vector<Share> shamir_split(std::span<const uint8_t> secret, int threshold, std::span<const uint8_t> xs);
// The secret from the first `threshold` of `shares` (Lagrange interpolation at
// 0). Throws std::invalid_argument when fewer than `threshold` shares are given,
// threshold < 1, any two shares have the same x, an x is 0, or their lengths differ.
std::vector<uint8_t> shamir_combine(std::span<const Share> shares, int threshold);

// ---------------------------------------------------------------------------
// Masks. The mask of a 32-byte seed is the ChaCha20 (IETF) key stream under
// key = seed and a nonce fixed by the round (its 8 little-endian bytes, then 4
// zero bytes), read as little-endian uint64. The nonce can be fixed because no
// seed is ever used in two rounds: self-mask seeds are random per round and
// pairwise seeds come from key pairs made fresh for the round (and the round is
// in their KDF too), so (key, nonce) never repeats across rounds. Within a round
// one seed makes one mask, which its users must all see the same: that is how
// masks cancel.
enum class MaskSign { kAdd, kSubtract };
// values[i] += (or -=) mask(seed, round)[i] mod 2^64. Throws
// std::invalid_argument past 2^35 values (ChaCha20-IETF's 32-bit block counter).
void apply_mask(std::span<uint64_t> values, const Key32& seed, int64_t round, MaskSign sign);

// Fixed point in Z/2^64: round(value x 2^frac_bits) as int64, taken mod 2^64.
// Throws std::invalid_argument when value x 2^frac_bits is not finite or is at
// least 2^62 in magnitude (a single input that large leaves no room for a sum),
// or frac_bits is outside [0, 62].
uint64_t quantize(double value, int frac_bits);
// A sum in Z/2^64 read as a signed int64, divided by 2^frac_bits.
double dequantize(uint64_t value, int frac_bits);

// The 32 raw bytes of a Z85 CURVE key (40 characters, ZeroMQ RFC 32). Throws
// std::invalid_argument naming `what` for the wrong length, a character outside
// the Z85 alphabet, or a group above 2^32 - 1.
Key32 z85_decode_key(std::string_view z85, const std::string& what = "key");
// The 40-character Z85 text of a 32-byte key (as zmq_z85_encode writes it).
std::string z85_encode_key(const Key32& key);

// Little-endian appends, for the byte strings that MACs and KDFs cover.
void append_u32(std::vector<uint8_t>& out, uint32_t v);
void append_u64(std::vector<uint8_t>& out, uint64_t v);
uint32_t read_u32(std::span<const uint8_t> in, size_t at);
uint64_t read_u64(std::span<const uint8_t> in, size_t at);

}  // namespace cleave::secagg
