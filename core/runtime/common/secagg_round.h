// secagg_round.h: the two sides of one secure-aggregation round (Bonawitz et
// al. 2017, semi-honest server with dropouts; issue 18, docs/privacy.md): a
// ClientRound on each sampled client, a ServerRound on the coordinator. Both
// are transport-free state machines over the SecAgg* structs of
// transport/message.h (whose comment says what each phase's items hold); the
// federated runtime moves the messages between them.
//
// Round r, roster of n clients (index = 1-based roster position = Shamir x),
// threshold t. Client u:
//   kKeys    fresh X25519 pairs (c_u: boxes, s_u: masks); one MAC per roster
//            member v over (c_pk, s_pk) under k_uv, a key agreed between the
//            static CURVE keys of u and v, so the coordinator cannot swap in
//            keys of its own without failing v's check;
//   kShares  after checking every MAC of the roster U1 (|U1| >= t): a random
//            self-mask seed b_u; b_u and s_sk_u Shamir-split at the indices
//            of U1, threshold t; each other v in U1 gets its two shares in a
//            crypto_box from c_sk_u to c_pk_v;
//   kMasked  after opening the boxes of U2 (senders whose boxes arrived, u
//            itself included): y = quantize(w x clamp(update)) + PRG(b_u)
//            + sum_{v in U2, v > u} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv);
//   kReveal  for survivors U3 (masked input arrived) and dropped U2 \ U3: its
//            share of b_v for each v in U3, of s_sk_v for each v in dropped,
//            never both for one v and only once per round.
// The coordinator adds the y of U3, removes PRG(b_v) for v in U3 and each
// dropped v's pairwise masks with U3, and learns only the weighted sum.
//
// Exact byte layouts (what the MACs, KDFs and boxes cover; integers little-endian):
//   MAC key    k_uv = BLAKE2b-256 keyed with X25519(static_sk_u, static_pk_v)
//              over "cleave-secagg-mac-key v1" 0x00 (k_uv = k_vu);
//   MAC        BLAKE2b-256 keyed with k_uv over "cleave-secagg-keys v1" 0x00
//              round(u64) u(u32) c_pk_u(32) s_pk_u(32);
//   s_uv       BLAKE2b-256 keyed with X25519(s_sk_u, s_pk_v) over
//              "cleave-secagg-mask v1" 0x00 round(u64) min(u,v)(u32) max(u,v)(u32);
//   share box  nonce(24) || crypto_box_easy(c_sk_u -> c_pk_v) of round(u64)
//              u(u32) v(u32) share_of_b_u(32) share_of_s_sk_u(32) (120 bytes);
//   PRG        ChaCha20-IETF key stream of a seed (secagg_crypto.h: apply_mask).
//
// Errors. A ClientRound refuses a message that does not belong (wrong phase,
// round, index, size, a MAC or box that fails, a second unmask) by throwing
// std::runtime_error naming the round, itself and what is wrong; it sends
// nothing for that phase. A ServerRound refuses a client's message with
// std::invalid_argument (the caller counts it as refused and serves on); the
// round itself fails with std::runtime_error when fewer than t clients remain.
// Constructors throw std::invalid_argument for a bad setup.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/fed/dp.h"
#include "core/fed/secagg_crypto.h"
#include "transport/message.h"

namespace cleave::secagg {

class ClientRound {  // one round on one client
 public:
  // throws std::invalid_argument if own static pk is not in setup.clients (or
  // does not belong to static_sk), a roster key is not a valid Z85 CURVE key or
  // appears twice, n is outside [2, 255], t outside [2, n], range <= 0,
  // frac_bits outside 1..40, clip or noise_stddev negative, round < 0.
  ClientRound(int64_t round, transport::SecAggSetup setup, std::array<uint8_t, 32> static_sk,
              std::array<uint8_t, 32> static_pk);
  ClientRound(const ClientRound&) = delete;  // holds secrets: no stray copies
  ClientRound& operator=(const ClientRound&) = delete;
  ClientRound(ClientRound&&) = default;
  ClientRound& operator=(ClientRound&&) = default;

  int index() const { return index_; }
  // kKeys: makes the round's key pairs. Once per round.
  transport::SecAggMsg keys();
  // kRoster in, kShares out.
  transport::SecAggMsg shares(const transport::SecAggMsg& roster);
  // kDelivery in. delta: the local model minus the round's global block (P
  // coordinates); noise: required when setup.noise_stddev > 0. Returns the
  // kMasked message (with its payload). Throws std::invalid_argument for a
  // non-finite delta, a negative sample_count, a missing noise source or a
  // weight x range x 2^frac_bits of 2^62 or more.
  transport::Message masked(const transport::SecAggMsg& delivery, std::span<const double> delta,
                            int64_t sample_count, NoiseSource* noise);
  int64_t clamped() const { return clamped_; }  // coordinates clamped to [-range, range] in masked()
  // kUnmask in, kReveal out. Refuses (std::runtime_error) survivors and dropped
  // that overlap, repeat, are not exactly its U2 between them, leave fewer than
  // t survivors or leave this client out; and any second unmask of the round.
  transport::SecAggMsg reveal(const transport::SecAggMsg& unmask);

 private:
  enum class Stage { kStart, kKeysSent, kSharesSent, kMaskedSent, kRevealed };
  struct Peer {  // a client of U1 as the roster announced it
    Key32 cipher_pk{}, mask_pk{};
  };
  struct Held {  // the shares of one client's secrets this client holds (x = own index)
    Share seed, mask_key;
  };

  [[noreturn]] void refuse(const std::string& what) const;
  void expect(const transport::SecAggMsg& m, transport::SecAggPhase phase, Stage stage) const;
  void accept_roster(const transport::SecAggMsg& roster);
  void accept_delivery(const transport::SecAggMsg& delivery);
  std::vector<uint64_t> fixed_point(std::span<const double> delta, int64_t sample_count, NoiseSource* noise);
  void check_unmask(const transport::SecAggMsg& unmask) const;

  int64_t round_ = 0;
  transport::SecAggSetup setup_;
  std::vector<Key32> static_pks_;   // roster order
  std::vector<SecretKey> mac_keys_;  // k_uv per roster member v (own slot zero); the static secret is not kept
  int index_ = 0;
  Stage stage_ = Stage::kStart;
  KeyPair cipher_, mask_;
  SecretKey seed_;             // b_u
  std::map<int, Peer> u1_;     // roster index -> keys (self included)
  std::map<int, SecretKey> pairwise_;  // s_uv for every other v in U1
  std::map<int, Held> held_;   // U2: senders whose shares this client holds (self included)
  int64_t clamped_ = 0;
};

class ServerRound {  // one round on the coordinator
 public:
  // num_elements: the coordinates every masked input must have (the global
  // block's size); 0: the first accepted masked input fixes it.
  // Throws std::invalid_argument for a bad setup (as ClientRound).
  ServerRound(int64_t round, transport::SecAggSetup setup, size_t num_elements = 0);

  // Each on_* takes the sender's roster index (the coordinator maps the
  // authenticated sender to it) and throws std::invalid_argument naming what is
  // wrong for a message that does not belong (wrong phase, round, index, sizes,
  // duplicate, too late); the caller counts it as refused.
  void on_keys(int index, const transport::SecAggMsg& m);
  std::vector<int> key_senders() const;  // U1
  // The first call closes U1 (later keys are refused). Throws
  // std::invalid_argument for an index not in U1, std::runtime_error when
  // |U1| < t (the round cannot complete).
  transport::SecAggMsg roster_for(int index) const;
  void on_shares(int index, const transport::SecAggMsg& m);
  std::vector<int> share_senders() const;  // U2
  // The first call closes U2; throws as roster_for.
  transport::SecAggMsg delivery_for(int index) const;
  void on_masked(int index, const transport::Message& m);  // m.body holds a kMasked SecAggMsg
  // survivors U3 / dropped U2 \ U3. The first call closes U3; throws
  // std::runtime_error when |U3| < t.
  transport::SecAggMsg unmask() const;
  void on_reveal(int index, const transport::SecAggMsg& m);

  struct Sum {
    std::vector<double> weighted_sum;  // sum over survivors of w x clamp(update), dequantized
    double total_weight = 0;           // sum over survivors of w (sample_count, or 1)
    std::vector<int> survivors, dropped;
  };
  // Throws std::runtime_error "secure aggregation, round R: only k of the t=T
  // shares needed arrived (clients that dropped: ...); the round is abandoned
  // and the previous global model kept" with fewer than t reveals, or when a
  // reconstructed mask key does not match the public key its owner sent;
  // std::invalid_argument when num_elements differs from the masked inputs'.
  Sum finish(size_t num_elements) const;

  // What the coordinator saw, for the audit: per client index, which secret
  // kinds of it it holds shares of and from how many clients.
  struct Audit {
    std::map<int, int> seed_shares, mask_key_shares;
  };
  Audit audit() const;

 private:
  struct Keys {
    Key32 cipher_pk{}, mask_pk{};
    std::vector<uint8_t> macs;  // n x 32, roster order
  };
  struct Masked {
    int64_t sample_count = 0;
    std::vector<uint64_t> values;
  };

  [[noreturn]] void refuse(transport::SecAggPhase phase, int index, const std::string& what) const;
  void expect(int index, const transport::SecAggMsg& m, transport::SecAggPhase phase) const;
  void require_quorum(size_t have, const std::string& what, const std::vector<int>& present) const;
  // Tells the first client who is in a set: checks the quorum, then closes the set.
  void announce(const std::vector<int>& members, const std::string& what, bool& closed) const;
  std::string missing_names(const std::vector<int>& present) const;
  std::vector<int> dropped() const;

  int64_t round_ = 0;
  transport::SecAggSetup setup_;
  size_t num_elements_ = 0;
  std::map<int, Keys> keys_;                                  // U1
  std::map<int, std::map<int, std::vector<uint8_t>>> boxes_;  // U2: sender -> recipient -> box
  std::map<int, Masked> masked_;                              // U3
  std::vector<int> revealers_;
  std::map<int, std::vector<Share>> seed_shares_, mask_key_shares_;  // owner -> shares (x = revealer)
  // Once the coordinator has told any client who is in U1 / U2 / U3, that set
  // may not change, or the coordinator's sum would not match what the clients
  // masked and revealed: the const calls that tell close them.
  mutable bool u1_closed_ = false, u2_closed_ = false, u3_closed_ = false;
};

// The bound on |secure sum / total weight - plain weighted mean| per coordinate
// from quantization alone (no clamping): survivors * 0.5 * 2^-frac_bits / total_weight.
double quantization_bound(int frac_bits, int survivors, double total_weight);
// "" when sums of up to `max_total_weight` x range x 2^frac_bits fit in int64
// with a factor 2 to spare, else a message saying which setting to lower (and
// the largest frac_bits that would fit).
std::string overflow_refusal(double range, int frac_bits, double max_total_weight);

}  // namespace cleave::secagg
