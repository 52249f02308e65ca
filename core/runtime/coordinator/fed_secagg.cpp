// fed_secagg.cpp: see fed_secagg.h.
#include "core/runtime/coordinator/fed_secagg.h"

#include <set>
#include <stdexcept>

#include "core/runtime/common/secagg_round.h"
#include "transport/log.h"

namespace cleave {

using namespace transport;
using Clock = std::chrono::steady_clock;

namespace {

class SecureRound {
 public:
  explicit SecureRound(const SecureRoundIo& io) : io_(io), server_(io.round, io.setup, io.num_elements) {
    for (size_t i = 0; i < io.sampled.size(); ++i) index_[io.sampled[i]] = static_cast<int>(i + 1);
  }

  SecureRoundResult run() {
    collect(SecAggPhase::kKeys, io_.sampled);
    const auto u1 = names(server_.key_senders());
    send_each(u1, [&](int i) { return server_.roster_for(i); });
    collect(SecAggPhase::kShares, u1);
    const auto u2 = names(server_.share_senders());
    if (io_.before_delivery) io_.before_delivery(io_.round, u2);
    send_each(u2, [&](int i) { return server_.delivery_for(i); });
    collect(SecAggPhase::kMasked, u2);
    const SecAggMsg unmask = server_.unmask();  // closes U3; throws with fewer than t
    const auto u3 = names(unmask.survivors);
    if (io_.before_unmask) io_.before_unmask(io_.round, u3);
    send_each(u3, [&](int) { return unmask; });
    collect(SecAggPhase::kReveal, u3);
    return result(server_.finish(io_.num_elements), unmask);
  }

 private:
  std::string round_of() const { return "secure aggregation, round " + std::to_string(io_.round + 1); }
  PoolPeer& peer(const std::string& name) { return io_.session.pool().at(name); }

  std::vector<std::string> names(const std::vector<int>& indices) const {
    std::vector<std::string> out;
    for (int i : indices) out.push_back(io_.sampled.at(static_cast<size_t>(i - 1)));
    return out;
  }

  template <typename Make>
  void send_each(const std::vector<std::string>& to, Make make) {
    for (const auto& name : to) {
      Message m = message_of(make(index_.at(name)), io_.request_id);
      if (Status s = io_.session.server().send(name, m); !s) {
        io_.session.pool().mark_dead(name, "is unreachable");
        miss(name, "unreachable: " + s.failure().message);
      }
    }
  }

  void miss(const std::string& name, const std::string& why) { missing_.emplace(name, why); }

  // Waits until every client of `expected` sent its `phase` message, dropped
  // out, failed, or the round's deadline passed.
  void collect(SecAggPhase phase, const std::vector<std::string>& expected) {
    const std::string what = std::string(secagg_phase_name(phase));
    for (;;) {
      bool pending = false;
      for (const auto& name : expected) {
        if (answered_[phase].count(name) || missing_.count(name)) continue;
        if (peer(name).dead) {
          miss(name, "dropped out before its " + what + " message (" + peer(name).dead_reason + ")");
          continue;
        }
        pending = true;
      }
      if (!pending) return;
      if (Clock::now() > io_.deadline) {
        for (const auto& name : expected)
          if (!answered_[phase].count(name)) miss(name, "no " + what + " message within --round-timeout");
        return;
      }
      if (auto got = io_.session.pool().receive(Millis(50))) handle(*got, phase);
    }
  }

  void refuse(const std::string& name, const std::string& reason, const std::string& why) {
    io_.session.pool().count_refused(reason);
    log(LogLevel::kWarning, "cleave fed: " + round_of() + ": refused a message from " + name + ": " + why);
  }

  void handle(const Received& got, SecAggPhase phase) {
    const std::string& name = got.peer;
    if (!index_.count(name)) return;  // not in this round: stale or unsolicited
    const Body& body = got.message.body;
    if (const auto* s = std::get_if<SecAggMsg>(&body)) {
      if (s->phase != phase || s->round != io_.round || answered_[phase].count(name) || missing_.count(name))
        return refuse(name, "secagg_out_of_phase", std::string("a ") + secagg_phase_name(s->phase) + " message of round " +
                                                       std::to_string(s->round + 1) + " while collecting " +
                                                       secagg_phase_name(phase));
      try {
        accept(name, got.message, *s);
        answered_[phase].insert(name);
      } catch (const std::invalid_argument& e) {
        refuse(name, "secagg_refused", e.what());
      }
    } else if (std::holds_alternative<WeightsMsg>(body)) {
      refuse(name, "weights_in_secure_round", "weights in the clear in a secure-aggregation round");
    } else if (const auto* mm = std::get_if<MetricsMsg>(&body)) {
      if (mm->step == io_.round) metrics_[name] = *mm;
    } else if (const auto* e = std::get_if<ErrorMsg>(&body)) {
      if (!missing_.count(name)) log(LogLevel::kWarning, "cleave fed: " + round_of() + ": client " + name + " reported: " + e->message);
      miss(name, "reported an error: " + e->message);
    }
  }

  void accept(const std::string& name, const Message& m, const SecAggMsg& s) {
    const int i = index_.at(name);
    switch (s.phase) {
      case SecAggPhase::kKeys: return server_.on_keys(i, s);
      case SecAggPhase::kShares: return server_.on_shares(i, s);
      case SecAggPhase::kMasked:
        if (const std::string why = io_.refuse_samples ? io_.refuse_samples(name, s.sample_count) : ""; !why.empty())
          throw std::invalid_argument(why);
        return server_.on_masked(i, m);
      case SecAggPhase::kReveal: return server_.on_reveal(i, s);
      default: throw std::invalid_argument(std::string("a client does not send ") + secagg_phase_name(s.phase) + " messages");
    }
  }

  nlohmann::json share_counts(const std::map<int, int>& by_index) const {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [i, k] : by_index) out[io_.sampled.at(static_cast<size_t>(i - 1))] = k;
    return out;
  }

  SecureRoundResult result(secagg::ServerRound::Sum sum, const SecAggMsg& unmask) {
    SecureRoundResult r;
    r.weighted_sum = std::move(sum.weighted_sum);
    r.total_weight = sum.total_weight;
    r.survivors = names(sum.survivors);
    for (const auto& name : io_.sampled) {
      if (std::find(r.survivors.begin(), r.survivors.end(), name) != r.survivors.end()) {
        if (auto it = metrics_.find(name); it != metrics_.end()) r.metrics[name] = it->second;
        if (!answered_[SecAggPhase::kReveal].count(name)) r.dropped_after_masking.push_back(name);
        continue;
      }
      auto it = missing_.find(name);
      r.dropped.push_back(name + ": " + (it != missing_.end() ? it->second : "its masked update was refused"));
    }
    const secagg::ServerRound::Audit audit = server_.audit();
    r.audit = {{"threshold", io_.setup.threshold},
               {"key_senders", names(server_.key_senders())},
               {"share_senders", names(server_.share_senders())},
               {"survivors", r.survivors},
               {"dropped_before_masking", names(unmask.dropped)},
               {"dropped_after_masking", r.dropped_after_masking},
               {"seed_shares", share_counts(audit.seed_shares)},
               {"mask_key_shares", share_counts(audit.mask_key_shares)},
               {"quantization_bound",
                secagg::quantization_bound(io_.setup.frac_bits, static_cast<int>(r.survivors.size()), r.total_weight)}};
    return r;
  }

  const SecureRoundIo& io_;
  secagg::ServerRound server_;
  std::map<std::string, int> index_;                            // roster index by name
  std::map<SecAggPhase, std::set<std::string>> answered_;       // who sent each phase's message
  std::map<std::string, std::string> missing_;                  // who left the round, and why (first reason)
  std::map<std::string, MetricsMsg> metrics_;
};

}  // namespace

SecureRoundResult run_secure_round(const SecureRoundIo& io) { return SecureRound(io).run(); }

}  // namespace cleave
