// secagg_round.cpp: see secagg_round.h.
#include "core/runtime/common/secagg_round.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace cleave::secagg {

using transport::SecAggItem;
using transport::SecAggMsg;
using transport::SecAggPhase;
using transport::SecAggSetup;

namespace {

constexpr size_t kKeyBytes = 32;
// round(8) u(4) v(4) share of b_u(32) share of s_sk_u(32)
constexpr size_t kSharePlainBytes = 8 + 4 + 4 + 2 * kKeyBytes;
constexpr size_t kShareBoxBytes = kSharePlainBytes + kBoxOverhead;
constexpr uint8_t kSeedKind = 0, kMaskKeyKind = 1;  // kReveal: item.b
constexpr int kMaxClients = 255;                    // Shamir x in GF(2^8) \ {0}

std::string name_of(const SecAggSetup& setup, int index) {
  const std::string& name = setup.clients[static_cast<size_t>(index - 1)].name;
  return name.empty() ? "client " + std::to_string(index)
                      : "client '" + name + "' (index " + std::to_string(index) + ")";
}

// Validates the settings both sides share; returns the roster's static keys.
std::vector<Key32> validated_roster(int64_t round, const SecAggSetup& s) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("secure aggregation setup: " + what); };
  const int n = static_cast<int>(s.clients.size());
  if (round < 0) bad("negative round " + std::to_string(round));
  if (n < 2 || n > kMaxClients) bad(std::to_string(n) + " clients, not within [2, 255]");
  if (s.threshold < 2 || s.threshold > n)
    bad("threshold " + std::to_string(s.threshold) + " outside [2, " + std::to_string(n) + "] (the clients)");
  if (!(std::isfinite(s.range) && s.range > 0)) bad("range must be finite and > 0");
  if (s.frac_bits < 1 || s.frac_bits > 40) bad("frac_bits " + std::to_string(s.frac_bits) + " outside 1..40");
  if (!(std::isfinite(s.clip) && s.clip >= 0)) bad("clip must be finite and >= 0");
  if (!(std::isfinite(s.noise_stddev) && s.noise_stddev >= 0)) bad("noise_stddev must be finite and >= 0");
  std::vector<Key32> keys;
  for (int i = 1; i <= n; ++i) {
    keys.push_back(z85_decode_key(s.clients[static_cast<size_t>(i - 1)].public_key, name_of(s, i) + "'s key"));
    for (int j = 1; j < i; ++j)
      if (keys[static_cast<size_t>(j - 1)] == keys.back())
        bad(name_of(s, j) + " and " + name_of(s, i) + " have the same key");
  }
  return keys;
}

// What a client's MACs cover: its round keys, bound to the round and its index.
std::vector<uint8_t> keys_statement(int64_t round, int index, std::span<const uint8_t> cipher_pk,
                                    std::span<const uint8_t> mask_pk) {
  static constexpr std::string_view kContext = "cleave-secagg-keys v1";
  std::vector<uint8_t> out(kContext.begin(), kContext.end());
  out.push_back(0);
  append_u64(out, static_cast<uint64_t>(round));
  append_u32(out, static_cast<uint32_t>(index));
  out.insert(out.end(), cipher_pk.begin(), cipher_pk.end());
  out.insert(out.end(), mask_pk.begin(), mask_pk.end());
  return out;
}

Key32 mac_key(const SecretKey& static_sk, const Key32& peer_static_pk) {
  return agree(static_sk.bytes, peer_static_pk, "cleave-secagg-mac-key v1", {});
}

// s_uv: the same for (s_sk_u, s_pk_v, u, v) and (s_sk_v, s_pk_u, v, u).
SecretKey pairwise_seed(const Key32& mask_sk, const Key32& peer_mask_pk, int64_t round, int a, int b) {
  std::vector<uint8_t> info;
  append_u64(info, static_cast<uint64_t>(round));
  append_u32(info, static_cast<uint32_t>(std::min(a, b)));
  append_u32(info, static_cast<uint32_t>(std::max(a, b)));
  return SecretKey(agree(mask_sk, peer_mask_pk, "cleave-secagg-mask v1", info));
}

// The sign `owner` gives its mask with `peer` in y: + for a higher peer, - for a lower.
MaskSign pairwise_sign(int owner, int peer) { return peer > owner ? MaskSign::kAdd : MaskSign::kSubtract; }
MaskSign opposite(MaskSign s) { return s == MaskSign::kAdd ? MaskSign::kSubtract : MaskSign::kAdd; }

Key32 key_of(std::span<const uint8_t> bytes) {
  Key32 k{};
  std::copy(bytes.begin(), bytes.end(), k.begin());
  return k;
}

// Shamir-combines `shares` into a 32-byte secret, wiping the temporary.
SecretKey combine_key(const std::vector<Share>& shares, int threshold) {
  std::vector<uint8_t> bytes = shamir_combine(shares, threshold);
  SecretKey k(key_of(bytes));
  wipe(bytes.data(), bytes.size());
  return k;
}

bool has_duplicates(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return std::adjacent_find(v.begin(), v.end()) != v.end();
}

SecAggMsg empty_message(int64_t round, SecAggPhase phase) {
  SecAggMsg m;
  m.round = round;
  m.phase = phase;
  return m;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "none" : out;
}

}  // namespace

// ---------------------------------------------------------------------------
// ClientRound

ClientRound::ClientRound(int64_t round, SecAggSetup setup, std::array<uint8_t, 32> static_sk,
                         std::array<uint8_t, 32> static_pk)
    : round_(round), setup_(std::move(setup)) {
  const SecretKey sk(static_sk);
  wipe(static_sk.data(), static_sk.size());
  static_pks_ = validated_roster(round_, setup_);
  if (public_key_of(sk.bytes) != static_pk)
    throw std::invalid_argument("secure aggregation: the static secret key does not belong to the static public key");
  const auto it = std::find(static_pks_.begin(), static_pks_.end(), static_pk);
  if (it == static_pks_.end())
    throw std::invalid_argument("secure aggregation, round " + std::to_string(round_) +
                                ": this client's key is not in the round's roster");
  index_ = static_cast<int>(it - static_pks_.begin()) + 1;
  // The MAC keys now, so a bad roster key is refused before any message and
  // the static secret key need not outlive the constructor.
  mac_keys_.resize(static_pks_.size());
  for (size_t v = 0; v < static_pks_.size(); ++v) {
    if (static_cast<int>(v) + 1 == index_) continue;
    try {
      mac_keys_[v] = SecretKey(mac_key(sk, static_pks_[v]));
    } catch (const std::runtime_error&) {
      throw std::invalid_argument("secure aggregation setup: the key of " +
                                  name_of(setup_, static_cast<int>(v) + 1) + " is a low-order point");
    }
  }
}

void ClientRound::refuse(const std::string& what) const {
  throw std::runtime_error("secure aggregation, round " + std::to_string(round_) + ", " + name_of(setup_, index_) +
                           ": refused: " + what);
}

void ClientRound::expect(const SecAggMsg& m, SecAggPhase phase, Stage stage) const {
  if (m.phase != phase)
    refuse(std::string("expected a ") + transport::secagg_phase_name(phase) + " message, got " +
           transport::secagg_phase_name(m.phase));
  if (m.round != round_) refuse("a message of round " + std::to_string(m.round));
  if (stage_ != stage)
    refuse(std::string("a ") + transport::secagg_phase_name(phase) + " message out of order");
}

SecAggMsg ClientRound::keys() {
  if (stage_ != Stage::kStart) refuse("keys() called twice");
  cipher_ = make_key_pair();
  mask_ = make_key_pair();
  const std::vector<uint8_t> statement = keys_statement(round_, index_, cipher_.public_key, mask_.public_key);
  SecAggItem item;
  item.index = index_;
  item.a.assign(cipher_.public_key.begin(), cipher_.public_key.end());
  item.b.assign(mask_.public_key.begin(), mask_.public_key.end());
  item.mac.assign(static_pks_.size() * kKeyBytes, 0);  // own slot stays zero
  for (size_t v = 0; v < static_pks_.size(); ++v) {
    if (static_cast<int>(v) + 1 == index_) continue;
    const Key32 m = mac(mac_keys_[v].bytes, statement);
    std::copy(m.begin(), m.end(), item.mac.begin() + static_cast<std::ptrdiff_t>(v * kKeyBytes));
  }
  stage_ = Stage::kKeysSent;
  SecAggMsg out = empty_message(round_, SecAggPhase::kKeys);
  out.items.push_back(std::move(item));
  return out;
}

void ClientRound::accept_roster(const SecAggMsg& roster) {
  expect(roster, SecAggPhase::kRoster, Stage::kKeysSent);
  const int n = static_cast<int>(static_pks_.size());
  std::map<int, Peer> u1;  // kept only once the whole roster passes: a refusal spends nothing
  std::map<int, SecretKey> pairwise;
  for (const SecAggItem& it : roster.items) {
    if (it.index < 1 || it.index > n) refuse("a roster item for index " + std::to_string(it.index));
    const std::string who = name_of(setup_, it.index);
    if (u1.count(it.index)) refuse("the roster lists " + who + " twice");
    if (it.a.size() != kKeyBytes || it.b.size() != kKeyBytes || it.mac.size() != kKeyBytes)
      refuse("the roster's keys or MAC of " + who + " have the wrong size");
    u1[it.index] = Peer{key_of(it.a), key_of(it.b)};
    if (it.index == index_) {
      if (key_of(it.a) != cipher_.public_key || key_of(it.b) != mask_.public_key)
        refuse("the roster carries other keys than this client's own under its index");
      continue;
    }
    const Key32 expected =
        mac(mac_keys_[static_cast<size_t>(it.index - 1)].bytes, keys_statement(round_, it.index, it.a, it.b));
    if (!equal_ct(it.mac, expected))
      refuse("the keys of " + who + " fail their MAC check: they are not the keys that client made");
    try {  // s_uv now; a low-order point (no secret shared) fails here, naming its owner
      pairwise[it.index] = pairwise_seed(mask_.secret_key.bytes, key_of(it.b), round_, index_, it.index);
      (void)agree(cipher_.secret_key.bytes, key_of(it.a), "cleave-secagg-check v1", {});
    } catch (const std::runtime_error&) {
      refuse("the keys of " + who + " are low-order points");
    }
  }
  if (!u1.count(index_)) refuse("the roster leaves out this client's own keys");
  if (u1.size() < static_cast<size_t>(setup_.threshold))
    refuse("only " + std::to_string(u1.size()) + " clients sent keys, the threshold is " +
           std::to_string(setup_.threshold));
  u1_ = std::move(u1);
  pairwise_ = std::move(pairwise);
}

SecAggMsg ClientRound::shares(const SecAggMsg& roster) {
  accept_roster(roster);
  random_bytes(seed_.bytes.data(), seed_.bytes.size());
  std::vector<uint8_t> xs;
  for (const auto& [v, peer] : u1_) xs.push_back(static_cast<uint8_t>(v));
  const std::vector<Share> seed_shares = shamir_split(seed_.bytes, setup_.threshold, xs);
  const std::vector<Share> key_shares = shamir_split(mask_.secret_key.bytes, setup_.threshold, xs);
  SecAggMsg out = empty_message(round_, SecAggPhase::kShares);
  for (size_t i = 0; i < xs.size(); ++i) {
    const int v = xs[i];
    if (v == index_) {  // its own shares it keeps: it reveals them like anyone else's
      held_[v] = Held{seed_shares[i], key_shares[i]};
      continue;
    }
    std::vector<uint8_t> plain;
    append_u64(plain, static_cast<uint64_t>(round_));
    append_u32(plain, static_cast<uint32_t>(index_));
    append_u32(plain, static_cast<uint32_t>(v));
    plain.insert(plain.end(), seed_shares[i].y.begin(), seed_shares[i].y.end());
    plain.insert(plain.end(), key_shares[i].y.begin(), key_shares[i].y.end());
    SecAggItem item;
    item.index = v;
    item.a = seal(cipher_.secret_key.bytes, u1_.at(v).cipher_pk, plain);
    wipe(plain.data(), plain.size());
    out.items.push_back(std::move(item));
  }
  stage_ = Stage::kSharesSent;
  return out;
}

void ClientRound::accept_delivery(const SecAggMsg& delivery) {
  expect(delivery, SecAggPhase::kDelivery, Stage::kSharesSent);
  std::map<int, Held> got;  // merged only once every box opens: a refusal spends nothing
  for (const SecAggItem& it : delivery.items) {
    if (!u1_.count(it.index) || it.index == index_)
      refuse("a share box from index " + std::to_string(it.index) + ", which is not another client of the roster");
    const std::string who = name_of(setup_, it.index);
    if (got.count(it.index)) refuse("two share boxes from " + who);
    std::optional<std::vector<uint8_t>> plain = open(cipher_.secret_key.bytes, u1_.at(it.index).cipher_pk, it.a);
    if (!plain) refuse("the share box from " + who + " does not open (tampered, or not sealed by that client)");
    const bool fits = plain->size() == kSharePlainBytes && read_u64(*plain, 0) == static_cast<uint64_t>(round_) &&
                      read_u32(*plain, 8) == static_cast<uint32_t>(it.index) &&
                      read_u32(*plain, 12) == static_cast<uint32_t>(index_);
    if (!fits) {
      wipe(plain->data(), plain->size());
      refuse("the share box from " + who + " is not for this round, sender and recipient");
    }
    const auto x = static_cast<uint8_t>(index_);
    got[it.index] = Held{Share(x, std::vector<uint8_t>(plain->begin() + 16, plain->begin() + 48)),
                         Share(x, std::vector<uint8_t>(plain->begin() + 48, plain->end()))};
    wipe(plain->data(), plain->size());
  }
  if (got.size() + 1 < static_cast<size_t>(setup_.threshold))  // + 1: its own shares
    refuse("only " + std::to_string(got.size() + 1) + " clients shared their secrets, the threshold is " +
           std::to_string(setup_.threshold));
  held_.merge(got);
}

std::vector<uint64_t> ClientRound::fixed_point(std::span<const double> delta, int64_t sample_count,
                                               NoiseSource* noise) {
  if (sample_count < 0) throw std::invalid_argument("secure aggregation: negative sample_count");
  if (setup_.noise_stddev > 0 && noise == nullptr)
    throw std::invalid_argument("secure aggregation: the setup asks for noise and no noise source was given");
  const double w = setup_.weight_by_samples ? static_cast<double>(sample_count) : 1.0;
  const double range = setup_.range;
  if (w * range >= std::ldexp(1.0, 62 - setup_.frac_bits))
    throw std::invalid_argument("secure aggregation: weight " + std::to_string(w) + " x range " +
                                std::to_string(range) + " x 2^" + std::to_string(setup_.frac_bits) +
                                " does not fit in 62 bits");
  double squared = 0;
  for (double d : delta) {
    if (!std::isfinite(d)) throw std::invalid_argument("secure aggregation: the update is not finite");
    squared += d * d;
  }
  const double norm = std::sqrt(squared);
  const double scale = setup_.clip > 0 && norm > setup_.clip ? setup_.clip / norm : 1.0;
  std::vector<uint64_t> out(delta.size());
  clamped_ = 0;
  for (size_t i = 0; i < delta.size(); ++i) {
    double v = delta[i] * scale;
    if (setup_.noise_stddev > 0) v += setup_.noise_stddev * noise->normal();
    if (v < -range || v > range) ++clamped_;
    out[i] = quantize(w * std::clamp(v, -range, range), setup_.frac_bits);
  }
  return out;
}

transport::Message ClientRound::masked(const SecAggMsg& delivery, std::span<const double> delta, int64_t sample_count,
                                       NoiseSource* noise) {
  std::vector<uint64_t> y = fixed_point(delta, sample_count, noise);  // first: a caller's bad input spends no state
  accept_delivery(delivery);
  apply_mask(y, seed_.bytes, round_, MaskSign::kAdd);
  for (const auto& [v, held] : held_)
    if (v != index_) apply_mask(y, pairwise_.at(v).bytes, round_, pairwise_sign(index_, v));
  stage_ = Stage::kMaskedSent;
  return transport::make_secagg_masked_message(round_, sample_count, std::move(y));
}

void ClientRound::check_unmask(const SecAggMsg& unmask) const {
  if (stage_ == Stage::kRevealed)
    refuse("a second unmask request this round (answering two could hand the coordinator both secrets of one client)");
  expect(unmask, SecAggPhase::kUnmask, Stage::kMaskedSent);
  if (has_duplicates(unmask.survivors) || has_duplicates(unmask.dropped))
    refuse("the unmask request lists a client twice");
  std::set<int> all;
  for (int v : unmask.survivors) all.insert(v);
  for (int v : unmask.dropped) {
    if (all.count(v))
      refuse("the unmask request asks for both secrets of " +
             (v >= 1 && v <= static_cast<int>(static_pks_.size()) ? name_of(setup_, v) : std::to_string(v)));
    all.insert(v);
  }
  std::set<int> u2;
  for (const auto& [v, held] : held_) u2.insert(v);
  if (all != u2) refuse("the unmask request's survivors and dropped are not the clients that shared secrets");
  if (unmask.survivors.size() < static_cast<size_t>(setup_.threshold))
    refuse("only " + std::to_string(unmask.survivors.size()) + " survivors, the threshold is " +
           std::to_string(setup_.threshold));
  if (std::find(unmask.survivors.begin(), unmask.survivors.end(), index_) == unmask.survivors.end())
    refuse("the unmask request does not count this client among the survivors");
}

SecAggMsg ClientRound::reveal(const SecAggMsg& unmask) {
  check_unmask(unmask);
  stage_ = Stage::kRevealed;
  SecAggMsg out = empty_message(round_, SecAggPhase::kReveal);
  auto add = [&](int v, const Share& share, uint8_t kind) {
    SecAggItem item;
    item.index = v;
    item.a = share.y;
    item.b = {kind};
    out.items.push_back(std::move(item));
  };
  for (int v : unmask.survivors) add(v, held_.at(v).seed, kSeedKind);
  for (int v : unmask.dropped) add(v, held_.at(v).mask_key, kMaskKeyKind);
  return out;
}

// ---------------------------------------------------------------------------
// ServerRound

ServerRound::ServerRound(int64_t round, SecAggSetup setup, size_t num_elements)
    : round_(round), setup_(std::move(setup)), num_elements_(num_elements) {
  validated_roster(round_, setup_);
}

void ServerRound::refuse(SecAggPhase phase, int index, const std::string& what) const {
  const bool known = index >= 1 && index <= static_cast<int>(setup_.clients.size());
  throw std::invalid_argument("secure aggregation, round " + std::to_string(round_) + ": " +
                              transport::secagg_phase_name(phase) + " message of " +
                              (known ? name_of(setup_, index) : "index " + std::to_string(index)) + " refused: " + what);
}

void ServerRound::expect(int index, const SecAggMsg& m, SecAggPhase phase) const {
  auto bad = [&](const std::string& what) { refuse(phase, index, what); };
  if (index < 1 || index > static_cast<int>(setup_.clients.size())) bad("not a roster index");
  if (m.phase != phase) bad(std::string("the message is a ") + transport::secagg_phase_name(m.phase) + " message");
  if (m.round != round_) bad("the message is of round " + std::to_string(m.round));
  const bool late = (phase == SecAggPhase::kKeys && u1_closed_) || (phase == SecAggPhase::kShares && u2_closed_) ||
                    (phase == SecAggPhase::kMasked && u3_closed_);
  const bool early = (phase == SecAggPhase::kShares && !u1_closed_) ||
                     (phase == SecAggPhase::kMasked && !u2_closed_) || (phase == SecAggPhase::kReveal && !u3_closed_);
  if (late) bad("too late: the set it would join has been announced");
  if (early) bad("too early: the previous phase has not been announced");
}

void ServerRound::on_keys(int index, const SecAggMsg& m) {
  expect(index, m, SecAggPhase::kKeys);
  auto bad = [&](const std::string& what) { refuse(SecAggPhase::kKeys, index, what); };
  if (keys_.count(index)) bad("a second keys message");
  if (m.items.size() != 1 || m.items[0].index != index) bad("not one item of the sender's own index");
  const SecAggItem& it = m.items[0];
  if (it.a.size() != kKeyBytes || it.b.size() != kKeyBytes) bad("public keys are not 32 bytes");
  if (it.mac.size() != setup_.clients.size() * kKeyBytes)
    bad("not one 32-byte MAC per roster member (" + std::to_string(it.mac.size()) + " bytes)");
  keys_[index] = Keys{key_of(it.a), key_of(it.b), it.mac};
}

std::vector<int> ServerRound::key_senders() const {
  std::vector<int> out;
  for (const auto& [i, k] : keys_) out.push_back(i);
  return out;
}

std::vector<int> ServerRound::share_senders() const {
  std::vector<int> out;
  for (const auto& [i, b] : boxes_) out.push_back(i);
  return out;
}

std::string ServerRound::missing_names(const std::vector<int>& present) const {
  std::vector<std::string> names;
  for (int i = 1; i <= static_cast<int>(setup_.clients.size()); ++i)
    if (std::find(present.begin(), present.end(), i) == present.end()) names.push_back(name_of(setup_, i));
  return join(names);
}

void ServerRound::require_quorum(size_t have, const std::string& what, const std::vector<int>& present) const {
  if (have >= static_cast<size_t>(setup_.threshold)) return;
  throw std::runtime_error("secure aggregation, round " + std::to_string(round_) + ": only " + std::to_string(have) +
                           " of the t=" + std::to_string(setup_.threshold) + " " + what +
                           " needed arrived (clients that dropped: " + missing_names(present) +
                           "); the round is abandoned and the previous global model kept");
}

void ServerRound::announce(const std::vector<int>& members, const std::string& what, bool& closed) const {
  require_quorum(members.size(), what, members);
  closed = true;
}

SecAggMsg ServerRound::roster_for(int index) const {
  if (!keys_.count(index)) throw std::invalid_argument("secure aggregation: no roster for index " +
                                                       std::to_string(index) + ", which sent no keys");
  announce(key_senders(), "key sets", u1_closed_);
  SecAggMsg out = empty_message(round_, SecAggPhase::kRoster);
  const auto slot = static_cast<std::ptrdiff_t>(static_cast<size_t>(index - 1) * kKeyBytes);
  for (const auto& [u, k] : keys_) {
    SecAggItem item;
    item.index = u;
    item.a.assign(k.cipher_pk.begin(), k.cipher_pk.end());
    item.b.assign(k.mask_pk.begin(), k.mask_pk.end());
    item.mac.assign(k.macs.begin() + slot, k.macs.begin() + slot + static_cast<std::ptrdiff_t>(kKeyBytes));
    out.items.push_back(std::move(item));
  }
  return out;
}

void ServerRound::on_shares(int index, const SecAggMsg& m) {
  expect(index, m, SecAggPhase::kShares);
  auto bad = [&](const std::string& what) { refuse(SecAggPhase::kShares, index, what); };
  if (!keys_.count(index)) bad("it sent no keys");
  if (boxes_.count(index)) bad("a second shares message");
  std::map<int, std::vector<uint8_t>> boxes;
  for (const SecAggItem& it : m.items) {
    if (!keys_.count(it.index) || it.index == index)
      bad("a box for index " + std::to_string(it.index) + ", not another client that sent keys");
    if (boxes.count(it.index)) bad("two boxes for index " + std::to_string(it.index));
    if (it.a.size() != kShareBoxBytes || !it.b.empty() || !it.mac.empty())
      bad("a box of " + std::to_string(it.a.size()) + " bytes, not " + std::to_string(kShareBoxBytes));
    boxes[it.index] = it.a;
  }
  if (boxes.size() != keys_.size() - 1) bad("not one box for every other client that sent keys");
  boxes_[index] = std::move(boxes);
}

SecAggMsg ServerRound::delivery_for(int index) const {
  if (!boxes_.count(index)) throw std::invalid_argument("secure aggregation: no delivery for index " +
                                                        std::to_string(index) + ", which sent no shares");
  announce(share_senders(), "share sets", u2_closed_);
  SecAggMsg out = empty_message(round_, SecAggPhase::kDelivery);
  for (const auto& [u, boxes] : boxes_) {
    if (u == index) continue;
    SecAggItem item;
    item.index = u;
    item.a = boxes.at(index);
    out.items.push_back(std::move(item));
  }
  return out;
}

void ServerRound::on_masked(int index, const transport::Message& m) {
  const SecAggMsg* s = std::get_if<SecAggMsg>(&m.body);
  auto bad = [&](const std::string& what) { refuse(SecAggPhase::kMasked, index, what); };
  if (s == nullptr) bad("not a secure-aggregation message");
  expect(index, *s, SecAggPhase::kMasked);
  if (!boxes_.count(index)) bad("it shared no secrets");
  if (masked_.count(index)) bad("a second masked input");
  if (s->sample_count < 0) bad("negative sample_count");
  std::vector<uint64_t> values = transport::secagg_masked_values(m);
  const size_t expected = num_elements_ > 0 ? num_elements_
                          : masked_.empty() ? values.size()
                                            : masked_.begin()->second.values.size();
  if (values.size() != expected || values.empty())
    bad(std::to_string(values.size()) + " values, " + std::to_string(expected) + " expected");
  masked_[index] = Masked{s->sample_count, std::move(values)};
}

std::vector<int> ServerRound::dropped() const {
  std::vector<int> out;
  for (const auto& [u, b] : boxes_)
    if (!masked_.count(u)) out.push_back(u);
  return out;
}

SecAggMsg ServerRound::unmask() const {
  std::vector<int> survivors;
  for (const auto& [u, m] : masked_) survivors.push_back(u);
  announce(survivors, "masked inputs", u3_closed_);
  SecAggMsg out = empty_message(round_, SecAggPhase::kUnmask);
  out.survivors.assign(survivors.begin(), survivors.end());
  const std::vector<int> gone = dropped();
  out.dropped.assign(gone.begin(), gone.end());
  return out;
}

void ServerRound::on_reveal(int index, const SecAggMsg& m) {
  expect(index, m, SecAggPhase::kReveal);
  auto bad = [&](const std::string& what) { refuse(SecAggPhase::kReveal, index, what); };
  if (!masked_.count(index)) bad("it is not a survivor");
  if (std::find(revealers_.begin(), revealers_.end(), index) != revealers_.end()) bad("a second reveal");
  const std::vector<int> gone = dropped();
  if (m.items.size() != masked_.size() + gone.size()) bad("not one share per survivor and dropped client");
  std::set<int> seen;
  for (const SecAggItem& it : m.items) {
    if (!seen.insert(it.index).second) bad("two shares of index " + std::to_string(it.index));
    const bool survivor = masked_.count(it.index) > 0;
    const bool gone_one = std::find(gone.begin(), gone.end(), it.index) != gone.end();
    const std::vector<uint8_t> kind{survivor ? kSeedKind : kMaskKeyKind};
    if (!(survivor || gone_one) || it.b != kind || it.a.size() != kKeyBytes || !it.mac.empty())
      bad("the share of index " + std::to_string(it.index) +
          " is not a 32-byte share of its self-mask seed (survivor) or mask key (dropped)");
  }
  for (const SecAggItem& it : m.items) {
    auto& store = it.b[0] == kSeedKind ? seed_shares_ : mask_key_shares_;
    store[it.index].emplace_back(static_cast<uint8_t>(index), it.a);
  }
  revealers_.push_back(index);
}

ServerRound::Sum ServerRound::finish(size_t num_elements) const {
  require_quorum(revealers_.size(), "shares", revealers_);
  const std::vector<int> gone = dropped();
  std::vector<uint64_t> total(num_elements, 0);
  Sum sum;
  for (const auto& [u, m] : masked_) {
    if (m.values.size() != num_elements)
      throw std::invalid_argument("secure aggregation: " + std::to_string(num_elements) +
                                  " elements asked for, the masked inputs have " + std::to_string(m.values.size()));
    for (size_t i = 0; i < num_elements; ++i) total[i] += m.values[i];
    apply_mask(total, combine_key(seed_shares_.at(u), setup_.threshold).bytes, round_, MaskSign::kSubtract);
    sum.total_weight += setup_.weight_by_samples ? static_cast<double>(m.sample_count) : 1.0;
    sum.survivors.push_back(u);
  }
  for (int v : gone) {
    const SecretKey mask_sk = combine_key(mask_key_shares_.at(v), setup_.threshold);
    if (public_key_of(mask_sk.bytes) != keys_.at(v).mask_pk)
      throw std::runtime_error("secure aggregation, round " + std::to_string(round_) + ": the mask key of " +
                               name_of(setup_, v) + " rebuilt from its shares does not match its public key");
    for (const auto& [u, m] : masked_) {  // u's y holds +-PRG(s_uv): take it out again
      const SecretKey s = pairwise_seed(mask_sk.bytes, keys_.at(u).mask_pk, round_, v, u);
      apply_mask(total, s.bytes, round_, opposite(pairwise_sign(u, v)));
    }
  }
  sum.dropped = gone;
  sum.weighted_sum.resize(num_elements);
  for (size_t i = 0; i < num_elements; ++i) sum.weighted_sum[i] = dequantize(total[i], setup_.frac_bits);
  return sum;
}

ServerRound::Audit ServerRound::audit() const {
  Audit a;
  for (const auto& [v, shares] : seed_shares_) a.seed_shares[v] = static_cast<int>(shares.size());
  for (const auto& [v, shares] : mask_key_shares_) a.mask_key_shares[v] = static_cast<int>(shares.size());
  return a;
}

// ---------------------------------------------------------------------------

double quantization_bound(int frac_bits, int survivors, double total_weight) {
  return survivors * 0.5 * std::ldexp(1.0, -frac_bits) / total_weight;
}

std::string overflow_refusal(double range, int frac_bits, double max_total_weight) {
  const double largest = max_total_weight * range * std::ldexp(1.0, frac_bits);
  if (largest * 2 <= 0x1p63) return "";
  const int fits = static_cast<int>(std::floor(std::log2(0x1p62 / (max_total_weight * range))));
  std::string out = "secure aggregation: a sum of up to " + std::to_string(max_total_weight) + " (total weight) x " +
                    std::to_string(range) + " (range) x 2^" + std::to_string(frac_bits) +
                    " (frac_bits) does not fit in a signed 64-bit integer with a factor 2 to spare; ";
  if (fits >= 1) return out + "lower frac_bits to " + std::to_string(fits) + " or below, or lower the range";
  return out + "lower the range, or the total weight (fewer clients or samples per client, or weight 1 per client)";
}

}  // namespace cleave::secagg
