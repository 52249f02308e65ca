// pipeline_profile.cpp: the planner's input measured on the live daemons —
// per-layer times for the job's model on each device, and every pair's link
// (link_probe.h on the daemons) — for `cleave train --planner auto` and
// `cleave profile`. See docs/planner.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "core/io/untrusted_json.h"
#include "core/runtime/common/wire.h"
#include "core/runtime/coordinator/pipeline_driver.h"

namespace cleave::pipeline_detail {

using namespace transport;

std::optional<Backend> registered_backend(const nlohmann::json& details) {
  const std::string name = json_string(details, "backend", "");
  if (name.empty()) return std::nullopt;
  return backend_named(name);
}

// What the planner reads of a daemon's registration details, checked once
// when it registers: "" when usable, else why not.
std::string check_pipeline_details(const nlohmann::json& details) {
  try {
    (void)registered_backend(details);
    (void)json_number(details, "bandwidth_limit_bytes_per_sec", 0, 0);
    (void)json_string(details, "host", "");
    (void)json_number(details, "cpu_cores", 0, 0, 1e6);
    (void)json_number(details, "cpu_threads", 0, 0, 1e6);
    return {};
  } catch (const std::invalid_argument& e) {
    return std::string("registration details: ") + e.what();
  }
}

std::pair<double, double> Driver::probe_link(const std::string& peer) {
  auto round_trip = [&](uint64_t bytes) {
    std::vector<double> rtts;
    for (int i = 0; i < 3; ++i) {
      const uint64_t seq = ++probe_seq_;
      Message m = make_probe_message(seq, bytes, true);
      const auto t0 = Clock::now();
      send(peer, m);
      for (;;) {
        if (seconds_since(t0) > 30) fail("device " + peer + " did not echo a link probe within 30 s");
        auto got = receive(Millis(100));
        if (!got) continue;
        if (auto* pr = std::get_if<ProbeMsg>(&got->message.body); pr && got->peer == peer && pr->sequence == seq) break;
        keep_reply(std::move(*got));
      }
      rtts.push_back(seconds_since(t0));
    }
    std::sort(rtts.begin(), rtts.end());
    return rtts[1];
  };
  const double small = round_trip(64);
  const uint64_t big_bytes = 4u << 20;
  const double big = round_trip(big_bytes);
  const double latency_ms = small / 2 * 1000;
  const double mbps = 2.0 * static_cast<double>(big_bytes) * 8 / std::max(1e-6, big - small) / 1e6;
  return {latency_ms, mbps};
}

// Seconds per sample of each layer on device `d`, timed at micro-batches of
// `samples` (the daemon's profile_layers); a layer that does not fit gets -1.
// The Profile request for micro-batches of `samples`; with `update`, the
// optimizer step is timed too (once per device is enough).
Message Driver::profile_request(int64_t samples, bool update) const {
  // Under zb1 each backward is timed as B then W, as the stages will run it;
  // under gpipe with every micro-batch of the batch kept for backward, as its
  // stages keep them, when M is given. Timed at two sizes (--microbatches
  // auto, `cleave profile`) one micro-batch at a time: the fit of
  // fit_layer_times assumes one pattern at both sizes.
  const int in_flight = schedule_ == ScheduleKind::gpipe && !profiles_two_sizes() ? std::min(cfg_.microbatches, 1024) : 1;
  ProfileCmd c{spec_.to_json().dump(), samples, std::nullopt, schedule_ == ScheduleKind::zb1, std::max(1, in_flight)};
  if (update) c.optimizer = to_wire(cfg_.optimizer);
  return command_message(std::move(c));
}

std::vector<double> Driver::layer_times(const StageDevice& d, int64_t samples, nlohmann::json& detail, bool update) {
  const Received r = request(d.name, profile_request(samples, update), "the profiling request", Millis(120000));
  return layer_times_of(r, detail);
}

std::vector<double> Driver::layer_times_of(const Received& r, nlohmann::json& detail) {
  detail = ack_detail(r);
  return reading(r.peer, "the profiling request", [&] {
    std::vector<double> secs = detail.at("layer_seconds_per_sample").get<std::vector<double>>();
    if (static_cast<int>(secs.size()) != spec_.num_layers())
      throw std::invalid_argument("\"layer_seconds_per_sample\" has " + std::to_string(secs.size()) +
                                  " entries for a model of " + std::to_string(spec_.num_layers()) + " layers");
    for (double& v : secs)
      if (!(v >= 0) || !std::isfinite(v)) v = -1;  // the layer does not fit this device on its own
    return secs;
  });
}

// Devices that share a machine compute at once in training, and slow each
// other down beyond their thread counts (memory bandwidth, shared caches, a
// hypervisor's idea of a core). Each such group, when it does not ask for more
// threads than the machine has cores (plan_shared_hosts counts that case),
// times its layers in rounds: each device alone, then all together. A device's
// `host_contention` is the median over the rounds of its summed layer time
// together over alone in the same round, so that the machine's own changes of
// speed (other tenants of a VM's host) between the two mostly cancel.
void Driver::measure_host_contention(Cluster& cluster, int64_t samples) {
  constexpr int kRounds = 3;
  std::map<std::string, std::vector<size_t>> hosts;
  for (size_t i = 0; i < cluster.devices.size(); ++i)
    if (!cluster.devices[i].host.empty() && cluster.devices[i].cpu_threads > 0) hosts[cluster.devices[i].host].push_back(i);
  const Message m = profile_request(samples, false);
  auto total = [](const std::vector<double>& a, const std::vector<double>& b) {  // a's time where both fit
    double sum = 0;
    for (size_t l = 0; l < a.size() && l < b.size(); ++l)
      if (a[l] >= 0 && b[l] >= 0) sum += a[l];
    return sum;
  };
  for (const auto& [host, members] : hosts) {
    double threads = 0, cores = 0;
    std::vector<std::string> names;
    for (size_t i : members) {
      threads += cluster.devices[i].cpu_threads;
      cores = std::max(cores, cluster.devices[i].host_cores);
      names.push_back(cluster.devices[i].name);
    }
    if (members.size() < 2 || threads > cores) continue;
    std::vector<std::vector<double>> ratios(members.size());
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::vector<double>> alone;
      nlohmann::json detail;
      for (size_t i : members) alone.push_back(layer_times(devices_[i], samples, detail, false));
      const std::vector<Received> replies = request_all(names, m, "the profiling request", Millis(120000));
      for (size_t k = 0; k < members.size(); ++k) {
        const std::vector<double> together = layer_times_of(replies[k], detail);
        const double base = total(alone[k], together);
        if (base > 0) ratios[k].push_back(total(together, alone[k]) / base);
      }
    }
    for (size_t k = 0; k < members.size(); ++k) {
      if (ratios[k].empty()) continue;
      std::sort(ratios[k].begin(), ratios[k].end());
      DeviceProfile& dp = cluster.devices[members[k]];
      dp.host_contention = ratios[k][ratios[k].size() / 2];
      if (cfg_.progress)
        std::fprintf(stderr, "cleave: %s computes at %.2fx its time alone beside the other %zu device(s) on %s\n",
                     dp.name.c_str(), *dp.host_contention, members.size() - 1, host.c_str());
    }
  }
}

Cluster Driver::profile_cluster() {
  Cluster cluster;
  // With a given M the layers are timed at its micro-batch size, which is all
  // the cost model needs. With --microbatches auto (chosen once, at the first
  // plan) they are timed at two sizes, B and about B / 16, and fitted as a
  // fixed time per micro-batch plus a time per sample (fit_layer_times), so
  // that the planner can weigh more, smaller micro-batches; `cleave profile`
  // times at its micro-batch size and a sixteenth of it, so that its devices
  // file serves `cleave plan --microbatches auto` too.
  const bool choosing = opts_.microbatches_auto && plan_epoch_ == 0;
  const int64_t large = choosing ? std::min<int64_t>(cfg_.batch, int64_t{1} << 20)
                                 : std::max<int64_t>(1, (cfg_.batch + cfg_.microbatches - 1) / cfg_.microbatches);
  const int64_t small = std::max<int64_t>(1, large / 16);
  const bool two_sizes = profiles_two_sizes() && large > 1;
  std::vector<double> caps(devices_.size(), 0);  // declared --bandwidth-limit of each, Mbit/s (0: none)
  // One device at a time, so that devices sharing a machine do not slow each
  // other's measurements down; how much they do is measured after
  // (measure_host_contention).
  for (size_t i = 0; i < devices_.size(); ++i) {
    const StageDevice& d = devices_[i];
    nlohmann::json detail;
    DeviceProfile dp;
    dp.name = d.name;
    dp.memory_bytes = static_cast<int64_t>(d.reg.memory_free);
    dp.gflops = d.reg.compute_gflops;
    std::vector<double> secs = layer_times(d, large, detail);
    if (two_sizes) {
      nlohmann::json small_detail;
      LayerTimeFit fit = fit_layer_times(small, layer_times(d, small, small_detail, false), large, secs);
      secs = std::move(fit.per_sample);
      dp.layer_seconds_per_microbatch = std::move(fit.per_microbatch);
    }
    for (double& v : secs)
      if (v < 0) v = 1e9;  // the layer does not fit this device on its own
    dp.layer_seconds_per_sample = std::move(secs);
    dp.update_seconds_per_param = reading(d.name, "the profiling request", [&] {
      return json_number(detail, "update_seconds_per_param", 0.0, 0.0);
    });
    // Checked at registration (check_pipeline_details).
    caps[i] = json_number(d.details, "bandwidth_limit_bytes_per_sec", 0.0) * 8 / 1e6;
    // Its backend: the planner then sizes the stage exactly as the daemon will admit it.
    dp.backend = registered_backend(d.details);
    if (d.details.contains("host")) {  // which machine it shares with whom (daemons on one box slow each other down)
      dp.host = json_string(d.details, "host", "");
      dp.host_cores = json_number(d.details, "cpu_cores", 0.0);
      dp.cpu_threads = json_number(d.details, "cpu_threads", 0.0);
    }
    cluster.devices.push_back(dp);
    if (cfg_.progress) std::fprintf(stderr, "cleave: profiled %s\n", d.name.c_str());
  }
  measure_host_contention(cluster, large);
  // The coordinator's own (unthrottled) link to each daemon, latency in ms and
  // Mbit/s, probed once, when first needed.
  std::vector<std::optional<std::pair<double, double>>> coordinator_links(devices_.size());
  auto coordinator_link = [&](size_t i) {
    if (!coordinator_links[i]) coordinator_links[i] = probe_link(devices_[i].name);
    return *coordinator_links[i];
  };
  if (!opts_.insecure) {
    // Every pair of daemons measures the link between them, each direction
    // through its sender's --bandwidth-limit (link_probe.h).
    for (size_t a = 0; a < devices_.size(); ++a)
      for (size_t b = a + 1; b < devices_.size(); ++b) {
        const StageDevice& da = devices_[a];
        const StageDevice& db = devices_[b];
        const auto ep = ack_detail(request(db.name, command_message(ProbeServeCmd{da.name, da.reg.public_key}),
                                           "the link probe set-up", Millis(30000)));
        const std::string endpoint = reading(db.name, "the link probe set-up", [&] { return json_string(ep, "endpoint", ""); });
        const auto m = ack_detail(
            request(da.name, command_message(ProbePeerCmd{db.name, db.reg.public_key, endpoint}), "the link probe",
                    Millis(120000)));
        (void)request(db.name, command_message(ProbeStopCmd{da.name}), "the end of the link probe", Millis(30000));
        const auto [lat, out, in] = reading(da.name, "the link probe", [&] {
          for (const char* key : {"latency_ms", "mbps_out", "mbps_in"})
            if (!m.contains(key)) throw std::invalid_argument(std::string("\"") + key + "\" is missing");
          return std::tuple{json_number(m, "latency_ms", -1, 0), json_number(m, "mbps_out", -1, 0),
                            json_number(m, "mbps_in", -1, 0)};
        });
        LinkProfile ab{out, lat, std::nullopt}, ba{in, lat, std::nullopt};
        // A throttled direction's wire is mostly waiting: what the two ends'
        // CPUs take per byte is the rate the coordinator's own (unthrottled)
        // links to them reach, never more than the wire itself.
        if (caps[a] > 0 || caps[b] > 0) {
          const double cpu = std::min(coordinator_link(a).second, coordinator_link(b).second);
          if (caps[a] > 0) ab.cpu_mbps = std::max(cpu, out);
          if (caps[b] > 0) ba.cpu_mbps = std::max(cpu, in);
        }
        cluster.set_link(static_cast<int>(a), static_cast<int>(b), ab);
        cluster.set_link(static_cast<int>(b), static_cast<int>(a), ba);
        if (cfg_.progress)
          std::fprintf(stderr, "cleave: link %s -> %s %.0f Mbit/s, %s -> %s %.0f Mbit/s, %.2f ms\n", da.name.c_str(),
                       db.name.c_str(), out, db.name.c_str(), da.name.c_str(), in, lat);
      }
    return cluster;
  }
  // --insecure daemons cannot run link probes: the coordinator's own links to
  // them (same network, same encryption) stand in, capped by the declared
  // --bandwidth-limit of each sender. A link a -> b carries activations out of
  // a and gradients out of b: the slower sender bounds it.
  for (size_t a = 0; a < devices_.size(); ++a)
    for (size_t b = 0; b < devices_.size(); ++b) {
      if (a == b) continue;
      const auto [latency_a, mbps_a] = coordinator_link(a);
      const auto [latency_b, mbps_b] = coordinator_link(b);
      LinkProfile l;
      l.mbps = std::min(mbps_a, mbps_b);
      if (caps[a] > 0 || caps[b] > 0) l.cpu_mbps = l.mbps;  // the unthrottled rate (above)
      if (caps[a] > 0) l.mbps = std::min(l.mbps, caps[a]);
      if (caps[b] > 0) l.mbps = std::min(l.mbps, caps[b]);
      l.latency_ms = std::max(latency_a, latency_b);
      cluster.set_link(static_cast<int>(a), static_cast<int>(b), l);
    }
  return cluster;
}

}  // namespace cleave::pipeline_detail
