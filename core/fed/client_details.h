// client_details.h: what a federated client says about its data when it
// registers (the `details_json` of `register`, written by
// core/runtime/daemon/fed_client.cpp: {"fed_client": true, "samples": n,
// "shard": "i/N", "partition": ..., "dataset": ...}), read as untrusted input.
//
// Both coordinators that take data clients (`cleave fed`, `cleave split`)
// read it here, so a wrong type is one clear refusal everywhere:
// `"shard" must be a string like "1/3", got a number`.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace cleave {

struct FedClientDetails {
  bool fed_client = false;    // the daemon has data (a federated / split client)
  int64_t samples = 0;        // its shard's training samples: what its updates may count per local epoch
  std::string shard = "?";    // "i/N"
  std::string partition = "?";
  std::string dataset;
  // Which data jobs it takes ("fed_jobs" / "split_jobs", both by default): an
  // SDK app that joined as a federated client is never made a split client.
  bool fed_jobs = true;
  bool split_jobs = true;
};

// Reads `details` (an object, already parsed within kPeerJsonLimits; when
// that parse failed, `parse_error` says why and is thrown). A daemon without
// "fed_client": true is not a client (the other fields are not read). A
// client must say "samples" (an integer >= 0). Every field of the wrong type
// or form throws std::invalid_argument "registration details: \"KEY\" must
// be ..., got ...".
FedClientDetails read_fed_client_details(const nlohmann::json& details, const std::string& parse_error = "");

}  // namespace cleave
