// session.cpp: see session.h.
#include "core/runtime/coordinator/session.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "core/io/untrusted_json.h"
#include "core/planner/profile.h"
#include "core/runtime/coordinator/session_monitor.h"
#include "transport/keys.h"
#include "transport/log.h"

namespace cleave {

using namespace transport;
using Clock = std::chrono::steady_clock;

size_t job_payload_cap(const ModelSpec& spec, const std::string& optimizer_kind, double momentum, int64_t batch) {
  const ModelProfile profile = profile_model(spec, optimizer_kind, momentum);
  int64_t state = 0, widest = profile.input_bytes_per_sample;
  for (const LayerProfile& l : profile.layers) {
    state += l.param_bytes + l.optimizer_state_bytes;
    widest = std::max(widest, l.out_act_bytes);
  }
  const int64_t tensor = std::max<int64_t>(batch, 1) * widest;
  return static_cast<size_t>(std::max(state, tensor));
}

Session::Session(SessionOptions options) : options_(std::move(options)) {
  ServerOptions so;
  so.bind = options_.listen;
  so.insecure = options_.insecure;
  so.label = options_.who == "cleave" ? "cleave coordinator" : options_.who;
  so.tuning.limits = payload_limits(options_.max_payload_bytes ? options_.max_payload_bytes
                                                                 : kDefaultCoordinatorPayloadBytes);
  if (!options_.insecure) {
    so.keys = load_secret_key(options_.key_path);
    so.allow = AllowList::load(options_.allow_path);
    so.allow_path = options_.allow_path;  // watched: revocation without a restart
  }
  server_ = std::make_unique<ServerEndpoint>(so);
  pool_ = std::make_unique<PeerPool>(*server_, options_.who, options_.peer_timeout_ms, options_.interrupted);
  if (auto installed = installed_coordinator_monitor()) {
    metrics_ = std::make_unique<SessionMetrics>(std::move(installed), options_.who);
    pool_->observer = [this](const Received* got) {
      metrics_->observe(got);
      metrics_->publish(*server_, *pool_);
    };
  }
  if (options_.on_listening) options_.on_listening(server_->endpoint());
}

Session::~Session() {
  if (metrics_) metrics_->publish(*server_, *pool_, true);
}

void Session::note_failure() {
  if (!metrics_) return;
  try {
    throw;
  } catch (const std::exception& e) {
    metrics_->error(e.what());
  } catch (...) {
    metrics_->error("the run failed");
  }
  metrics_->publish(*server_, *pool_, true);
}

void Session::register_until(int timeout_ms, const std::function<bool()>& done,
                             const std::function<void(const Registration&)>& offer,
                             const std::function<std::string(const std::string&)>& missing) {
  const auto t0 = Clock::now();
  while (!done()) {
    if (seconds_since(t0) * 1000 > timeout_ms) {
      std::string names;
      for (const auto& p : pool_->peers()) names += (names.empty() ? "" : ", ") + p.name;
      const std::string why = missing(names);
      if (metrics_) metrics_->error(why);
      throw std::runtime_error(why);
    }
    auto got = pool_->receive(Millis(200));
    if (!got) continue;
    const auto* r = std::get_if<RegisterMsg>(&got->message.body);
    if (!r || pool_->has(got->peer)) continue;
    offer(parse_registration(got->peer, *r));
  }
}

Registration parse_registration(const std::string& peer, const RegisterMsg& reg) {
  Registration out{peer, reg, nlohmann::json::object(), ""};
  try {
    out.details = parse_untrusted_object(reg.details_json, kPeerJsonLimits, "registration details");
  } catch (const std::invalid_argument& e) {
    out.details_error = e.what();
  }
  return out;
}

void Session::refuse_registration(const std::string& role, const std::string& peer, const std::string& why) {
  if (!refused_registrations_.emplace(peer, why).second) return;
  pool_->count_refused("registration_details_invalid");
  log(LogLevel::kWarning, options_.who + ": " + role + " " + peer + ": " + why + ": registration refused");
}

std::string Session::refused_registrations() const {
  std::string out;
  for (const auto& [name, why] : refused_registrations_) out += "; refused " + name + ": " + why;
  return out;
}

void Session::release(const std::vector<std::string>& names, bool shutdown) {
  for (const auto& name : names) {
    if (pool_->has(name) && pool_->at(name).dead) continue;
    (void)server_->send(name, command_message(FinishCmd{}, next_request_id()));
    if (shutdown) (void)server_->send(name, command_message(ShutdownCmd{}, next_request_id()));
  }
}

nlohmann::json Session::devices_json(const std::vector<std::string>& names) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& name : names) {
    const PoolPeer& p = pool_->at(name);
    out.push_back({{"name", p.name}, {"gflops", p.reg.compute_gflops}, {"details", p.details}});
  }
  return out;
}

nlohmann::json Session::message_kinds_json(const std::vector<std::string>& names) const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& name : names) out[name] = pool_->message_kinds(name);
  return out;
}

}  // namespace cleave
