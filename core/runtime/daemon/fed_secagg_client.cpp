// fed_secagg_client.cpp: see fed_secagg_client.h.
#include "core/runtime/daemon/fed_secagg_client.h"

#include <optional>
#include <stdexcept>

#include "core/runtime/common/secagg_round.h"
#include "transport/log.h"

namespace cleave {

using namespace transport;

namespace {

// The coordinator's message of `phase` for `round`, or nothing when the job
// must give up first (`why` says why).
std::optional<SecAggMsg> await_phase(const JobServing& job, int64_t round, SecAggPhase phase, std::string& why) {
  for (;;) {
    if (auto m = job.channel.take_secagg(round, phase)) return std::get<SecAggMsg>(m->body);
    why = job_interruption(job);
    if (!why.empty()) return std::nullopt;
    job.channel.poll(Millis(50));
  }
}

Message with_id(Message m, uint64_t rid) {
  m.request_id = rid;
  return m;
}

}  // namespace

std::string run_secure_upload(const JobServing& job, const KeyPair& keys, const FedRoundCmd& cmd,
                              std::span<const double> delta, int64_t samples, uint64_t rid, NoiseSource* noise) {
  if (!cmd.secagg) throw std::invalid_argument("run_secure_upload: the round has no secure-aggregation setup");
  if (keys.secret_key.empty())
    throw std::runtime_error("secure aggregation needs this daemon's CURVE key (it runs without --insecure)");
  const int64_t r = cmd.round;
  const std::string round_of = "secure aggregation, round " + std::to_string(r + 1);
  secagg::ClientRound client(r, *cmd.secagg, secagg::z85_decode_key(keys.secret_key, "this daemon's secret key"),
                             secagg::z85_decode_key(keys.public_key, "this daemon's public key"));
  std::string why;
  try {
    job.channel.send(with_id(message_of(client.keys()), rid));
    auto roster = await_phase(job, r, SecAggPhase::kRoster, why);
    if (!roster) return why;
    job.channel.send(with_id(message_of(client.shares(*roster)), rid));
    auto delivery = await_phase(job, r, SecAggPhase::kDelivery, why);
    if (!delivery) return why;
    job.channel.send(with_id(client.masked(*delivery, delta, samples, noise), rid));
    if (client.clamped() > 0)
      log(LogLevel::kWarning, "cleaved " + job.name + ": " + round_of + ": " + std::to_string(client.clamped()) +
                                  " coordinate(s) of the update clamped to the secure-aggregation range");
    auto unmask = await_phase(job, r, SecAggPhase::kUnmask, why);
    if (!unmask) return why;
    job.channel.send(with_id(message_of(client.reveal(*unmask)), rid));
  } catch (const std::runtime_error& e) {  // the coordinator sent what the protocol refuses
    log(LogLevel::kWarning, "cleaved " + job.name + ": " + e.what());
    job.channel.send(error_message(ErrorCode::kRefused, job.name + ": " + e.what(), rid));
    return e.what();
  }
  return "";
}

}  // namespace cleave
