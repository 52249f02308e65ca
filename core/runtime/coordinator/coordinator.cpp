// coordinator.cpp: the pipeline driver; see coordinator.h and docs/protocol.md.
#include "core/runtime/coordinator/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "core/model/partition.h"
#include "core/nn/layer.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/trace.h"
#include "core/planner/devices_file.h"
#include "core/planner/plan_report.h"
#include "core/planner/planner.h"
#include "core/planner/profile.h"
#include "core/runtime/coordinator/peer_pool.h"
#include "core/runtime/common/stage_state.h"
#include "core/runtime/common/wire.h"
#include "core/train/evaluate.h"
#include "core/train/progress.h"
#include "transport/endpoint.h"
#include "transport/keys.h"
#include "transport/log.h"

namespace cleave {

std::vector<int> balance_ranges(const std::vector<double>& costs, int parts) {
  const int n = static_cast<int>(costs.size());
  if (parts < 1 || parts > n)
    throw std::invalid_argument("cannot split " + std::to_string(n) + " layers into " + std::to_string(parts) +
                                " stages: use at most " + std::to_string(n) + " devices");
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: smallest bottleneck covering layers [0, i) with k stages.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        double v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  std::vector<int> bounds(parts + 1);
  bounds[parts] = n;
  for (int k = parts, i = n; k > 0; --k) {
    i = cut[k][i];
    bounds[k - 1] = i;
  }
  return bounds;
}

namespace {

using namespace transport;
using Clock = std::chrono::steady_clock;

struct Device_ {
  std::string name;
  RegisterMsg reg;
  int stage = -1;
  std::string peer_endpoint;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

class Driver {
 public:
  Driver(const TrainConfig& cfg, const ClusterOptions& opts) : cfg_(cfg), opts_(opts) {}

  nlohmann::json run();

 private:
  // Receives one message (or times out), checking liveness and interrupts.
  std::optional<Received> receive(Millis timeout);
  // Fails naming the device, its stage and the step when a stage's daemon died.
  void fail_if_a_stage_died();
  void send(const std::string& peer, const Message& m);
  [[noreturn]] void fail(const std::string& text);
  Received wait_for_reply(const std::string& peer, uint64_t request_id, const char* what, Millis timeout);
  void stop_all(bool shutdown);
  // Planner input from the live devices: per-layer times, memory, links.
  Cluster profile_cluster(const ModelSpec& spec);
  void keep_reply(Received&& r);
  // Every stage's parameters (stage s has counts[s]) in stage order, with their
  // optimizer's `buffers` state blocks (0: weights only).
  std::vector<StageState> gather_states(const std::vector<int64_t>& counts, size_t buffers);
  // Round-trip probes to `peer`: (one-way latency ms, bandwidth Mbit/s).
  std::pair<double, double> probe_link(const std::string& peer);

  const TrainConfig& cfg_;
  const ClusterOptions& opts_;
  std::unique_ptr<ServerEndpoint> server_;
  std::unique_ptr<PeerPool> pool_;              // liveness, heartbeats (while stages are assigned)
  std::vector<Device_> devices_;                // in stage order once assigned
  std::vector<Device_> idle_;                   // registered, left unused by the planner
  double predicted_batch_seconds_ = 0;
  std::map<std::string, size_t> by_name_;
  std::map<int64_t, MetricsMsg> last_metrics_;  // step -> metrics of the last stage
  std::map<std::string, int64_t> progress_;     // device -> last step it finished
  int64_t current_step_ = -1;
  uint64_t probe_seq_ = 0;
  bool assigned_ = false;
  std::map<std::pair<std::string, uint64_t>, Received> replies_;  // (peer, request id) -> reply
};

void Driver::fail(const std::string& text) { throw std::runtime_error(text); }

void Driver::send(const std::string& peer, const Message& m) {
  Status s = server_->send(peer, m);
  if (!s) fail("cannot reach device " + peer + " at step " + std::to_string(current_step_) + ": " + s.failure().message);
}

void Driver::fail_if_a_stage_died() {
  for (const auto& d : devices_) {
    const PoolPeer& p = pool_->at(d.name);
    if (p.dead && !p.released)
      fail("device " + d.name + " (stage " + std::to_string(d.stage) + ") " + p.dead_reason + " at step " +
           std::to_string(current_step_));
  }
}

std::optional<Received> Driver::receive(Millis timeout) {
  auto r = pool_->receive(timeout);
  fail_if_a_stage_died();
  if (!r) return std::nullopt;
  Received& got = *r;
  if (auto* e = std::get_if<ErrorMsg>(&got.message.body)) {
    if (assigned_ || e->code != ErrorCode::kNotAssigned)
      fail("device " + got.peer + " reported an error at step " + std::to_string(current_step_) + ": " + e->message);
    return std::nullopt;
  }
  if (auto* mm = std::get_if<MetricsMsg>(&got.message.body)) {
    progress_[got.peer] = mm->step;
    if (mm->stage == static_cast<int>(devices_.size()) - 1) last_metrics_[mm->step] = *mm;
    return std::nullopt;
  }
  return std::move(got);
}

Received Driver::wait_for_reply(const std::string& peer, uint64_t request_id, const char* what, Millis timeout) {
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < timeout) {
    if (auto it = replies_.find({peer, request_id}); it != replies_.end()) {
      Received r = std::move(it->second);
      replies_.erase(it);
      return r;
    }
    auto got = receive(Millis(100));
    if (got) keep_reply(std::move(*got));
  }
  fail("device " + peer + " did not answer " + what + " within " + std::to_string(timeout.count() / 1000) + " s");
}

void Driver::stop_all(bool shutdown) {
  std::vector<Device_> all = devices_;
  all.insert(all.end(), idle_.begin(), idle_.end());
  for (const auto& d : all) {
    (void)server_->send(d.name, control(ControlCommand::kStop, {{"op", "finish"}}));
    if (shutdown) (void)server_->send(d.name, control(ControlCommand::kShutdown, {{"op", "shutdown"}}));
  }
}

void Driver::keep_reply(Received&& r) {
  // Replies (acks, weights) are kept until someone waits for them.
  if (auto* a = std::get_if<AckMsg>(&r.message.body)) {
    replies_[{r.peer, a->request_id}] = std::move(r);
  } else if (std::holds_alternative<WeightsMsg>(r.message.body)) {
    const uint64_t id = r.message.request_id;
    replies_[{r.peer, id}] = std::move(r);
  }
}

std::vector<StageState> Driver::gather_states(const std::vector<int64_t>& counts, size_t buffers) {
  std::vector<StageState> out;
  const bool with_optimizer = buffers > 0;
  for (const auto& d : devices_) {
    Message m = control(ControlCommand::kCheckpoint, {{"op", with_optimizer ? "state" : "weights"}});
    m.request_id = 3000 + static_cast<uint64_t>(d.stage);
    send(d.name, m);
    Received r = wait_for_reply(d.name, m.request_id, with_optimizer ? "the state request" : "the weights request",
                                Millis(60000));
    try {
      StageState s = read_stage_state(r.message, counts[static_cast<size_t>(d.stage)], buffers);
      if (s.buffers.size() != buffers) throw std::invalid_argument("it holds no optimizer state");
      out.push_back(std::move(s));
    } catch (const std::exception& e) {
      fail("device " + d.name + " sent an unusable state for stage " + std::to_string(d.stage) + ": " + e.what());
    }
  }
  return out;
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

Cluster Driver::profile_cluster(const ModelSpec& spec) {
  Cluster cluster;
  const int64_t mb_samples = std::max<int64_t>(1, (cfg_.batch + cfg_.microbatches - 1) / cfg_.microbatches);
  std::vector<double> caps(devices_.size(), 0);  // declared --bandwidth-limit of each, Mbit/s (0: none)
  // One device at a time, so that devices sharing a machine do not slow each
  // other's measurements down.
  for (size_t i = 0; i < devices_.size(); ++i) {
    const Device_& d = devices_[i];
    Message m = control(ControlCommand::kStart, {{"op", "profile"}, {"model", spec.to_json()}, {"samples", mb_samples},
                                                 {"optimizer", cfg_.optimizer.to_json()}});
    m.request_id = 500 + i;
    send(d.name, m);
    Received r = wait_for_reply(d.name, 500 + i, "the profiling request", Millis(120000));
    auto detail = nlohmann::json::parse(std::get<AckMsg>(r.message.body).detail);
    DeviceProfile dp;
    dp.name = d.name;
    dp.memory_bytes = static_cast<int64_t>(d.reg.memory_free);
    dp.gflops = d.reg.compute_gflops;
    std::vector<double> secs = detail.at("layer_seconds_per_sample").get<std::vector<double>>();
    for (double& v : secs)
      if (v < 0) v = 1e9;  // the layer does not fit this device on its own
    dp.layer_seconds_per_sample = secs;
    dp.update_seconds_per_param = detail.value("update_seconds_per_param", 0.0);
    const auto reg = nlohmann::json::parse(d.reg.details_json.empty() ? "{}" : d.reg.details_json, nullptr, false);
    if (!reg.is_discarded() && reg.is_object()) {
      caps[i] = reg.value("bandwidth_limit_bytes_per_sec", 0.0) * 8 / 1e6;
      if (reg.contains("host")) {  // which machine it shares with whom (daemons on one box slow each other down)
        dp.host = reg.value("host", std::string());
        dp.host_cores = reg.value("cpu_cores", 0.0);
        dp.cpu_threads = reg.value("cpu_threads", 0.0);
      }
    }
    cluster.devices.push_back(dp);
    if (cfg_.progress) std::fprintf(stderr, "cleave: profiled %s\n", d.name.c_str());
  }
  if (!opts_.insecure) {
    // Every pair of daemons measures the link between them, each direction
    // through its sender's --bandwidth-limit (link_probe.h).
    for (size_t a = 0; a < devices_.size(); ++a)
      for (size_t b = a + 1; b < devices_.size(); ++b) {
        const Device_& da = devices_[a];
        const Device_& db = devices_[b];
        const uint64_t rid = 600 + 3 * (a * devices_.size() + b);
        Message serve = control(ControlCommand::kStart, {{"op", "probe_serve"}, {"peer", da.name}, {"peer_key", da.reg.public_key}});
        serve.request_id = rid;
        send(db.name, serve);
        const auto ep = nlohmann::json::parse(
            std::get<AckMsg>(wait_for_reply(db.name, rid, "the link probe set-up", Millis(30000)).message.body).detail);
        Message probe = control(ControlCommand::kStart, {{"op", "probe_peer"}, {"peer", db.name}, {"peer_key", db.reg.public_key},
                                                         {"endpoint", ep.at("endpoint")}});
        probe.request_id = rid + 1;
        send(da.name, probe);
        const auto m = nlohmann::json::parse(
            std::get<AckMsg>(wait_for_reply(da.name, rid + 1, "the link probe", Millis(120000)).message.body).detail);
        Message stop = control(ControlCommand::kStart, {{"op", "probe_stop"}, {"peer", da.name}});
        stop.request_id = rid + 2;
        send(db.name, stop);
        (void)wait_for_reply(db.name, rid + 2, "the end of the link probe", Millis(30000));
        const double lat = m.at("latency_ms").get<double>();
        cluster.set_link(static_cast<int>(a), static_cast<int>(b), {m.at("mbps_out").get<double>(), lat, std::nullopt});
        cluster.set_link(static_cast<int>(b), static_cast<int>(a), {m.at("mbps_in").get<double>(), lat, std::nullopt});
        if (cfg_.progress)
          std::fprintf(stderr, "cleave: link %s -> %s %.0f Mbit/s, %s -> %s %.0f Mbit/s, %.2f ms\n", da.name.c_str(),
                       db.name.c_str(), m.at("mbps_out").get<double>(), db.name.c_str(), da.name.c_str(),
                       m.at("mbps_in").get<double>(), lat);
      }
    return cluster;
  }
  // --insecure daemons cannot run link probes: the coordinator's own links to
  // them (same network, same encryption) stand in, capped by the declared
  // --bandwidth-limit of each sender. A link a -> b carries activations out of
  // a and gradients out of b: the slower sender bounds it.
  std::vector<double> mbps(devices_.size(), 0), latency(devices_.size(), 0);
  for (size_t i = 0; i < devices_.size(); ++i) std::tie(latency[i], mbps[i]) = probe_link(devices_[i].name);
  for (size_t a = 0; a < devices_.size(); ++a)
    for (size_t b = 0; b < devices_.size(); ++b) {
      if (a == b) continue;
      LinkProfile l;
      l.mbps = std::min(mbps[a], mbps[b]);
      if (caps[a] > 0) l.mbps = std::min(l.mbps, caps[a]);
      if (caps[b] > 0) l.mbps = std::min(l.mbps, caps[b]);
      l.latency_ms = std::max(latency[a], latency[b]);
      cluster.set_link(static_cast<int>(a), static_cast<int>(b), l);
    }
  return cluster;
}

nlohmann::json Driver::run() {
  const auto t_start = Clock::now();
  ModelSpec spec = ModelSpec::load(cfg_.model_path);
  Dataset train = load_dataset(cfg_.dataset, cfg_.dataset_dir, true, cfg_.limit_train);
  Dataset test = load_dataset(cfg_.dataset, cfg_.dataset_dir, false, cfg_.limit_test);
  const ScheduleKind schedule = parse_schedule(opts_.schedule);
  const transport::Encoding encoding = transport::parse_encoding(opts_.encoding);
  if (opts_.devices < 1) fail("--devices must be at least 1");
  if (opts_.devices > spec.num_layers())
    fail(cfg_.model_path + " has " + std::to_string(spec.num_layers()) + " layers: it cannot be split over " +
         std::to_string(opts_.devices) + " devices");
  if (!cfg_.load_path.empty() && !cfg_.init_path.empty())
    fail("--load and --init both say where training starts: give one of them");

  ServerOptions so;
  so.bind = opts_.listen;
  so.insecure = opts_.insecure;
  so.label = "cleave coordinator";
  if (!opts_.insecure) {
    so.keys = load_secret_key(opts_.key_path);
    so.allow = AllowList::load(opts_.allow_path);
  }
  server_ = std::make_unique<ServerEndpoint>(so);
  pool_ = std::make_unique<PeerPool>(*server_, "cleave", opts_.peer_timeout_ms, opts_.interrupted);
  if (opts_.on_listening) opts_.on_listening(server_->endpoint());
  if (cfg_.progress)
    std::fprintf(stderr, "cleave: listening on %s, waiting for %d device(s)\n", server_->endpoint().c_str(), opts_.devices);

  // 1. Registration.
  const auto t_reg = Clock::now();
  while (static_cast<int>(devices_.size()) < opts_.devices) {
    if (seconds_since(t_reg) * 1000 > opts_.register_timeout_ms) {
      std::string names;
      for (const auto& d : devices_) names += (names.empty() ? "" : ", ") + d.name;
      fail("only " + std::to_string(devices_.size()) + " of " + std::to_string(opts_.devices) +
           " devices registered within " + std::to_string(opts_.register_timeout_ms / 1000) + " s" +
           (names.empty() ? "" : " (" + names + ")") + ": start more cleaved daemons with keys in " + opts_.allow_path);
    }
    auto got = receive(Millis(200));
    if (!got) continue;
    if (auto* r = std::get_if<RegisterMsg>(&got->message.body)) {
      if (by_name_.count(got->peer)) continue;
      by_name_[got->peer] = devices_.size();
      devices_.push_back({got->peer, *r, -1, ""});
      pool_->add(got->peer, *r, nlohmann::json::object());
      if (cfg_.progress)
        std::fprintf(stderr, "cleave: device %s registered (%s, %.1f GFLOP/s, %.0f MiB free)\n", got->peer.c_str(),
                     r->device_name.c_str(), r->compute_gflops, r->memory_free / 1048576.0);
    }
  }

  // 2. Plan. "balance": every device gets a stage, layers split evenly by
  //    compute (3x forward FLOPs per sample) plus the optimizer's per-parameter
  //    work. "auto": profile the devices (per-layer times measured on each for
  //    this model, links probed over their encrypted connections, bandwidth
  //    limits they declare) and let the planner choose stages and devices.
  std::sort(devices_.begin(), devices_.end(), [](const Device_& a, const Device_& b) { return a.name < b.name; });
  std::vector<int> bounds;
  nlohmann::json plan_json, profile_json;
  if (!opts_.profile_only && (opts_.planner == "balance" || opts_.devices == 1)) {
    std::vector<double> costs;
    for (int i = 0; i < spec.num_layers(); ++i) {
      auto layer = make_layer(spec.layers[i], spec.shapes[i]);
      costs.push_back(3.0 * static_cast<double>(layer->flops_per_sample(spec.shapes[i])) * static_cast<double>(cfg_.batch) +
                      10.0 * static_cast<double>(layer->param_count()) + 1.0);
    }
    bounds = balance_ranges(costs, opts_.devices);
  } else if (opts_.planner == "auto" || opts_.profile_only) {
    Cluster cluster = profile_cluster(spec);
    if (opts_.profile_only) {
      // `cleave profile`: release the daemons and return what was measured,
      // in the devices-file format `cleave plan --devices` reads.
      for (const auto& d : devices_) (void)server_->send(d.name, control(ControlCommand::kStop, {{"op", "finish"}}));
      if (opts_.shutdown_daemons)
        for (const auto& d : devices_) (void)server_->send(d.name, control(ControlCommand::kShutdown, {{"op", "shutdown"}}));
      nlohmann::json out = cluster_to_json(cluster);  // devices carry "layer_seconds" for this model
      out["description"] = "measured by cleave profile for model " + spec.name + " (batch " +
                           std::to_string(cfg_.batch) + ", " + std::to_string(cfg_.microbatches) + " micro-batches)";
      return out;
    }
    PlanOptions po;
    po.schedule = schedule;
    po.microbatches = cfg_.microbatches;
    po.batch = cfg_.batch;
    po.encoding = encoding;
    const ModelProfile mp = profile_model(spec, cfg_.optimizer.kind, cfg_.optimizer.momentum);
    Plan pl = plan_shared_hosts(mp, cluster, po);
    plan_json = to_json(pl, mp);
    profile_json = cluster_to_json(cluster);
    if (cfg_.progress) std::fprintf(stderr, "%s", format_plan_table(pl, mp).c_str());
    std::vector<Device_> ordered;
    bounds.push_back(0);
    for (const StagePlan& st : pl.stages) {
      auto it = std::find_if(devices_.begin(), devices_.end(), [&](const Device_& d) { return d.name == st.device_name; });
      ordered.push_back(*it);
      bounds.push_back(st.end);
    }
    for (const auto& d : devices_)
      if (std::none_of(ordered.begin(), ordered.end(), [&](const Device_& o) { return o.name == d.name; }))
        idle_.push_back(d);
    devices_ = ordered;
    predicted_batch_seconds_ = pl.batch_seconds;
  } else {
    fail("unknown --planner '" + opts_.planner + "': use auto or balance");
  }
  by_name_.clear();
  for (size_t i = 0; i < devices_.size(); ++i) {
    devices_[i].stage = static_cast<int>(i);
    by_name_[devices_[i].name] = i;
  }
  const int p = static_cast<int>(devices_.size());

  OptimizerConfig ocfg = cfg_.optimizer;
  BatchLoader loader(train, cfg_.batch, true, cfg_.seed);
  const int64_t per_epoch = loader.batches_per_epoch();
  if (ocfg.total_steps == 0) ocfg.total_steps = per_epoch * cfg_.epochs;
  ocfg.validate();
  const nlohmann::json training = {{"schedule", schedule_name(schedule)}, {"microbatches", cfg_.microbatches},
                                   {"batch", cfg_.batch}, {"seed", cfg_.seed}};
  // --load / --init: read and check the file before any daemon is assigned.
  const StartingPoint start = read_starting_point(cfg_, spec, ocfg, bounds);
  for (const auto& d : idle_) pool_->release(d.name);  // left unused by the planner: nothing to watch
  assigned_ = true;
  pool_->set_monitoring(true);
  try {
    // 3. Assign stages; each daemon with a previous stage answers with the
    //    endpoint that stage must dial.
    for (int s = 0; s < p; ++s) {
      AssignMsg a;
      a.stage = s;
      a.num_stages = p;
      a.layer_begin = bounds[s];
      a.layer_end = bounds[s + 1];
      a.model_spec_json = spec.to_json().dump();
      a.optimizer_json = ocfg.to_json().dump();
      a.training_json = training.dump();
      a.link_encoding = encoding;
      auto peer_of = [&](int i) {
        return PeerInfo{"", devices_[i].reg.public_key, devices_[i].name};
      };
      if (s > 0) a.prev = peer_of(s - 1);
      if (s + 1 < p) a.next = peer_of(s + 1);
      Message m;
      m.request_id = 1000 + s;
      m.body = a;
      send(devices_[s].name, m);
      Received r = wait_for_reply(devices_[s].name, m.request_id, "its stage assignment", Millis(60000));
      auto detail = nlohmann::json::parse(std::get<AckMsg>(r.message.body).detail);
      devices_[s].peer_endpoint = detail.value("peer_endpoint", std::string());
    }
    for (int s = 0; s < p; ++s) {
      nlohmann::json arg = {{"op", "connect"}};
      if (s + 1 < p) arg["next_endpoint"] = devices_[s + 1].peer_endpoint;
      Message m = control(ControlCommand::kStart, arg);
      m.request_id = 2000 + s;
      send(devices_[s].name, m);
      (void)wait_for_reply(devices_[s].name, m.request_id, "the connect request", Millis(30000));
    }
    for (const StageState& st : start.stages) {  // weights (and optimizer state) to start from
      const Message m = stage_state_message(st, 2500 + static_cast<uint64_t>(st.stage));
      send(devices_[st.stage].name, m);
      (void)wait_for_reply(devices_[st.stage].name, m.request_id, "its starting state", Millis(60000));
    }
    TrainPosition pos = start.position;
    const std::vector<int64_t> stage_counts = stage_param_counts(spec, bounds);
    const size_t optimizer_buffers = optimizer_state_names(ocfg).size();
    auto save_checkpoint = [&] {
      save_training_state(cfg_.save_path, assemble_training_state(cfg_, spec, ocfg, pos,
                                                                  gather_states(stage_counts, optimizer_buffers)));
    };

    // 4. Train.
    const bool classify = spec.loss == LossKind::cross_entropy;
    const int64_t in_floats = numel(spec.input);
    const int64_t target_floats = classify ? 1 : numel(spec.output());
    nlohmann::json losses = nlohmann::json::array();
    ProgressBar bar(cfg_.progress);
    int64_t samples = 0, step = pos.step;
    double train_seconds = 0;
    std::map<int64_t, int64_t> step_batch;
    std::vector<Clock::time_point> step_done;  // when each step's loss arrived
    int64_t next_loss_step = step;
    auto collect = [&](int64_t upto, Clock::time_point t_epoch, int64_t first_step_of_epoch, int64_t epoch_samples) {
      // Waits until the last stage reported every step < upto; records losses in order.
      while (next_loss_step < upto) {
        auto it = last_metrics_.find(next_loss_step);
        if (it == last_metrics_.end()) {
          (void)receive(Millis(50));
          continue;
        }
        const double loss = it->second.loss_sum / static_cast<double>(step_batch[next_loss_step]);
        if (!std::isfinite(loss))
          fail("training diverged at step " + std::to_string(next_loss_step) + " (loss " + std::to_string(loss) + "): lower --lr");
        losses.push_back(loss);
        step_done.push_back(Clock::now());
        last_metrics_.erase(it);
        ++next_loss_step;
        bar.update(next_loss_step - first_step_of_epoch, loss, epoch_samples / std::max(1e-9, seconds_since(t_epoch)));
      }
    };
    bool stopped = false;
    for (int64_t epoch = pos.epoch; epoch < cfg_.epochs && !stopped; ++epoch) {
      loader.start_epoch(epoch);
      bar.begin(epoch + 1, cfg_.epochs, per_epoch);
      const auto t_epoch = Clock::now();
      const int64_t first_step = step;
      int64_t epoch_samples = 0;
      for (int64_t b = (epoch == start.position.epoch ? start.position.batch : 0); b < per_epoch; ++b) {
        if (cfg_.max_steps >= 0 && step >= cfg_.max_steps) {
          stopped = true;
          break;
        }
        current_step_ = step;
        Batch batch = loader.get(b);
        step_batch[step] = batch.size;
        const int m = static_cast<int>(std::min<int64_t>(cfg_.microbatches, batch.size));
        Message sc = control(ControlCommand::kStart, {{"op", "step"}, {"step", step}, {"batch", batch.size}});
        for (const auto& d : devices_) send(d.name, sc);
        auto xs = std::make_shared<std::vector<float>>(std::move(batch.x));
        auto ys = std::make_shared<std::vector<float>>(std::move(batch.y));
        for (int mb = 0; mb < m; ++mb) {
          const int64_t lo = microbatch_offset(batch.size, m, mb), hi = microbatch_offset(batch.size, m, mb + 1);
          TensorMsg xh{TensorKind::kInput, step, mb, batched(hi - lo, spec.input), transport::Encoding::kF32, 0.f};
          send(devices_.front().name, make_tensor_message(xh, xs->data() + lo * in_floats,
                                                          static_cast<size_t>((hi - lo) * in_floats), xs));
          TensorMsg yh{TensorKind::kLabels, step, mb, classify ? Shape{hi - lo} : batched(hi - lo, spec.output()),
                       transport::Encoding::kF32, 0.f};
          send(devices_.back().name, make_tensor_message(yh, ys->data() + lo * target_floats,
                                                         static_cast<size_t>((hi - lo) * target_floats), ys));
        }
        samples += batch.size;
        epoch_samples += batch.size;
        ++step;
        pos.step = step;
        pos.batch = b + 1;
        // Keep at most two steps in flight so the first stage can start the
        // next batch while the last one finishes this one.
        collect(step - 1, t_epoch, first_step, epoch_samples);
        if (cfg_.save_every > 0 && !cfg_.save_path.empty() && step % cfg_.save_every == 0) {
          collect(step, t_epoch, first_step, epoch_samples);  // every stage has applied this step
          save_checkpoint();
        }
      }
      collect(step, t_epoch, first_step, epoch_samples);
      if (!stopped || pos.batch == per_epoch) {
        pos.epoch = epoch + 1;
        pos.batch = 0;
      }
      train_seconds += seconds_since(t_epoch);
      char summary[64];
      std::snprintf(summary, sizeof summary, "%.1f s", seconds_since(t_epoch));
      bar.end(summary);
    }
    current_step_ = step;

    // 5. Gather the weights (stage blocks concatenate to the whole model's block),
    //    with the optimizer state when there is a checkpoint to write.
    std::vector<float> params;
    if (!cfg_.save_path.empty()) {
      TrainingState st = assemble_training_state(cfg_, spec, ocfg, pos, gather_states(stage_counts, optimizer_buffers));
      save_training_state(cfg_.save_path, st);
      params = std::move(st.params);
    } else {
      for (const StageState& s : gather_states(stage_counts, 0)) params.insert(params.end(), s.params.begin(), s.params.end());
    }
    auto cpu = open_device("cpu", DeviceOptions{});
    Partition whole(*cpu, spec, 0, spec.num_layers());
    if (static_cast<int64_t>(params.size()) != whole.param_count())
      fail("gathered " + std::to_string(params.size()) + " parameters from the stages but the model has " +
           std::to_string(whole.param_count()));
    whole.params().from_host(params);

    // 6. Finish: collect traces and busy times.
    std::vector<TraceEvent> events;
    nlohmann::json busy = nlohmann::json::array();
    for (int s = 0; s < p; ++s) {
      Message m = control(ControlCommand::kStop, {{"op", "finish"}});
      m.request_id = 4000 + s;
      send(devices_[s].name, m);
      Received r = wait_for_reply(devices_[s].name, m.request_id, "the finish request", Millis(30000));
      pool_->release(devices_[s].name);
      auto detail = nlohmann::json::parse(std::get<AckMsg>(r.message.body).detail);
      for (const auto& e : detail.value("trace", nlohmann::json::array())) events.push_back(trace_event_from_json(e));
      busy.push_back({{"stage", s}, {"device", devices_[s].name}, {"busy_seconds", detail.value("busy", nlohmann::json::object())}});
    }
    assigned_ = false;
    pool_->set_monitoring(false);
    // Evaluate only after the daemons are released: this takes seconds in
    // which no daemon has reason to talk to us.
    EvalResult ev = evaluate(whole, test, 256);
    for (const auto& d : idle_) (void)server_->send(d.name, control(ControlCommand::kStop, {{"op", "finish"}}));
    if (opts_.shutdown_daemons) {
      for (const auto& d : devices_) (void)server_->send(d.name, control(ControlCommand::kShutdown, {{"op", "shutdown"}}));
      for (const auto& d : idle_) (void)server_->send(d.name, control(ControlCommand::kShutdown, {{"op", "shutdown"}}));
    }

    if (!opts_.trace_path.empty()) {
      double origin = std::numeric_limits<double>::max();
      for (const auto& e : events) origin = std::min(origin, e.start_us);
      for (auto& e : events) e.start_us -= origin;
      std::vector<std::string> tracks;
      for (const auto& d : devices_) tracks.push_back("stage " + std::to_string(d.stage) + " (" + d.name + ")");
      std::ofstream out(opts_.trace_path);
      if (!out) fail("cannot write the trace to " + opts_.trace_path);
      out << chrome_trace(events, tracks).dump() << "\n";
    }
    if (cfg_.progress)
      std::fprintf(stderr, "test accuracy %.4f  test loss %.4f  (%lld samples)\n", ev.accuracy, ev.loss,
                   static_cast<long long>(ev.samples));

    nlohmann::json out;
    out["mode"] = "pipeline";
    out["model"] = spec.name;
    out["model_path"] = cfg_.model_path;
    out["dataset"] = train.name;
    out["train_samples"] = train.size();
    out["test_samples"] = test.size();
    out["epochs"] = cfg_.epochs;
    out["batch"] = cfg_.batch;
    out["microbatches"] = cfg_.microbatches;
    out["schedule"] = schedule_name(schedule);
    out["encoding"] = encoding_name(encoding);
    out["seed"] = cfg_.seed;
    out["start_step"] = start.position.step;
    out["steps"] = step - start.position.step;
    out["losses"] = losses;
    out["test_accuracy"] = ev.accuracy;
    out["test_loss"] = ev.loss;
    out["samples_per_sec"] = samples / std::max(1e-9, train_seconds);
    out["wall_seconds"] = seconds_since(t_start);
    out["train_seconds"] = train_seconds;
    out["optimizer"] = ocfg.to_json();
    out["parameters"] = whole.param_count();
    nlohmann::json devs = nlohmann::json::array(), plan = nlohmann::json::array();
    for (const auto& d : devices_) {
      nlohmann::json details = nlohmann::json::parse(d.reg.details_json.empty() ? "{}" : d.reg.details_json, nullptr, false);
      devs.push_back({{"name", d.name}, {"stage", d.stage}, {"gflops", d.reg.compute_gflops},
                      {"memory_total", d.reg.memory_total}, {"memory_free", d.reg.memory_free},
                      {"backends", d.reg.backends}, {"details", details.is_discarded() ? nlohmann::json() : details}});
      plan.push_back({{"stage", d.stage}, {"device", d.name}, {"layers", {bounds[d.stage], bounds[d.stage + 1]}},
                      {"parameters", stage_counts[static_cast<size_t>(d.stage)]}});
    }
    for (const auto& d : idle_) devs.push_back({{"name", d.name}, {"stage", -1}, {"gflops", d.reg.compute_gflops},
                                                {"memory_free", d.reg.memory_free}});
    out["devices"] = devs;
    out["plan"] = plan;
    out["planner"] = plan_json.is_null() ? "balance" : "auto";
    if (!plan_json.is_null()) {
      out["planner_plan"] = plan_json;
      out["cluster_profile"] = profile_json;
      // The planner predicts the steady state: compare with the median time
      // between consecutive steps' completions (the first step's set-up and
      // warm-up excluded); the plain mean over the run is reported beside it.
      const int64_t run_steps = step - start.position.step;
      const double mean = run_steps > 0 ? train_seconds / static_cast<double>(run_steps) : 0.0;
      std::vector<double> gaps;
      for (size_t i = 1; i < step_done.size(); ++i)
        gaps.push_back(std::chrono::duration<double>(step_done[i] - step_done[i - 1]).count());
      double measured = mean;
      if (gaps.size() >= 2) {
        std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
        measured = gaps[gaps.size() / 2];
      }
      out["prediction"] = {{"batch_seconds", predicted_batch_seconds_},
                           {"measured_batch_seconds", measured},
                           {"measured_mean_batch_seconds", mean},
                           {"measured_over_predicted", predicted_batch_seconds_ > 0 ? measured / predicted_batch_seconds_ : 0.0}};
    }
    out["stage_busy"] = busy;
    out["bubble_theoretical"] = static_cast<double>(p - 1) / static_cast<double>(cfg_.microbatches + p - 1);
    if (!opts_.trace_path.empty()) out["trace"] = opts_.trace_path;
    return out;
  } catch (...) {
    stop_all(opts_.shutdown_daemons);
    throw;
  }
}

}  // namespace

nlohmann::json train_pipeline(const TrainConfig& config, const ClusterOptions& cluster) {
  Driver driver(config, cluster);
  return driver.run();
}

}  // namespace cleave
