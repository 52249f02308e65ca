// planner.cpp: the cost model and the exact search (docs/planner.md).
//
// Search outline: a threshold test feasible(T) answers "is there a plan whose
// every stage and cut costs <= T" exactly, by dynamic programming over
// (set of devices used by a suffix of the pipeline, first device of that
// suffix) with the start positions that suffix can have kept as a bitset. The
// optimal bottleneck T* is one of finitely many candidate values (a stage's
// compute time or a cut's transfer time), so T* is found by testing candidates:
// a feasible test yields a device sequence whose optimal split (exact, per
// sequence) lowers the upper bound, an infeasible one raises the lower bound.
// After a feasible test the next one probes just below the new incumbent (often
// optimal, so that test is the proof); after an infeasible one it bisects. A
// test stores only live states, contiguously per level, to stay in cache.
#include "core/planner/planner.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <memory>


#include "core/planner/plan_report.h"

namespace cleave {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string device_label(const Cluster& c, int k) { return "device " + std::to_string(k) + " ('" + c.devices[k].name + "')"; }

bool finite_nonneg(double v) { return std::isfinite(v) && v >= 0; }

// Bytes on the wire per float32 value: 1 (f32), 0.5 (f16), 0.25 (int8).
double encoding_factor(transport::Encoding e) {
  return static_cast<double>(transport::encoded_element_size(e)) / sizeof(float);
}

// The forward's share of a layer's measured forward + backward time, by the
// profile's FLOPs (backward = 2x forward with parameters, 1x without).
double forward_share(const LayerProfile& l) {
  if (l.fwd_flops + l.bwd_flops > 0) return static_cast<double>(l.fwd_flops) / static_cast<double>(l.fwd_flops + l.bwd_flops);
  return l.param_count > 0 ? 1.0 / 3 : 0.5;
}

// The share of a layer's forward + backward time its W step takes (ZB-H1), by FLOPs.
double weight_share(const LayerProfile& l) {
  return l.fwd_flops + l.bwd_flops > 0
             ? static_cast<double>(l.weight_grad_flops) / static_cast<double>(l.fwd_flops + l.bwd_flops)
             : 0.0;
}

// Prefix sums of measured per-layer times `t` (one per layer of `model`, each
// >= 0) and of their forward shares (and W shares, when asked). Errors name the device (`label`) and
// the `kind` of times ("measured", "measured per-micro-batch").
void add_measured_times(const ModelProfile& model, const std::vector<double>& t, const std::string& label,
                        const std::string& kind, std::vector<double>& prefix, std::vector<double>& prefix_forward,
                        std::vector<double>* prefix_weight) {
  const int n = model.num_layers();
  if (static_cast<int>(t.size()) != n)
    throw PlanError(label + ": " + std::to_string(t.size()) + " " + kind + " layer times for a model of " +
                    std::to_string(n) + " layers");
  for (int i = 0; i < n; ++i) {
    if (!finite_nonneg(t[i])) throw PlanError(label + ": " + kind + " time of layer " + std::to_string(i) + " must be >= 0");
    prefix[i + 1] = prefix[i] + t[i];
    prefix_forward[i + 1] = prefix_forward[i] + t[i] * forward_share(model.layers[i]);
    if (prefix_weight) (*prefix_weight)[i + 1] = (*prefix_weight)[i] + t[i] * weight_share(model.layers[i]);
  }
}

void check_link(const LinkProfile& l, const std::string& what) {
  if (!std::isfinite(l.mbps) || l.mbps <= 0)
    throw PlanError(what + ": bandwidth must be a positive number of Mbit/s, got " + std::to_string(l.mbps));
  if (!finite_nonneg(l.latency_ms))
    throw PlanError(what + ": latency must be >= 0 ms, got " + std::to_string(l.latency_ms));
  if (l.cpu_mbps && !(std::isfinite(*l.cpu_mbps) && *l.cpu_mbps > 0))
    throw PlanError(what + ": cpu_mbps must be a positive number of Mbit/s, got " + std::to_string(*l.cpu_mbps));
}

// The machines that devices share (DeviceProfile::host): how many of the
// cluster's devices compute on each, with how many threads, on how many cores.
struct Host {
  int devices = 0;
  double threads = 0, cores = 0;
};

std::map<std::string, Host> shared_hosts(const Cluster& cluster) {
  std::map<std::string, Host> hosts;
  for (const DeviceProfile& d : cluster.devices) {
    if (d.host.empty() || d.cpu_threads <= 0 || d.host_cores <= 0) continue;
    Host& h = hosts[d.host];
    ++h.devices;
    h.threads += d.cpu_threads;
    h.cores = std::max(h.cores, d.host_cores);
  }
  return hosts;
}

// Per device: whether it shares a machine whose devices' compute threads take
// all its cores, so that its link threads take their core from a stage's compute.
std::vector<bool> cores_taken(const Cluster& cluster) {
  const std::map<std::string, Host> hosts = shared_hosts(cluster);
  std::vector<bool> out;
  for (const DeviceProfile& d : cluster.devices) {
    auto it = hosts.find(d.host);
    out.push_back(it != hosts.end() && it->second.devices >= 2 && it->second.threads >= it->second.cores);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// CostModel

CostModel::CostModel(const ModelProfile& model, const Cluster& cluster, const PlanOptions& options)
    : model_(&model), cluster_(&cluster), options_(options), n_(model.num_layers()), d_(cluster.num_devices()) {
  if (n_ == 0) throw PlanError("the model has no layers");
  if (d_ == 0) throw PlanError("no devices to plan for");
  if (d_ > kMaxPlannerDevices)
    throw PlanError(std::to_string(d_) + " devices: the exact planner handles at most " +
                    std::to_string(kMaxPlannerDevices));
  if (options.microbatches < 1) throw PlanError("--microbatches must be >= 1, got " + std::to_string(options.microbatches));
  if (options.batch < options.microbatches)
    throw PlanError("--batch (" + std::to_string(options.batch) + ") must be at least --microbatches (" +
                    std::to_string(options.microbatches) + ")");
  if (options.max_stages < 0) throw PlanError("max stages must be >= 0 (0: no limit)");
  batch_ = options.batch;
  mb_ = (options.batch + options.microbatches - 1) / options.microbatches;
  microbatches_ = options.microbatches;

  for (int i = 0; i < n_; ++i) {
    const LayerProfile& l = model.layers[i];
    if (l.fwd_flops < 0 || l.bwd_flops < 0 || l.param_bytes < 0 || l.grad_bytes < 0 || l.optimizer_state_bytes < 0 ||
        l.out_act_bytes < 0 || l.stash_bytes < 0 || l.workspace_bytes < 0)
      throw PlanError("layer " + std::to_string(i) + " (" + l.type + "): negative FLOPs or bytes in its profile");
  }
  if (model.input_bytes_per_sample < 0) throw PlanError("negative model input size");

  prefix_seconds_.assign(d_, std::vector<double>(n_ + 1, 0.0));
  prefix_update_.assign(d_, std::vector<double>(n_ + 1, 0.0));
  prefix_forward_.assign(d_, std::vector<double>(n_ + 1, 0.0));
  prefix_weight_.assign(d_, std::vector<double>(n_ + 1, 0.0));
  prefix_fixed_.assign(d_, std::vector<double>(n_ + 1, 0.0));
  prefix_forward_fixed_.assign(d_, std::vector<double>(n_ + 1, 0.0));
  memory_.resize(d_);
  for (int k = 0; k < d_; ++k) {
    const DeviceProfile& dev = cluster.devices[k];
    if (dev.memory_bytes < 0) throw PlanError(device_label(cluster, k) + ": negative memory");
    memory_[k] = dev.memory_bytes;
    if (!finite_nonneg(dev.update_seconds_per_param))
      throw PlanError(device_label(cluster, k) + ": update_seconds_per_param must be >= 0");
    for (int i = 0; i < n_; ++i)
      prefix_update_[k][i + 1] =
          prefix_update_[k][i] + static_cast<double>(model.layers[i].param_count) * dev.update_seconds_per_param;
    const bool measured = dev.layer_seconds_per_sample.has_value();
    if (measured) {
      add_measured_times(model, *dev.layer_seconds_per_sample, device_label(cluster, k), "measured", prefix_seconds_[k],
                         prefix_forward_[k], &prefix_weight_[k]);
      if (dev.layer_seconds_per_microbatch)
        add_measured_times(model, *dev.layer_seconds_per_microbatch, device_label(cluster, k),
                           "measured per-micro-batch", prefix_fixed_[k], prefix_forward_fixed_[k], nullptr);
    } else {
      if (dev.layer_seconds_per_microbatch)
        throw PlanError(device_label(cluster, k) + ": per-micro-batch layer times need per-sample layer times too");
      if (!std::isfinite(dev.gflops) || dev.gflops <= 0)
        throw PlanError(device_label(cluster, k) + ": gflops must be a positive number, got " + std::to_string(dev.gflops));
      const double flops_per_second = dev.gflops * 1e9;
      for (int i = 0; i < n_; ++i) {
        const LayerProfile& l = model.layers[i];
        prefix_seconds_[k][i + 1] =
            prefix_seconds_[k][i] + static_cast<double>(l.fwd_flops + l.bwd_flops) / flops_per_second;
        prefix_forward_[k][i + 1] = prefix_forward_[k][i] + static_cast<double>(l.fwd_flops) / flops_per_second;
        prefix_weight_[k][i + 1] = prefix_weight_[k][i] + static_cast<double>(l.weight_grad_flops) / flops_per_second;
      }
    }
  }

  check_link(cluster.default_link, "default link");
  for (const auto& [key, l] : cluster.links) {
    if (key.first < 0 || key.first >= d_ || key.second < 0 || key.second >= d_)
      throw PlanError("a link names a device index outside the cluster");
    check_link(l, "link " + cluster.devices[key.first].name + " -> " + cluster.devices[key.second].name);
  }
  link_latency_.assign(static_cast<size_t>(d_) * d_, 0.0);
  link_per_byte_.assign(static_cast<size_t>(d_) * d_, 0.0);
  link_cpu_per_byte_.assign(static_cast<size_t>(d_) * d_, 0.0);
  const std::vector<bool> busy = cores_taken(cluster);
  for (int a = 0; a < d_; ++a)
    for (int b = 0; b < d_; ++b) {
      if (a == b) continue;
      const LinkProfile& ab = cluster.link(a, b);
      const double encoded = encoding_factor(ab.encoding.value_or(options.encoding));
      link_latency_[a * d_ + b] = ab.latency_ms * 1e-3;
      link_per_byte_[a * d_ + b] = encoded / (ab.mbps * 1e6 / 8);
      if (busy[a] && busy[b] && cluster.devices[a].host == cluster.devices[b].host)
        link_cpu_per_byte_[a * d_ + b] = encoded / (ab.cpu_mbps.value_or(ab.mbps) * 1e6 / 8);
    }

  std::vector<std::optional<Backend>> backends;
  for (int k = 0; k < d_; ++k) {
    const std::optional<Backend>& b = cluster.devices[k].backend;
    auto it = std::find(backends.begin(), backends.end(), b);
    if (it == backends.end()) {
      backends.push_back(b);
      stage_models_.emplace_back(model, mb_, b);
      it = backends.end() - 1;
    }
    device_model_.push_back(static_cast<int>(it - backends.begin()));
  }
}

bool CostModel::recomputes(int device, int begin, int end, int in_flight) const {
  if (options_.recompute != Recompute::when_needed) return options_.recompute == Recompute::all;
  return stage_recomputes(options_.recompute, stage_memory(device, begin, end, in_flight, false).total(), memory_[device]);
}

double CostModel::transfer_seconds(int from, int to, int cut) const {
  const LinkTimes l = link_times(from, to, cut);
  return microbatches_ * (l.activation + l.gradient);
}

LinkTimes CostModel::link_times(int from, int to, int cut) const {
  const double bytes = static_cast<double>(batch_) / microbatches_ * static_cast<double>(model_->layers[cut - 1].out_act_bytes);
  const size_t there = static_cast<size_t>(from) * d_ + to, back = static_cast<size_t>(to) * d_ + from;
  // The planner's link model: every message pays the latency on its link.
  // Each end pays half of each message's CPU, its send's and its receive's.
  const double cpu = 0.25 * bytes * (link_cpu_per_byte_[there] + link_cpu_per_byte_[back]);
  return {link_latency_[there] + bytes * link_per_byte_[there], link_latency_[back] + bytes * link_per_byte_[back], 0.0,
          cpu, cpu};
}

StageTimes CostModel::stage_times(int device, int begin, int end, int in_flight) const {
  StageTimes t;
  t.optimizer = prefix_update_[device][end] - prefix_update_[device][begin];
  // compute_seconds, recompute_seconds (the forward) and weight_seconds are
  // per batch of M micro-batches; the optimizer step is once per batch.
  t.forward = recompute_seconds(device, begin, end) / microbatches_;
  t.backward_weight = weight_seconds(device, begin, end) / microbatches_;
  const double pass = (compute_seconds(device, begin, end) - t.optimizer) / microbatches_;
  t.backward_input = std::max(0.0, pass - t.forward - t.backward_weight);
  if (recomputes(device, begin, end, in_flight)) t.backward_input += t.forward;
  return t;
}

std::vector<StageTimes> CostModel::stage_times(const std::vector<int>& devices, const std::vector<int>& cuts) const {
  const int p = static_cast<int>(devices.size());
  std::vector<StageTimes> stages;
  for (int s = 0; s < p; ++s) stages.push_back(stage_times(devices[s], cuts[s], cuts[s + 1], in_flight(p, s)));
  return stages;
}

std::vector<LinkTimes> CostModel::pipeline_links(const std::vector<int>& devices, const std::vector<int>& cuts) const {
  std::vector<LinkTimes> links, free_cpu;
  bool cpu = false;
  for (size_t s = 0; s + 1 < devices.size(); ++s) {
    links.push_back(link_times(devices[s], devices[s + 1], cuts[s + 1]));
    cpu = cpu || links.back().cpu_before > 0 || links.back().cpu_after > 0;
    free_cpu.push_back(links.back());
    free_cpu.back().cpu_before = free_cpu.back().cpu_after = 0;
  }
  if (!cpu) return links;
  // A link thread takes a stage's core only while the other stage of the cut
  // computes too (else the idle core runs it): each end's part is scaled by
  // how busy the other end is when the links' CPU is free.
  const SimulatedPipeline first =
      simulate_pipeline(options_.schedule, options_.microbatches, stage_times(devices, cuts), free_cpu);
  auto busy = [&](size_t s) {
    return first.batch_seconds > 0 ? std::min(1.0, first.busy_seconds[s] / first.batch_seconds) : 1.0;
  };
  for (size_t s = 0; s < links.size(); ++s) {
    links[s].cpu_before *= busy(s + 1);
    links[s].cpu_after *= busy(s);
  }
  return links;
}

double CostModel::pipeline_seconds(const std::vector<int>& devices, const std::vector<int>& cuts,
                                   const std::vector<LinkTimes>& links) const {
  return simulate_pipeline(options_.schedule, options_.microbatches, stage_times(devices, cuts), links).batch_seconds;
}

double CostModel::transfer_bytes(int from, int to, int cut) const {
  const LinkProfile& l = cluster_->link(from, to);
  return static_cast<double>(batch_) * static_cast<double>(model_->layers[cut - 1].out_act_bytes) *
         encoding_factor(l.encoding.value_or(options_.encoding));
}

int CostModel::in_flight(int num_stages, int stage) const {
  return max_in_flight(options_.schedule, stage, num_stages, options_.microbatches);
}

double CostModel::bubble(int num_stages, double weight_share) const {
  return bubble_fraction(options_.schedule, num_stages, options_.microbatches, weight_share);
}

// ---------------------------------------------------------------------------
// Evaluating an assignment

Plan evaluate_plan(const CostModel& cost, const std::vector<int>& devices, const std::vector<int>& cuts) {
  const int p = static_cast<int>(devices.size());
  const int n = cost.num_layers();
  if (p == 0 || static_cast<int>(cuts.size()) != p + 1 || cuts.front() != 0 || cuts.back() != n)
    throw PlanError("malformed assignment: need p devices and p + 1 cuts from 0 to the number of layers");
  std::vector<bool> used(cost.num_devices(), false);
  for (int s = 0; s < p; ++s) {
    if (cuts[s] >= cuts[s + 1]) throw PlanError("malformed assignment: empty or reversed stage " + std::to_string(s));
    if (devices[s] < 0 || devices[s] >= cost.num_devices() || used[devices[s]])
      throw PlanError("malformed assignment: stage " + std::to_string(s) + " has an invalid or repeated device");
    used[devices[s]] = true;
  }
  const Cluster& cluster = cost.cluster();
  const ModelProfile& model = cost.model();
  Plan out;
  out.options = cost.options();
  out.microbatch_size = cost.microbatch_size();
  double bottleneck = 0, weight_seconds = 0, compute_seconds = 0;
  const std::vector<LinkTimes> links = cost.pipeline_links(devices, cuts);
  const int m = cost.options().microbatches;
  for (int s = 0; s < p; ++s) {
    StagePlan st;
    st.device = devices[s];
    st.device_name = cluster.devices[st.device].name;
    st.begin = cuts[s];
    st.end = cuts[s + 1];
    for (int i = st.begin; i < st.end; ++i) st.params += model.layers[i].param_count;
    st.in_flight = cost.in_flight(p, s);
    st.memory = cost.stage_memory(st.device, st.begin, st.end, st.in_flight);
    st.recompute = st.memory.recompute;
    st.weight_state_bytes = static_cast<int64_t>(st.memory.weight_state());
    st.memory_bytes = static_cast<int64_t>(st.memory.total());
    st.memory_available = cost.device_memory(st.device);
    st.compute_seconds = cost.stage_seconds(st.device, st.begin, st.end, st.in_flight);
    if (s + 1 < p) {
      st.transfer_seconds = cost.transfer_seconds(st.device, devices[s + 1], st.end);
      st.transfer_bytes = cost.transfer_bytes(st.device, devices[s + 1], st.end);
    }
    // Each micro-batch sends one message and receives one over each of its cuts.
    if (s + 1 < p) st.link_cpu_seconds += 2 * m * links[s].cpu_before;
    if (s > 0) st.link_cpu_seconds += 2 * m * links[s - 1].cpu_after;
    bottleneck = std::max({bottleneck, st.compute_seconds, st.transfer_seconds});
    weight_seconds += cost.weight_seconds(st.device, st.begin, st.end);
    compute_seconds += st.compute_seconds;
    out.stages.push_back(std::move(st));
  }
  for (StagePlan& st : out.stages) {
    if (st.compute_seconds == bottleneck) {
      st.bottleneck = true;
      st.bottleneck_kind = "compute";
    } else if (st.transfer_seconds == bottleneck) {
      st.bottleneck = true;
      st.bottleneck_kind = "transfer";
    }
  }
  for (int k = 0; k < cost.num_devices(); ++k)
    if (!used[k]) out.unused_devices.push_back(cluster.devices[k].name);
  out.bottleneck_seconds = bottleneck;
  // ZB-H1's bubble depends on how much of the stages' time their W's take.
  out.weight_share = compute_seconds > 0 ? weight_seconds / compute_seconds : 0.0;
  // The simulation queues each direction of a cut on its own; the bottleneck
  // holds the planner's half-duplex view of a busy cut (both directions).
  out.batch_seconds = std::max(bottleneck, cost.pipeline_seconds(devices, cuts, links));
  out.samples_per_second = out.batch_seconds > 0 ? static_cast<double>(cost.options().batch) / out.batch_seconds : kInf;
  return out;
}

Plan plan_shared_hosts(const ModelProfile& model, const Cluster& cluster, const PlanOptions& options) {
  const std::map<std::string, Host> hosts = shared_hosts(cluster);
  // More threads than cores share the cores out; devices that fit the cores
  // still slow each other down by their measured host_contention.
  auto slowdown = [&](const DeviceProfile& d, int p) {
    auto it = hosts.find(d.host);
    if (d.host.empty() || d.cpu_threads <= 0 || it == hosts.end()) return 1.0;
    const Host& h = it->second;
    const int sharing = std::min(p, h.devices);
    const double contention = sharing >= 2 ? std::max(1.0, d.host_contention.value_or(1.0)) : 1.0;
    return std::max({1.0, sharing * (h.threads / h.devices) / h.cores, contention});
  };
  const int most = options.max_stages > 0 ? std::min(options.max_stages, cluster.num_devices()) : cluster.num_devices();
  bool contention = false;
  for (const DeviceProfile& d : cluster.devices) contention = contention || slowdown(d, most) > 1.0;
  if (!contention) return plan(model, cluster, options);

  std::optional<Plan> best;
  std::optional<PlanError> last_error;  // the one with the most stages allowed
  for (int p = 1; p <= most; ++p) {
    Cluster scaled = cluster;
    double worst = 1;
    for (DeviceProfile& d : scaled.devices) {
      const double f = slowdown(d, p);
      worst = std::max(worst, f);
      d.gflops /= f;
      d.update_seconds_per_param *= f;
      for (auto* times : {&d.layer_seconds_per_sample, &d.layer_seconds_per_microbatch})
        if (*times)
          for (double& t : **times) t *= f;
    }
    PlanOptions o = options;
    o.max_stages = p;
    try {
      Plan candidate = plan(model, scaled, o);
      candidate.options.max_stages = options.max_stages;
      candidate.shared_host_slowdown = worst;
      if (!best || candidate.batch_seconds < best->batch_seconds) best = std::move(candidate);
    } catch (const PlanError& e) {
      last_error = e;
    }
  }
  if (!best) throw *last_error;
  return *best;
}

Plan plan_microbatches(const ModelProfile& model, const Cluster& cluster, const PlanOptions& options) {
  if (!options.microbatches_auto) return plan_shared_hosts(model, cluster, options);
  if (options.batch < 1) throw PlanError("--batch must be >= 1, got " + std::to_string(options.batch));
  std::optional<Plan> best;
  std::optional<PlanError> last_error;  // the one with the most micro-batches
  int searched = 0;
  for (int64_t m = 1; m <= std::min<int64_t>(options.batch, std::numeric_limits<int>::max()); ++m) {
    PlanOptions o = options;
    o.microbatches = static_cast<int>(m);
    try {
      Plan candidate = plan_shared_hosts(model, cluster, o);
      searched += candidate.search_runs;
      if (!best || candidate.batch_seconds < best->batch_seconds) best = std::move(candidate);
    } catch (const PlanError& e) {
      last_error = e;
    }
  }
  if (!best)
    throw PlanError(std::string(last_error->what()) + " (--microbatches auto: no micro-batch count from 1 to " +
                    std::to_string(options.batch) + " fits; this is the error at " + std::to_string(options.batch) + ")");
  best->search_runs = searched;
  return *best;
}

// ---------------------------------------------------------------------------
// The exact search

namespace {

using Word = uint64_t;

// What a set of devices can hold: reference work (within the threshold) and bytes.
struct Budget {
  double work;
  int64_t mem;
};

class Search {
 public:
  explicit Search(const CostModel& cost) : c_(cost), n_(cost.num_layers()), d_(cost.num_devices()) {
    const PlanOptions& o = cost.options();
    max_stages_ = std::min(d_, n_);
    if (o.max_stages > 0) max_stages_ = std::min(max_stages_, o.max_stages);
    words_ = (n_ + 63) / 64;
    // The in-flight counts a stage can have: under GPipe and 1F1B the schedule's rule depends
    // on the stages from it to the last only, grows with them and then stays (schedule.h), so
    // the first stage of a suffix of k stages has f_of(fi_of(k)), and nf_ counts the distinct
    // values. Under ZB-H1 every stage keeps min(p, M), p unknown while a suffix grows: the
    // search counts its most, min(max_stages_, M), on every stage (an upper bound: its plans
    // fit; docs/planner.md).
    nf_ = 1;
    flight_stages_ = in_flight_by_suffix(o.schedule) ? 0 : max_stages_;
    while (flight_stages_ == 0 && nf_ < max_stages_ && cost.in_flight(nf_ + 1, 0) != cost.in_flight(nf_, 0)) ++nf_;

    // g_mem_[(k * nf + fi) * (n + 1) + i]: smallest start h such that [h, i) fits device k's
    // memory with f(fi) micro-batches in flight; i when not even [i - 1, i) fits.
    g_mem_.assign(static_cast<size_t>(d_) * nf_ * (n_ + 1), 0);
    for (int k = 0; k < d_; ++k)
      for (int fi = 0; fi < nf_; ++fi)
        for (int i = 1; i <= n_; ++i) {
          int lo = 0, hi = i;  // answer in [lo, hi]; hi means none
          while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (c_.memory_bytes(k, mid, i, f_of(fi)) <= c_.device_memory(k)) hi = mid; else lo = mid + 1;
          }
          g_mem_[gidx(k, fi, i)] = lo;
        }
    // g_plain_[same index]: smallest start h such that [h, i) runs without recomputing
    // (CostModel::recomputes, monotone in h like the memory): 0 for none, past every
    // start for all, the memory model without recomputation against the device for auto.
    g_plain_.assign(g_mem_.size(), o.recompute == Recompute::all ? n_ + 1 : 0);
    if (o.recompute == Recompute::when_needed)
      for (int k = 0; k < d_; ++k)
        for (int fi = 0; fi < nf_; ++fi)
          for (int i = 1; i <= n_; ++i) {
            int lo = 0, hi = i;
            while (lo < hi) {
              const int mid = (lo + hi) / 2;
              if (c_.recomputes(k, mid, i, f_of(fi))) lo = mid + 1; else hi = mid;
            }
            g_plain_[gidx(k, fi, i)] = lo;
          }
    g_.resize(g_mem_.size());
    // trans_[(a * d + b) * (n + 1) + i]: transfer_seconds(a, b, i) for 1 <= i < n.
    trans_.assign(static_cast<size_t>(d_) * d_ * (n_ + 1), kInf);
    for (int a = 0; a < d_; ++a)
      for (int b = 0; b < d_; ++b)
        if (a != b)
          for (int i = 1; i < n_; ++i) trans_[tidx(a, b, i)] = c_.transfer_seconds(a, b, i);
    single_.assign(static_cast<size_t>(d_) * nf_ * words_, 0);
    link_mask_.assign(static_cast<size_t>(d_) * d_ * words_, 0);

    // Reference work for the capacity bound: tau_l = fastest device's time for layer l (per batch),
    // rho_k = max_l tau_l / t_lk, so each stage on k holds at most rho_k * T of reference work.
    tau_prefix_.assign(n_ + 1, 0.0);
    rho_.assign(d_, 0.0);
    cap_.assign(d_, 0.0);
    const size_t chunks = (static_cast<size_t>(d_) + 7) / 8;
    cap_sum_.assign(chunks << 8, 0.0);
    mem_sum_.assign(chunks << 8, 0);
    for (size_t c = 0; c < chunks; ++c)
      for (uint32_t m = 1; m < 256; ++m) {
        const int k = static_cast<int>(8 * c) + std::countr_zero(m);
        mem_sum_[(c << 8) | m] = mem_sum_[(c << 8) | (m & (m - 1))] + (k < d_ ? c_.device_memory(k) : 0);
      }
    fixed_prefix_.assign(n_ + 1, 0);
    for (int i = 0; i <= n_; ++i) fixed_prefix_[i] = c_.fixed_bytes(0, i);
    std::vector<double> tau(n_);
    for (int i = 0; i < n_; ++i) {
      double t = kInf;
      for (int k = 0; k < d_; ++k) t = std::min(t, c_.compute_seconds(k, i, i + 1));
      tau[i] = t;
      tau_prefix_[i + 1] = tau_prefix_[i] + t;
    }
    for (int k = 0; k < d_; ++k)
      for (int i = 0; i < n_; ++i) {
        const double t = c_.compute_seconds(k, i, i + 1);
        if (t > 0) rho_[k] = std::max(rho_[k], tau[i] / t);
      }

    // At most d * 2^(d - 1) states (S, k in S), each a bitset of words_ words.
    const size_t states = (size_t{1} << (d_ - 1)) * static_cast<size_t>(d_) * words_;
    if (states * sizeof(Word) > (size_t{512} << 20))
      throw PlanError(std::to_string(d_) + " devices x " + std::to_string(n_) +
                      " layers is too large for the exact planner (its tables would need " +
                      std::to_string((states * sizeof(Word)) >> 20) + " MiB; the limit is 512 MiB)");
    present_.assign(size_t{1} << d_, 0);
    offset_.assign(size_t{1} << d_, 0);
    bits_.reset(new Word[states]);  // only the pages a pass reaches get touched
    touch_.assign(size_t{1} << d_, 0);
  }

  int max_stages() const { return max_stages_; }

  // Exact test: is there a plan whose stages and cuts all cost <= t?
  // On success, found_set_/found_first_ is a full-cover state with the fewest stages.
  bool feasible(double t) {
    ++runs_;
    threshold_ = t;
    prepare(t);
    switch (words_) {
      case 1: return pass<1>();
      case 2: return pass<2>();
      case 3: return pass<3>();
      case 4: return pass<4>();
      default: return pass<0>();
    }
  }

  // After a successful feasible(): a device sequence and cuts with every cost <= threshold.
  void extract(std::vector<int>& devices, std::vector<int>& cuts) const {
    devices.clear();
    cuts.assign(1, 0);
    uint32_t set = found_set_;
    int k = found_first_, h = 0;
    while (true) {
      devices.push_back(k);
      const uint32_t rest = set & ~(1u << k);
      if (rest == 0) {
        cuts.push_back(n_);
        return;
      }
      const int fi = fi_of(std::popcount(set));
      double best = kInf;
      int best_next = -1, best_cut = -1;
      for (uint32_t bits = present_[rest]; bits; bits &= bits - 1) {
        const int k2 = std::countr_zero(bits);
        const Word* r = state(rest, k2);
        const Word* mask = link(k, k2);
        for (int i = h + 1; i < n_; ++i) {
          if (!test(r, i) || !test(mask, i) || g_[gidx(k, fi, i)] > h) continue;
          const double v = std::max(cost(k, fi, h, i), trans_[tidx(k, k2, i)]);
          if (v < best) {
            best = v;
            best_next = k2;
            best_cut = i;
          }
        }
      }
      if (best_next < 0) throw std::logic_error("planner: inconsistent search tables while extracting a plan");
      cuts.push_back(best_cut);
      set = rest;
      k = best_next;
      h = best_cut;
    }
  }

  // The best split of layers over exactly this device sequence (exact); returns
  // the bottleneck (kInf when nothing fits) and fills cuts.
  double best_split(const std::vector<int>& seq, std::vector<int>& cuts) const {
    const int p = static_cast<int>(seq.size());
    if (p > n_) return kInf;
    std::vector<double> best((p + 1) * static_cast<size_t>(n_ + 1), kInf);
    std::vector<int> arg((p + 1) * static_cast<size_t>(n_ + 1), -1);
    auto at = [&](int s, int j) { return static_cast<size_t>(s) * (n_ + 1) + j; };
    best[at(0, 0)] = 0;
    for (int s = 0; s < p; ++s) {
      const int k = seq[s];
      const int fi = fi_of(p - s);
      const int* gm = &g_mem_[gidx(k, fi, 0)];
      for (int j = s + 1; j <= n_ - (p - 1 - s); ++j) {
        double bv = kInf;
        int ba = -1;
        for (int i = j - 1; i >= s; --i) {
          if (i < gm[j]) break;  // [i, j) does not fit k's memory with its in-flight count
          const double comp = cost(k, fi, i, j);
          if (comp >= bv) break;
          const double prev = best[at(s, i)];
          if (prev == kInf) continue;
          const double v = std::max({prev, comp, s > 0 ? trans_[tidx(seq[s - 1], k, i)] : 0.0});
          if (v < bv) {
            bv = v;
            ba = i;
          }
        }
        best[at(s + 1, j)] = bv;
        arg[at(s + 1, j)] = ba;
      }
    }
    const double result = best[at(p, n_)];
    if (result == kInf) return kInf;
    cuts.assign(p + 1, 0);
    cuts[p] = n_;
    for (int s = p; s > 0; --s) cuts[s - 1] = arg[at(s, cuts[s])];
    return result;
  }

  // Every value the optimal bottleneck can take in [lo, hi): stage compute times
  // (with and without the recomputed forward, for any in-flight count) and cut
  // transfer times.
  std::vector<double> candidates(double lo, double hi) const {
    std::vector<double> out;
    const bool recomputing = c_.options().recompute != Recompute::none;
    for (int k = 0; k < d_; ++k)
      for (int h = 0; h < n_; ++h)
        for (int i = h + 1; i <= n_; ++i) {
          const double v = c_.compute_seconds(k, h, i);
          if (v >= hi) break;
          if (v >= lo) out.push_back(v);
          const double r = v + c_.recompute_seconds(k, h, i);
          if (recomputing && r >= lo && r < hi) out.push_back(r);
        }
    for (int a = 0; a < d_; ++a)
      for (int b = 0; b < d_; ++b) {
        if (a == b) continue;
        for (int i = 1; i < n_; ++i) {
          const double v = trans_[tidx(a, b, i)];
          if (v >= lo && v < hi) out.push_back(v);
        }
      }
    return out;
  }

  // A valid lower bound on every plan's bottleneck.
  double lower_bound() const {
    double lb = 0;
    for (int i = 0; i < n_; ++i) lb = std::max(lb, tau_prefix_[i + 1] - tau_prefix_[i]);
    double rho = 0;
    for (int k = 0; k < d_; ++k) rho += rho_[k];
    if (rho > 0) lb = std::max(lb, tau_prefix_[n_] / rho);
    return lb * (1 - 1e-9);
  }

  // Devices ordered by speed (then memory), fastest first: the heuristic's order.
  std::vector<int> speed_order() const {
    std::vector<int> order(d_);
    for (int k = 0; k < d_; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (rho_[a] != rho_[b]) return rho_[a] > rho_[b];
      return c_.device_memory(a) > c_.device_memory(b);
    });
    return order;
  }

  // reach[(k * nf + fi) * (n + 1) + h]: the farthest end e such that the stage [h, e)
  // on k costs < t (strict) or <= t and fits k's memory with in-flight index fi; h
  // when none. e is nondecreasing in h (g is), so each row is one sweep.
  void build_reach(double t, bool strict, std::vector<int>& reach) const {
    reach.assign(static_cast<size_t>(d_) * nf_ * (n_ + 1), 0);
    for (int k = 0; k < d_; ++k)
      for (int fi = 0; fi < nf_; ++fi) {
        const int* gm = &g_mem_[gidx(k, fi, 0)];
        int* row = &reach[gidx(k, fi, 0)];
        int e = 0;
        for (int h = 0; h < n_; ++h) {
          e = std::max(e, h);
          while (e < n_ && gm[e + 1] <= h) {
            const double v = cost(k, fi, h, e + 1);
            if (strict ? !(v < t) : !(v <= t)) break;
            ++e;
          }
          row[h] = e;
        }
        row[n_] = n_;
      }
  }

  // Does this device sequence admit a split with every cost < t (strict) or <= t?
  // `reach` is build_reach(t, strict). O(p * n): the ends reachable from the starts
  // of a stage are the union of the intervals (h, reach(h)].
  bool sequence_feasible(const std::vector<int>& seq, double t, bool strict, const std::vector<int>& reach) const {
    const int p = static_cast<int>(seq.size());
    if (p > n_ || p == 0) return false;
    std::vector<char>& starts = seq_starts_;
    std::vector<char>& ends = seq_ends_;
    starts.assign(n_ + 1, 0);
    ends.assign(n_ + 1, 0);
    starts[0] = 1;
    for (int s = 0; s < p; ++s) {
      const int* e = &reach[gidx(seq[s], fi_of(p - s), 0)];
      int covered = 0;  // ends (.., covered] marked
      for (int h = 0; h < n_; ++h) {
        if (!starts[h] || e[h] <= covered) continue;
        for (int j = std::max(h + 1, covered + 1); j <= e[h]; ++j) ends[j] = 1;
        covered = e[h];
      }
      if (s == p - 1) return ends[n_] != 0;
      bool any = false;
      const double* tr = &trans_[tidx(seq[s], seq[s + 1], 0)];
      for (int j = 0; j <= n_; ++j) {
        const bool ok = j > 0 && j < n_ && ends[j] && (strict ? tr[j] < t : tr[j] <= t);
        starts[j] = ok;
        any |= ok;
        ends[j] = 0;
      }
      if (!any) return false;
    }
    return false;
  }

  // Hill climbing over device sequences (swap, replace, insert, remove a device):
  // accepts a neighbour whose best split has a lower bottleneck, or the same with
  // fewer stages. Improves an upper bound; optimality comes from the passes.
  double improve(std::vector<int>& seq, std::vector<int>& cuts, double value) const {
    std::vector<int> nb, nb_cuts, reach_lt, reach_le;
    for (int round = 0; round < 64; ++round) {
      build_reach(value, true, reach_lt);
      build_reach(value, false, reach_le);
      std::vector<bool> used(d_, false);
      for (int k : seq) used[k] = true;
      const int p = static_cast<int>(seq.size());
      bool moved = false;
      auto consider = [&](const std::vector<int>& cand) {
        const bool fewer = cand.size() < seq.size();
        if (!sequence_feasible(cand, value, !fewer, fewer ? reach_le : reach_lt)) return false;
        const double v = best_split(cand, nb_cuts);
        if (v < value || (fewer && v == value)) {
          seq = cand;
          cuts = nb_cuts;
          value = v;
          return true;
        }
        return false;
      };
      for (int i = 0; i < p && !moved; ++i) {  // remove
        if (p == 1) break;
        nb = seq;
        nb.erase(nb.begin() + i);
        moved = consider(nb);
      }
      for (int i = 0; i < p && !moved; ++i)  // swap
        for (int j = i + 1; j < p && !moved; ++j) {
          nb = seq;
          std::swap(nb[i], nb[j]);
          moved = consider(nb);
        }
      for (int u = 0; u < d_ && !moved; ++u) {  // replace or insert an unused device
        if (used[u]) continue;
        for (int i = 0; i < p && !moved; ++i) {
          nb = seq;
          nb[i] = u;
          moved = consider(nb);
        }
        for (int i = 0; i <= p && !moved && p < max_stages_; ++i) {
          nb = seq;
          nb.insert(nb.begin() + i, u);
          moved = consider(nb);
        }
      }
      if (!moved) break;
    }
    return value;
  }

  int runs() const { return runs_; }
  int found_stages() const { return std::popcount(found_set_); }

 private:
  // One pass of the subset DP, suffixes grown one stage at a time (every state of
  // c devices before any of c + 1), so the first full cover found has the fewest
  // stages. Only live states are stored: level by level, contiguously per set
  // (present_[set] says which first devices, offset_[set] where), which keeps a
  // pass in cache. Level c + 1 is pulled from level c: the state (T, u) is the
  // expansion on u of the ends that (T \ u, k) offers through the link u -> k.
  // W: words per bitset when known at compile time (0: words_).
  template <int W>
  bool pass() {
    const int nw = W > 0 ? W : words_;
    std::fill(present_.begin(), present_.end(), 0);
    for (const uint32_t target : targets_) touch_[target] = 0;  // an early return leaves some set
    targets_.clear();
    used_ = 0;
    level_.clear();
    found_set_ = 0;
    Word acc_small[W > 0 ? W : 1], out_small[W > 0 ? W : 1];
    std::vector<Word> big(W > 0 ? 0 : 2 * static_cast<size_t>(words_));
    Word* acc = W > 0 ? acc_small : big.data();
    Word* out = W > 0 ? out_small : big.data() + words_;
    const uint32_t full = (1u << d_) - 1;
    for (int k = 0; k < d_; ++k) {
      const int h0 = g_[gidx(k, fi_of(1), n_)];
      if (h0 > n_ - 1) continue;
      std::fill(out, out + nw, 0);
      set_range(out, h0, n_ - 1);
      const uint32_t set = 1u << k;
      apply_window<W>(out, max_stages_ > 1, budget(full & ~set));
      if (store<W>(set, k, out, level_)) return true;
    }
    for (int count = 1; count < max_stages_ && !level_.empty(); ++count) {
      // Every (T, u) with T \ u live at this level.
      targets_.clear();
      for (const uint32_t set : level_)
        for (uint32_t others = full & ~set; others; others &= others - 1) {
          const uint32_t up = others & (0u - others), target = set | up;
          if (touch_[target] == 0) targets_.push_back(target);
          touch_[target] |= up;
        }
      next_.clear();
      const int fi = fi_of(count + 1);
      const bool can_grow = count + 1 < max_stages_;
      for (const uint32_t target : targets_) {
        const uint32_t ups = touch_[target];
        touch_[target] = 0;
        bool have_budget = false;  // what the devices outside the target can hold, when first needed
        Budget room{};
        for (uint32_t bits = ups; bits; bits &= bits - 1) {
          const int u = std::countr_zero(bits);
          const uint32_t src_set = target & ~(1u << u);
          const Word* src = bits_.get() + offset_[src_set];
          std::fill(acc, acc + nw, 0);
          for (uint32_t firsts = present_[src_set]; firsts; firsts &= firsts - 1, src += nw) {
            const Word* mask = link(u, std::countr_zero(firsts));
            for (int w = 0; w < nw; ++w) acc[w] |= src[w] & mask[w];
          }
          Word any = 0;
          for (int w = 0; w < nw; ++w) any |= acc[w];
          if (!any) continue;
          expand<W>(u, fi, acc, out);
          if (can_grow && !have_budget) {
            room = budget(full & ~target);
            have_budget = true;
          }
          apply_window<W>(out, can_grow, room);
          if (store<W>(target, u, out, next_)) return true;
        }
      }
      level_.swap(next_);
    }
    return false;
  }

  // Keeps only the starts a state may still need: h = 0 (a complete plan) and, when
  // it can grow, every h whose prefix [0, h) fits `room` (the devices outside the
  // state). The test is monotone in h, so this keeps a prefix of the bits.
  template <int W>
  void apply_window(Word* out, bool can_grow, const Budget& room) const {
    const int nw = W > 0 ? W : words_;
    int h_max = 0;
    if (can_grow) {
      int top = -1;  // highest start present
      for (int w = nw - 1; w >= 0 && top < 0; --w)
        if (out[w]) top = 64 * w + 63 - std::countl_zero(out[w]);
      if (top < 0 || prefix_fits(room, top)) return;
      int lo = 0, hi = top - 1;  // h = 0 always fits
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (prefix_fits(room, mid)) lo = mid; else hi = mid - 1;
      }
      h_max = lo;
    }
    for (int w = 0; w < nw; ++w) {
      const int lo = 64 * w;
      if (h_max >= lo + 63) continue;
      out[w] &= h_max < lo ? 0 : (Word{2} << (h_max - lo)) - 1;
    }
  }

  // Appends state (set, first) with starts `out` (first devices must arrive in
  // increasing order per set); returns true when it covers layer 0.
  template <int W>
  bool store(uint32_t set, int first, const Word* out, std::vector<uint32_t>& level) {
    const int nw = W > 0 ? W : words_;
    Word any = 0;
    for (int w = 0; w < nw; ++w) any |= out[w];
    if (!any) return false;
    if (out[0] & 1) {
      found_set_ = set;
      found_first_ = first;
      return true;
    }
    if (present_[set] == 0) {
      offset_[set] = used_;
      level.push_back(set);
    }
    present_[set] |= 1u << first;
    std::copy(out, out + nw, bits_.get() + used_);
    used_ += static_cast<uint32_t>(nw);
    return false;
  }

  int f_of(int fi) const { return flight_stages_ > 0 ? c_.in_flight(flight_stages_, 0) : c_.in_flight(fi + 1, 0); }
  // Seconds of the stage [h, i) on device k with in-flight index fi: its compute,
  // plus the recomputed forward where it recomputes (CostModel::stage_seconds).
  // Nonincreasing in h and nondecreasing in i, as the search needs.
  double cost(int k, int fi, int h, int i) const {
    const double c = c_.compute_seconds(k, h, i);
    return h >= g_plain_[gidx(k, fi, i)] ? c : c + c_.recompute_seconds(k, h, i);
  }
  // Index of the in-flight count of the first stage of a suffix of `suffix_stages` stages.
  int fi_of(int suffix_stages) const { return std::min(suffix_stages, nf_) - 1; }
  size_t gidx(int k, int fi, int i) const { return (static_cast<size_t>(k) * nf_ + fi) * (n_ + 1) + i; }
  size_t tidx(int a, int b, int i) const { return (static_cast<size_t>(a) * d_ + b) * (n_ + 1) + i; }
  // The starts of live state (set, k) after a pass (k must be in present_[set]).
  const Word* state(uint32_t set, int k) const {
    return bits_.get() + offset_[set] + static_cast<size_t>(std::popcount(present_[set] & ((1u << k) - 1))) * words_;
  }
  const Word* link(int up, int down) const { return &link_mask_[(static_cast<size_t>(up) * d_ + down) * words_]; }
  static bool test(const Word* b, int i) { return (b[i >> 6] >> (i & 63)) & 1; }
  static void set_range(Word* b, int lo, int hi) {  // bits [lo, hi]
    for (int i = lo; i <= hi;) {
      const int w = i >> 6, off = i & 63;
      const int len = std::min(64 - off, hi - i + 1);
      const Word bits = len == 64 ? ~Word{0} : (((Word{1} << len) - 1) << off);
      b[w] |= bits;
      i += len;
    }
  }

  // Threshold-dependent tables: g_ (smallest stage start for each end) and link masks.
  void prepare(double t) {
    for (int k = 0; k < d_; ++k)
      for (int fi = 0; fi < nf_; ++fi) {
        int h = 0;
        for (int i = 1; i <= n_; ++i) {  // smallest h with cost(h, i) <= t; nondecreasing in i
          while (h < i && cost(k, fi, h, i) > t) ++h;
          g_[gidx(k, fi, i)] = std::max(h, g_mem_[gidx(k, fi, i)]);
        }
      }
    // cap_[k]: the most reference work one stage on k can hold (compute <= t and memory
    // with the fewest micro-batches in flight), for the capacity bound.
    const int loosest = 0;  // GPipe: the only in-flight count; 1F1B: one micro-batch
    for (int k = 0; k < d_; ++k) {
      double cap = 0;
      for (int i = 1; i <= n_; ++i) {
        const int h = g_[gidx(k, loosest, i)];
        if (h < i) cap = std::max(cap, tau_prefix_[i] - tau_prefix_[h]);
      }
      cap_[k] = cap;
    }
    for (size_t c = 0; c * 8 < static_cast<size_t>(d_); ++c)
      for (uint32_t m = 1; m < 256; ++m) {  // entry m = entry (m without its lowest bit) + that device
        const int k = static_cast<int>(8 * c) + std::countr_zero(m);
        cap_sum_[(c << 8) | m] = cap_sum_[(c << 8) | (m & (m - 1))] + (k < d_ ? cap_[k] : 0.0);
      }
    // single_[k][fi] bit h: layer h alone fits a stage on k (g(h + 1) <= h).
    std::fill(single_.begin(), single_.end(), 0);
    for (int k = 0; k < d_; ++k)
      for (int fi = 0; fi < nf_; ++fi) {
        Word* m = &single_[(static_cast<size_t>(k) * nf_ + fi) * words_];
        for (int h = 0; h < n_; ++h)
          if (g_[gidx(k, fi, h + 1)] <= h) m[h >> 6] |= Word{1} << (h & 63);
      }
    std::fill(link_mask_.begin(), link_mask_.end(), 0);
    for (int a = 0; a < d_; ++a)
      for (int b = 0; b < d_; ++b) {
        if (a == b) continue;
        Word* m = &link_mask_[(static_cast<size_t>(a) * d_ + b) * words_];
        for (int i = 1; i < n_; ++i)
          if (trans_[tidx(a, b, i)] <= t) m[i >> 6] |= Word{1} << (i & 63);
      }
  }

  // What the devices in `others` can hold together: the sum of the most reference
  // work one stage on each can take (cap_), and of their memory. Summed from
  // per-byte-of-the-mask tables that prepare() fills.
  Budget budget(uint32_t others) const {
    Budget b{0.0, 0};
    for (int c = 0; others; ++c, others >>= 8) {
      b.work += cap_sum_[(static_cast<size_t>(c) << 8) | (others & 0xFF)];
      b.mem += mem_sum_[(static_cast<size_t>(c) << 8) | (others & 0xFF)];
    }
    b.work = b.work * (1 + 1e-9) + 1e-300;  // slack for rounding: the test stays necessary
    return b;
  }
  // Necessary for layers [0, h) to fit the devices of `room` (one stage each): their
  // reference work and their weight + gradient + state bytes both fit.
  bool prefix_fits(const Budget& room, int h) const {
    return tau_prefix_[h] <= room.work && fixed_prefix_[h] <= room.mem;
  }

  // out = union over stage ends i in `ends` of the starts [g(i), i - 1] on `device`.
  // With g nondecreasing, an end i whose predecessor i - 1 is also an end only adds
  // h = i - 1 (when layer i - 1 alone fits), so only the first end of each run of
  // consecutive ends needs its interval set explicitly.
  template <int W>
  void expand(int device, int fi, const Word* ends, Word* out) const {
    const int nw = W > 0 ? W : words_;
    const Word* single = &single_[(static_cast<size_t>(device) * nf_ + fi) * words_];
    for (int w = 0; w < nw; ++w) {  // (ends >> 1) & single
      const Word hi_bit = w + 1 < nw ? ends[w + 1] << 63 : 0;
      out[w] = ((ends[w] >> 1) | hi_bit) & single[w];
    }
    for (int w = 0; w < nw; ++w) {
      const Word carry = w > 0 ? ends[w - 1] >> 63 : 0;
      for (Word starts = ends[w] & ~((ends[w] << 1) | carry); starts; starts &= starts - 1) {
        const int i = w * 64 + std::countr_zero(starts);
        const int lo = g_[gidx(device, fi, i)];
        if (lo <= i - 2) set_range(out, lo, i - 2);
      }
    }
  }

  const CostModel& c_;
  int n_, d_, max_stages_, words_, nf_;
  int flight_stages_ = 0;  // > 0: every stage keeps in_flight(flight_stages_, 0) (ZB-H1's bound)
  std::vector<int> g_mem_, g_plain_, g_;
  std::vector<double> trans_;
  std::vector<Word> link_mask_, single_;
  std::vector<double> tau_prefix_, rho_, cap_, cap_sum_;
  std::vector<int64_t> mem_sum_, fixed_prefix_;
  mutable std::vector<char> seq_starts_, seq_ends_;  // sequence_feasible's scratch
  std::unique_ptr<Word[]> bits_;                // live states, level by level, per set by first device
  uint32_t used_ = 0;                           // words of bits_ in use
  std::vector<uint32_t> present_, offset_;      // [set]: first devices stored, where in bits_
  std::vector<uint32_t> touch_;                 // [target set]: devices u with (target \ u) live
  std::vector<uint32_t> level_, next_, targets_;
  double threshold_ = kInf;
  uint32_t found_set_ = 0;
  int found_first_ = -1;
  int runs_ = 0;
};

std::string describe_layer(const CostModel& c, int i) {
  return "layer " + std::to_string(i) + " (" + c.model().layers[i].type + ")";
}

[[noreturn]] void explain_infeasible(const CostModel& c, int max_stages) {
  const PlanOptions& o = c.options();
  const Cluster& cluster = c.cluster();
  int largest = 0;
  int64_t total_memory = 0;
  for (int k = 0; k < c.num_devices(); ++k) {
    if (c.device_memory(k) > c.device_memory(largest)) largest = k;
    total_memory += c.device_memory(k);
  }
  const std::string batch_desc = "at batch " + std::to_string(o.batch) + " (" + std::to_string(o.microbatches) +
                                 " micro-batches of " + std::to_string(c.microbatch_size()) + ", " +
                                 schedule_name(o.schedule) + ")";
  const std::string largest_desc = "the largest device, '" + cluster.devices[largest].name + "', has " +
                                   format_bytes(static_cast<double>(c.device_memory(largest)));
  // The fewest micro-batches any stage keeps: 1 for the last stage under 1F1B.
  const int min_flight = c.in_flight(1, 0);
  const std::string recompute_hint =
      o.recompute == Recompute::none ? ", or recompute activations in backward (--recompute auto)" : "";
  for (int i = 0; i < c.num_layers(); ++i) {
    bool fits = false;
    for (int k = 0; k < c.num_devices() && !fits; ++k) fits = c.memory_bytes(k, i, i + 1, min_flight) <= c.device_memory(k);
    const int64_t need = c.memory_bytes(largest, i, i + 1, min_flight);
    if (!fits) {
      throw PlanError(describe_layer(c, i) + " needs " + format_bytes(static_cast<double>(need)) + " (" +
                      format_bytes(static_cast<double>(c.fixed_bytes(i, i + 1))) + " of weights + gradients + optimizer state + " +
                      format_bytes(static_cast<double>(c.activation_bytes(largest, i, i + 1, min_flight))) + " of activations " +
                      batch_desc + ") and fits on no device: " + largest_desc +
                      "; add memory, lower --batch or --microbatches, or use a smaller optimizer state" + recompute_hint);
    }
  }
  const int64_t fixed = c.fixed_bytes(0, c.num_layers());
  if (fixed > total_memory)
    throw PlanError("the model's weights + gradients + optimizer state need " + format_bytes(static_cast<double>(fixed)) +
                    " but all " + std::to_string(c.num_devices()) + " devices together have " +
                    format_bytes(static_cast<double>(total_memory)) + "; add devices or memory");
  std::string limit = max_stages < c.num_devices()
                          ? " on at most " + std::to_string(max_stages) + " stages (the stage limit)"
                          : "";
  throw PlanError("no split of the " + std::to_string(c.num_layers()) + " layers over the " +
                  std::to_string(c.num_devices()) + " devices" + limit + " fits in memory: weights + gradients + state total " +
                  format_bytes(static_cast<double>(fixed)) + ", the whole model's activations " + batch_desc + " add " +
                  format_bytes(static_cast<double>(c.activation_bytes(largest, 0, c.num_layers(), min_flight))) +
                  ", devices total " + format_bytes(static_cast<double>(total_memory)) + " (" + largest_desc +
                  "); add memory or devices, lower --batch or --microbatches" + recompute_hint);
}

}  // namespace

Plan plan(const ModelProfile& model, const Cluster& cluster, const PlanOptions& options) {
  CostModel cost(model, cluster, options);
  Search search(cost);

  double hi = kInf;
  std::vector<int> best_devices, best_cuts, cuts, devices;
  bool min_stages_known = false;  // best is a fewest-stage plan among those with bottleneck hi

  // Upper bound from a heuristic: the fastest devices, in speed order, for each stage
  // count, then hill climbing over sequences.
  const std::vector<int> order = search.speed_order();
  for (int p = 1; p <= search.max_stages(); ++p) {
    std::vector<int> seq(order.begin(), order.begin() + p);
    const double v = search.best_split(seq, cuts);
    if (v < hi) {
      hi = v;
      best_devices = seq;
      best_cuts = cuts;
    }
  }
  if (hi == kInf) {
    // Memory alone decides whether anything fits.
    if (!search.feasible(kInf)) explain_infeasible(cost, search.max_stages());
    search.extract(best_devices, best_cuts);
    hi = search.best_split(best_devices, best_cuts);
  }
  hi = search.improve(best_devices, best_cuts, hi);

  // Candidate values of the optimum in [lower bound, hi). Each pass removes at least
  // one: a feasible test at t yields a plan with bottleneck <= t (hi drops to it),
  // an infeasible one proves every plan costs more than t.
  std::vector<double> cands = search.candidates(search.lower_bound(), hi);
  // Which threshold to test: after a feasible pass (and after the heuristic) the
  // new incumbent is often optimal, and one infeasible test just below it ends the
  // search, so probe the largest candidate left; after an infeasible pass, bisect.
  bool probe = true;
  while (!cands.empty()) {
    double t;
    if (probe) {
      t = *std::max_element(cands.begin(), cands.end());
    } else {
      auto mid = cands.begin() + cands.size() / 2;
      std::nth_element(cands.begin(), mid, cands.end());
      t = *mid;
    }
    if (search.feasible(t)) {
      search.extract(devices, cuts);
      double v = search.best_split(devices, cuts);
      if (!(v <= t)) throw std::logic_error("planner: a feasible sequence re-split above the threshold");
      const int found_stages = static_cast<int>(devices.size());
      v = search.improve(devices, cuts, v);
      hi = v;
      best_devices = devices;
      best_cuts = cuts;
      // The pass found the fewest stages among plans costing <= t, so no plan costing
      // <= hi (<= t) has fewer: a plan with that many is a fewest-stage optimum.
      min_stages_known = static_cast<int>(devices.size()) <= found_stages;
      std::erase_if(cands, [&](double x) { return x >= hi; });
      probe = true;
    } else {
      std::erase_if(cands, [&](double x) { return x <= t; });
      probe = false;
    }
  }
  if (!min_stages_known && best_devices.size() > 1) {
    // hi is optimal; find the fewest stages that achieve it.
    if (!search.feasible(hi)) throw std::logic_error("planner: the optimal bottleneck failed its own test");
    if (search.found_stages() < static_cast<int>(best_devices.size())) {
      search.extract(devices, cuts);
      const double v = search.best_split(devices, cuts);
      if (!(v <= hi)) throw std::logic_error("planner: a fewer-stage plan re-split above the optimum");
      best_devices = devices;
      best_cuts = cuts;
    }
  }
  Plan out = evaluate_plan(cost, best_devices, best_cuts);
  out.search_runs = search.runs();
  return out;
}

}  // namespace cleave
