// test_secagg.cpp: secure aggregation's primitives (core/fed/secagg_crypto.h):
// GF(2^8) against a schoolbook reference and FIPS-197's worked examples;
// Shamir sharing reconstructs from every subset of at least t shares and from
// none smaller; masks cancel (self masks and the two sides of a pairwise mask);
// boxes refuse tampering, a wrong key, truncation; fixed point stays within
// half a step; Z85 and X25519 agree with ZeroMQ's CURVE test keys.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/fed/secagg_crypto.h"

using namespace cleave::secagg;
using Catch::Contains;

namespace {

// Carry-less multiplication then reduction by 0x11b, bit by bit: the slow,
// obviously right way.
uint8_t gf_reference(uint8_t a, uint8_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 8; ++i)
    if (b & (1u << i)) product ^= static_cast<uint32_t>(a) << i;
  for (int bit = 14; bit >= 8; --bit)
    if (product & (1u << bit)) product ^= 0x11bu << (bit - 8);
  return static_cast<uint8_t>(product);
}

std::vector<uint8_t> random_secret(size_t n) {
  std::vector<uint8_t> s(n);
  random_bytes(s.data(), s.size());
  return s;
}

// Every subset of {0, ..., n-1} as a bit mask.
std::vector<Share> pick(const std::vector<Share>& all, unsigned mask) {
  std::vector<Share> out;
  for (size_t i = 0; i < all.size(); ++i)
    if (mask & (1u << i)) out.push_back(all[i]);
  return out;
}

}  // namespace

TEST_CASE("secagg: GF(2^8) multiplication and inverses", "[fed][secagg]") {
  // FIPS-197 section 4.2: {57} x {83} = {c1}, {57} x {13} = {fe}.
  CHECK(gf256_mul(0x57, 0x83) == 0xc1);
  CHECK(gf256_mul(0x57, 0x13) == 0xfe);
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b)
      REQUIRE(gf256_mul(static_cast<uint8_t>(a), static_cast<uint8_t>(b)) ==
              gf_reference(static_cast<uint8_t>(a), static_cast<uint8_t>(b)));
  CHECK(gf256_inv(0) == 0);
  for (int a = 1; a < 256; ++a) REQUIRE(gf256_mul(static_cast<uint8_t>(a), gf256_inv(static_cast<uint8_t>(a))) == 1);
  // Distributivity over XOR (the field's addition), on a sample.
  for (int a = 0; a < 256; a += 7)
    for (int b = 0; b < 256; b += 5)
      for (int c = 0; c < 256; c += 11)
        REQUIRE(gf256_mul(static_cast<uint8_t>(a), static_cast<uint8_t>(b ^ c)) ==
                (gf256_mul(static_cast<uint8_t>(a), static_cast<uint8_t>(b)) ^
                 gf256_mul(static_cast<uint8_t>(a), static_cast<uint8_t>(c))));
}

TEST_CASE("secagg: Shamir reconstructs from every subset of t or more shares", "[fed][secagg]") {
  // Roster-like x's and arbitrary ones (the largest x, 255, included).
  const std::vector<std::vector<uint8_t>> xs_sets{{1, 2, 3, 4, 5}, {3, 7, 200, 255, 9}};
  for (const auto& xs : xs_sets) {
    for (size_t len : {size_t{1}, size_t{32}, size_t{33}}) {
      for (int t = 1; t <= 5; ++t) {
        const std::vector<uint8_t> secret = random_secret(len);
        const std::vector<Share> shares = shamir_split(secret, t, xs);
        REQUIRE(shares.size() == 5);
        for (unsigned mask = 1; mask < 32; ++mask) {
          const std::vector<Share> subset = pick(shares, mask);
          if (subset.size() >= static_cast<size_t>(t)) {
            REQUIRE(shamir_combine(subset, t) == secret);
          } else {
            REQUIRE_THROWS_WITH(shamir_combine(subset, t), Contains("needed"));
          }
        }
      }
    }
  }
}

TEST_CASE("secagg: fewer than t shares say nothing of the secret", "[fed][secagg]") {
  const std::vector<uint8_t> xs{1, 2, 3, 4, 5};
  const std::vector<uint8_t> secret = random_secret(32);
  const std::vector<Share> shares = shamir_split(secret, 3, xs);
  // Interpolating t - 1 shares as if they were enough gives another value
  // (equal with probability 2^-256).
  for (unsigned mask = 1; mask < 32; ++mask) {
    const std::vector<Share> subset = pick(shares, mask);
    if (subset.size() != 2) continue;
    CHECK(shamir_combine(subset, 2) != secret);
  }
  // One share of a fixed byte at t = 2 is uniform: y = s + a x with a uniform.
  // 25600 splits, 100 expected per value; every value is seen, none > 3x expected.
  std::map<int, int> counts;
  const std::vector<uint8_t> zero{0};
  const std::vector<uint8_t> x1{1, 2};
  for (int i = 0; i < 25600; ++i) counts[shamir_split(zero, 2, x1)[0].y[0]]++;
  CHECK(counts.size() == 256);
  for (const auto& [value, count] : counts) CHECK(count < 300);
}

TEST_CASE("secagg: Shamir refuses malformed shares and settings", "[fed][secagg]") {
  const std::vector<uint8_t> secret = random_secret(8);
  const std::vector<uint8_t> xs{1, 2, 3};
  std::vector<Share> shares = shamir_split(secret, 2, xs);
  std::vector<Share> dup{shares[0], shares[0]};
  CHECK_THROWS_WITH(shamir_combine(dup, 2), Contains("appears twice"));
  std::vector<Share> zero{shares[0], shares[1]};
  zero[1].x = 0;
  CHECK_THROWS_WITH(shamir_combine(zero, 2), Contains("x = 0"));
  std::vector<Share> uneven{shares[0], shares[1]};
  uneven[1].y.pop_back();
  CHECK_THROWS_WITH(shamir_combine(uneven, 2), Contains("different lengths"));
  CHECK_THROWS_WITH(shamir_combine(shares, 0), Contains("below 1"));
  CHECK_THROWS(shamir_split(secret, 4, xs));
  CHECK_THROWS(shamir_split(secret, 0, xs));
  CHECK_THROWS(shamir_split({}, 2, xs));
  const std::vector<uint8_t> bad_xs{1, 0, 3}, twice{1, 3, 3};
  CHECK_THROWS_WITH(shamir_split(secret, 2, bad_xs), Contains("x = 0"));
  CHECK_THROWS_WITH(shamir_split(secret, 2, twice), Contains("appears twice"));
}

TEST_CASE("secagg: masks cancel and depend on seed and round", "[fed][secagg]") {
  // 1000 values: one whole 512-word chunk of key stream and a partial one.
  std::vector<uint64_t> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = i * 0x9e3779b97f4a7c15ull;
  const std::vector<uint64_t> original = values;
  Key32 a{}, b{};
  random_bytes(a.data(), a.size());
  random_bytes(b.data(), b.size());
  apply_mask(values, a, 3, MaskSign::kAdd);
  CHECK(values != original);
  apply_mask(values, b, 3, MaskSign::kAdd);
  apply_mask(values, a, 3, MaskSign::kSubtract);
  apply_mask(values, b, 3, MaskSign::kSubtract);
  CHECK(values == original);

  // The mask of a prefix is the prefix of the mask (chunking is invisible).
  std::vector<uint64_t> long_mask(1000, 0), short_mask(600, 0), other_round(600, 0);
  apply_mask(long_mask, a, 3, MaskSign::kAdd);
  apply_mask(short_mask, a, 3, MaskSign::kAdd);
  apply_mask(other_round, a, 4, MaskSign::kAdd);
  CHECK(std::equal(short_mask.begin(), short_mask.end(), long_mask.begin()));
  CHECK(short_mask != other_round);

  // A pairwise mask: u adds the seed it agrees with v, v subtracts the same seed.
  const KeyPair u = make_key_pair(), v = make_key_pair();
  const std::vector<uint8_t> info{1, 2};
  const Key32 s_uv = agree(u.secret_key.bytes, v.public_key, "test-mask", info);
  const Key32 s_vu = agree(v.secret_key.bytes, u.public_key, "test-mask", info);
  CHECK(s_uv == s_vu);
  std::vector<uint64_t> x_u(77, 5), x_v(77, 9);
  apply_mask(x_u, s_uv, 1, MaskSign::kAdd);
  apply_mask(x_v, s_vu, 1, MaskSign::kSubtract);
  for (size_t i = 0; i < x_u.size(); ++i) REQUIRE(x_u[i] + x_v[i] == 14);
}

TEST_CASE("secagg: key agreement separates contexts and refuses low-order keys", "[fed][secagg]") {
  const KeyPair u = make_key_pair(), v = make_key_pair();
  const std::vector<uint8_t> i1{1}, i2{2};
  CHECK(agree(u.secret_key.bytes, v.public_key, "a", i1) != agree(u.secret_key.bytes, v.public_key, "b", i1));
  CHECK(agree(u.secret_key.bytes, v.public_key, "a", i1) != agree(u.secret_key.bytes, v.public_key, "a", i2));
  CHECK(public_key_of(u.secret_key.bytes) == u.public_key);
  const Key32 low_order{};  // the all-zero point
  CHECK_THROWS_WITH(agree(u.secret_key.bytes, low_order, "a", i1), Contains("low-order"));
  const Key32 k = agree(u.secret_key.bytes, v.public_key, "mac", i1);
  const std::vector<uint8_t> msg{1, 2, 3};
  Key32 m = mac(k, msg);
  CHECK(equal_ct(m, mac(k, msg)));
  m[31] ^= 1;
  CHECK_FALSE(equal_ct(m, mac(k, msg)));
  CHECK_FALSE(equal_ct(std::span<const uint8_t>(m.data(), 31), mac(k, msg)));
}

TEST_CASE("secagg: sealed boxes open only untampered, for the right keys", "[fed][secagg]") {
  const KeyPair u = make_key_pair(), v = make_key_pair(), w = make_key_pair();
  const std::vector<uint8_t> plain = random_secret(80);
  const std::vector<uint8_t> box = seal(u.secret_key.bytes, v.public_key, plain);
  REQUIRE(box.size() == plain.size() + kBoxOverhead);
  auto opened = open(v.secret_key.bytes, u.public_key, box);
  REQUIRE(opened);
  CHECK(*opened == plain);
  CHECK(seal(u.secret_key.bytes, v.public_key, plain) != box);  // fresh random nonce
  for (size_t i = 0; i < box.size(); ++i) {  // every byte: nonce, tag, ciphertext
    std::vector<uint8_t> bad = box;
    bad[i] ^= 0x40;
    REQUIRE_FALSE(open(v.secret_key.bytes, u.public_key, bad));
  }
  CHECK_FALSE(open(w.secret_key.bytes, u.public_key, box));  // not the recipient
  CHECK_FALSE(open(v.secret_key.bytes, w.public_key, box));  // not the sender
  CHECK_FALSE(open(v.secret_key.bytes, u.public_key, std::span<const uint8_t>(box.data(), box.size() - 1)));
  CHECK_FALSE(open(v.secret_key.bytes, u.public_key, std::span<const uint8_t>(box.data(), 10)));
}

TEST_CASE("secagg: fixed point stays within half a step and wraps negatives", "[fed][secagg]") {
  for (int f : {1, 8, 16, 24, 40}) {
    const double step = std::ldexp(1.0, -f);
    for (double x : {0.0, 1.0, -1.0, 0.3, -0.7, 123.456, -1e-9, 3.0e3}) {
      REQUIRE(std::fabs(dequantize(quantize(x, f), f) - x) <= 0.5 * step);
    }
  }
  // A sum in the ring reads back as the signed sum.
  const uint64_t s = quantize(-2.5, 16) + quantize(1.25, 16) + quantize(-0.5, 16);
  CHECK(dequantize(s, 16) == -1.75);
  CHECK_THROWS(quantize(std::nan(""), 16));
  CHECK_THROWS(quantize(std::ldexp(1.0, 30), 32));  // 2^62
  CHECK_NOTHROW(quantize(std::ldexp(1.0, 29), 32));
  CHECK_THROWS(quantize(1.0, 63));
}

TEST_CASE("secagg: Z85 CURVE keys decode as ZeroMQ's and X25519 matches CURVE", "[fed][secagg]") {
  // zmq_curve(7)'s test keys: the server's secret and public key.
  const Key32 secret = z85_decode_key("JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6");
  const Key32 pub = z85_decode_key("rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
  CHECK(public_key_of(secret) == pub);
  // zmq_z85_decode's bytes of that public key.
  CHECK(pub[0] == 0x54);
  CHECK(pub[1] == 0xfc);
  CHECK(pub[31] == 0x52);
  CHECK(z85_encode_key(pub) == "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
  const KeyPair fresh = make_key_pair();
  CHECK(z85_decode_key(z85_encode_key(fresh.public_key)) == fresh.public_key);
  CHECK_THROWS_WITH(z85_decode_key("short", "client a"), Contains("client a: a Z85 CURVE key has 40"));
  CHECK_THROWS_WITH(z85_decode_key("rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf~"), Contains("not a Z85 character"));
  CHECK_THROWS_WITH(z85_decode_key("#####rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H"), Contains("above 2^32"));
}
