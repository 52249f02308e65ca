// fed_secagg_client.h: a federated client's side of a secure-aggregation
// round (issue 18; protocol in core/runtime/common/secagg_round.h and
// docs/privacy.md). After local training the client does not send its
// weights: it runs the round's exchange with the coordinator (keys, shares,
// masked update, reveal), waiting for each of the coordinator's phases on its
// job channel, so the coordinator only ever learns the sum of the round's
// updates.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/fed/dp.h"
#include "core/runtime/daemon/job_channel.h"
#include "transport/keys.h"
#include "transport/message.h"

namespace cleave {

// Runs round `cmd.round`'s exchange (cmd.secagg must be set) for an update
// `delta` (the local model minus the round's global block) trained on
// `samples` samples; every message goes out with request id `rid`. `keys`:
// this daemon's CURVE key pair, which binds its round keys to its identity.
// Returns "" when the exchange finished (its reveal went out), else why it
// stopped: the job was interrupted (job_interruption), or the coordinator
// sent something the protocol refuses (the reason is also sent back as an
// error, and nothing more of this round leaves the client).
std::string run_secure_upload(const JobServing& job, const transport::KeyPair& keys,
                              const transport::FedRoundCmd& cmd, std::span<const double> delta, int64_t samples,
                              uint64_t rid, NoiseSource* noise);

}  // namespace cleave
