// services.cpp: see services.h.
#include "core/runtime/daemon/services.h"

#include <stdexcept>

#include "core/runtime/common/wire.h"
#include "core/runtime/daemon/layer_profile.h"
#include "transport/endpoint.h"

namespace cleave {

using namespace transport;

bool DaemonServices::handle(const Command& c, uint64_t rid) {
  if (const auto* p = std::get_if<ProfileCmd>(&c)) {
    profile(*p, rid);
    return true;
  }
  if (!std::holds_alternative<ProbeServeCmd>(c) && !std::holds_alternative<ProbePeerCmd>(c) &&
      !std::holds_alternative<ProbeStopCmd>(c))
    return false;
  try {
    ctx_.channel.send(ack_message(rid, probe(c)));
  } catch (const std::exception& e) {
    ctx_.channel.send(
        error_message(ErrorCode::kBadMessage, ctx_.options.name + " cannot probe the link: " + e.what(), rid));
  }
  return true;
}

// Planner input: measured per-layer time for the job's model.
void DaemonServices::profile(const ProfileCmd& c, uint64_t rid) {
  try {
    const ModelSpec spec = parse_model_text(c.model_spec_json, "profiled model");
    auto seconds = profile_layers(ctx_.device, spec, c.samples, c.split_backward, c.in_flight);
    nlohmann::json detail = {{"op", "profile"}, {"layer_seconds_per_sample", seconds}};
    if (c.optimizer) detail["update_seconds_per_param"] = profile_update(ctx_.device, from_wire(*c.optimizer));
    ctx_.channel.send(ack_message(rid, detail));
  } catch (const std::exception& e) {
    ctx_.channel.send(
        error_message(ErrorCode::kBadMessage, ctx_.options.name + " cannot profile the model: " + e.what(), rid));
  }
}

// Planner input: this daemon's links to the others (link_probe.h).
nlohmann::json DaemonServices::probe(const Command& c) {
  const DaemonOptions& opts = ctx_.options;
  if (opts.insecure) throw std::runtime_error("link probes need CURVE keys (the daemon runs --insecure)");
  if (const auto* s = std::get_if<ProbeServeCmd>(&c)) {
    auto server = std::make_unique<ProbeEchoServer>(opts.peer_bind, ctx_.keys, s->peer, s->peer_key,
                                                    opts.bandwidth_limit);
    nlohmann::json detail = {{"op", "probe_serve"}, {"peer", s->peer}, {"endpoint", server->endpoint()}};
    probe_servers_[s->peer] = std::move(server);
    return detail;
  }
  if (const auto* p = std::get_if<ProbePeerCmd>(&c)) {
    ClientOptions po;
    po.connect = p->endpoint;
    po.keys = ctx_.keys;
    po.server_public_key = p->peer_key;
    po.label = "cleaved " + opts.name + " link probe -> " + p->peer;
    const LinkMeasurement lm = probe_peer_link(po, opts.bandwidth_limit);
    return {{"op", "probe_peer"}, {"peer", p->peer}, {"latency_ms", lm.latency_ms},
            {"mbps_out", lm.mbps_out}, {"mbps_in", lm.mbps_in}};
  }
  const auto& stop = std::get<ProbeStopCmd>(c);
  probe_servers_.erase(stop.peer);
  return {{"op", "probe_stop"}, {"peer", stop.peer}};
}

}  // namespace cleave
