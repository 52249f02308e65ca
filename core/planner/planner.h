// planner.h: which device runs which contiguous slice of the model.
//
// plan() is a pure function (design note 4): (ModelProfile, Cluster,
// PlanOptions) -> Plan. It chooses the number of stages p, the contiguous layer
// range of each stage and an ordered sequence of p distinct devices (a device
// may be left unused) that minimises the bottleneck: the largest of every
// stage's compute time per batch and every cut's transfer time per batch
// (activations forward + gradients back). Ties go to fewer stages. Every stage
// must fit its device's memory: weights, gradients, optimizer state, the
// micro-batches the schedule keeps in flight and one micro-batch of working
// buffers (memory_model.h, the one memory model). With --recompute all every
// stage keeps only its inputs and recomputes its activations in backward,
// paying its forward again; with auto a stage does so exactly when it would
// not fit its device otherwise (and the search weighs that cost). The search is exact
// (docs/planner.md gives the cost model, the algorithm and the optimality
// argument); CostModel is the one place the costs are computed, shared by the
// planner, its report and the tests' brute force.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/pipeline/schedule.h"
#include "core/pipeline/simulate.h"
#include "core/planner/memory_model.h"
#include "core/planner/profile.h"

namespace cleave {

// An infeasible or invalid planning problem; the message says what fits nowhere.
struct PlanError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Schedules are the pipeline's (ScheduleKind, core/pipeline/schedule.h) and
// encodings the transport's (transport::Encoding, transport/codec.h).
struct PlanOptions {
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int microbatches = 4;              // M >= 1
  int64_t batch = 64;                // B >= M samples per optimizer step
  transport::Encoding encoding = transport::Encoding::kF32;  // activations / gradients on links (unless a link overrides)
  int max_stages = 0;                // 0: up to one stage per device
  // --microbatches auto: plan_microbatches() chooses `microbatches` (every M in
  // 1..B that fits, the fastest predicted batch); plan() itself plans for the
  // M given and only reports the flag.
  bool microbatches_auto = false;
  Recompute recompute = Recompute::none;  // none | all | when_needed (auto): where stages recompute activations
};

// The cost model of docs/planner.md. Built once per problem; validates the
// inputs (throws PlanError naming the bad value). All times are per batch of
// B samples, in seconds; all sizes in bytes.
class CostModel {
 public:
  CostModel(const ModelProfile& model, const Cluster& cluster, const PlanOptions& options);

  int num_layers() const { return n_; }
  int num_devices() const { return d_; }
  int64_t microbatch_size() const { return mb_; }  // ceil(B / M)

  // Forward + backward of layers [begin, end) for B samples in M micro-batches
  // on `device` (B * per-sample time + M * per-micro-batch time), plus one
  // optimizer step over their parameters.
  double compute_seconds(int device, int begin, int end) const {
    return static_cast<double>(batch_) * (prefix_seconds_[device][end] - prefix_seconds_[device][begin]) +
           microbatches_ * (prefix_fixed_[device][end] - prefix_fixed_[device][begin]) +
           (prefix_update_[device][end] - prefix_update_[device][begin]);
  }
  // The forward of layers [begin, end) for B samples in M micro-batches on
  // `device` once more: what recomputing the stage's activations in backward adds.
  double recompute_seconds(int device, int begin, int end) const {
    return static_cast<double>(batch_) * (prefix_forward_[device][end] - prefix_forward_[device][begin]) +
           microbatches_ * (prefix_forward_fixed_[device][end] - prefix_forward_fixed_[device][begin]);
  }
  // Whether that stage recomputes under options().recompute: never (none),
  // always (all), or when it does not fit the device's memory otherwise (auto).
  bool recomputes(int device, int begin, int end, int in_flight) const;
  // compute_seconds, plus recompute_seconds where the stage recomputes.
  double stage_seconds(int device, int begin, int end, int in_flight) const {
    return compute_seconds(device, begin, end) +
           (recomputes(device, begin, end, in_flight) ? recompute_seconds(device, begin, end) : 0.0);
  }
  // The cut before layer `cut` (1 <= cut < n) from stage on `from` to the stage
  // on `to`: B samples of activations from -> to plus their gradients to -> from,
  // each M messages paying the link's latency.
  double transfer_seconds(int from, int to, int cut) const;
  // Bytes crossing the cut before layer `cut` per batch, one direction, encoded.
  double transfer_bytes(int from, int to, int cut) const;
  // Micro-batches stage `stage` of `num_stages` keeps in flight:
  // max_in_flight(schedule, stage, num_stages, M) (core/pipeline/schedule.h).
  int in_flight(int num_stages, int stage) const;
  // Fraction of a batch's time a stage of a `num_stages`-stage pipeline of
  // equal stages idles when `weight_share` of the stages' time goes to W (ZB-H1;
  // 1/3: F, B and W take equal times): bubble_fraction(schedule, num_stages, M,
  // weight_share) (core/pipeline/schedule.h). The theory; a plan's predicted
  // batch runs its own stages' times (pipeline_seconds).
  double bubble(int num_stages, double weight_share = 1.0 / 3) const;
  // One micro-batch's forward, input gradient (B, with the recomputed forward
  // where the stage recomputes) and weight gradient (W), and the batch's
  // optimizer step, of the stage [begin, end) on `device`: M times the passes
  // plus the step is stage_seconds().
  StageTimes stage_times(int device, int begin, int end, int in_flight) const;
  // Those of each stage `devices[s]` with layers [cuts[s], cuts[s + 1]), with its in-flight count.
  std::vector<StageTimes> stage_times(const std::vector<int>& devices, const std::vector<int>& cuts) const;
  // The link of the cut before layer `cut` from the stage on `from` to the one
  // on `to`, per micro-batch's message: each direction's latency plus its bytes
  // over its bandwidth (M activations and M gradients of them: transfer_seconds()).
  // Between two devices of one machine whose devices' compute threads take all
  // its cores (DeviceProfile::host), the link threads copy, encrypt and decrypt
  // on the cores the stages compute on: half of a message's bytes over the
  // link's cpu_mbps (absent: its bandwidth, a link within a machine being its
  // CPU), the mean of the two directions, is the most each end pays per
  // message, cpu_before and cpu_after (pipeline_links scales them).
  LinkTimes link_times(int from, int to, int cut) const;
  // The links of the stages `devices[s]` with layers [cuts[s], cuts[s + 1]) as
  // their batch runs them: link_times, with each end's `cpu` scaled by how busy
  // the stage at the other end is (its compute over the batch time when the
  // links' CPU costs nothing): a link thread takes a stage's core only while
  // the other core computes too, else the idle core runs it.
  std::vector<LinkTimes> pipeline_links(const std::vector<int>& devices, const std::vector<int>& cuts) const;
  // The time of a batch over stages `devices[s]` with layers [cuts[s],
  // cuts[s + 1]) when the schedule's action lists run with each stage's and
  // link's own times (pipeline_links; simulate_pipeline, core/pipeline/simulate.h). A plan's
  // prediction is this or its bottleneck, whichever is longer (evaluate_plan).
  double pipeline_seconds(const std::vector<int>& devices, const std::vector<int>& cuts) const {
    return pipeline_seconds(devices, cuts, pipeline_links(devices, cuts));
  }
  // The same with the cuts' links given (pipeline_links of the same stages).
  double pipeline_seconds(const std::vector<int>& devices, const std::vector<int>& cuts,
                          const std::vector<LinkTimes>& links) const;
  // The W (weight-gradient) part of compute_seconds(device, begin, end): the
  // layers that split their backward (LayerProfile::weight_grad_flops), by
  // their share of each layer's measured time (or of its FLOPs).
  double weight_seconds(int device, int begin, int end) const {
    return static_cast<double>(batch_) * (prefix_weight_[device][end] - prefix_weight_[device][begin]);
  }
  // The memory model (memory_model.h) of a stage [begin, end) on `device`
  // (its DeviceProfile::backend) keeping `in_flight` micro-batches of
  // microbatch_size() samples, recomputing where recomputes() says.
  StageMemory stage_memory(int device, int begin, int end, int in_flight) const {
    return stage_memory(device, begin, end, in_flight, recomputes(device, begin, end, in_flight));
  }
  // The same, recomputing or not whatever options().recompute says.
  StageMemory stage_memory(int device, int begin, int end, int in_flight, bool recompute) const {
    return stage_models_[device_model_[device]].stage(begin, end, in_flight, recompute,
                                                      recompute_saves_memory(options_.schedule));
  }
  // Weights + gradients + optimizer state of layers [begin, end) (on any device).
  int64_t fixed_bytes(int begin, int end) const { return stage_models_.front().weight_state_bytes(begin, end); }
  // Activations in flight + one micro-batch's workspace of that stage.
  int64_t activation_bytes(int device, int begin, int end, int in_flight) const {
    return memory_bytes(device, begin, end, in_flight) - fixed_bytes(begin, end);
  }
  // All of it: stage_memory(device, begin, end, in_flight).total().
  int64_t memory_bytes(int device, int begin, int end, int in_flight) const {
    return static_cast<int64_t>(stage_memory(device, begin, end, in_flight).total());
  }
  int64_t device_memory(int device) const { return memory_[device]; }

  const ModelProfile& model() const { return *model_; }
  const Cluster& cluster() const { return *cluster_; }
  const PlanOptions& options() const { return options_; }

 private:
  const ModelProfile* model_;
  const Cluster* cluster_;
  PlanOptions options_;
  int n_, d_;
  int64_t batch_, mb_;
  double microbatches_;  // M
  std::vector<std::vector<double>> prefix_seconds_;  // [device][i]: per-sample seconds of layers [0, i)
  std::vector<std::vector<double>> prefix_update_;   // [device][i]: optimizer-step seconds of layers [0, i)
  std::vector<std::vector<double>> prefix_forward_;  // [device][i]: per-sample forward seconds of layers [0, i)
  std::vector<std::vector<double>> prefix_weight_;   // [device][i]: per-sample W seconds of layers [0, i)
  std::vector<std::vector<double>> prefix_fixed_;    // [device][i]: per-micro-batch seconds of layers [0, i)
  std::vector<std::vector<double>> prefix_forward_fixed_;  // [device][i]: their forward share
  std::vector<MemoryModel> stage_models_;  // one per distinct backend among the devices
  std::vector<int> device_model_;          // [device]: its model in stage_models_
  std::vector<int64_t> memory_;
  std::vector<double> link_latency_, link_per_byte_;  // [from * d + to]: seconds per message, per byte (encoded)
  std::vector<double> link_cpu_per_byte_;  // [from * d + to]: both ends' CPU per byte, where the stages pay it
};

struct StagePlan {
  int device = -1;               // index into the cluster
  std::string device_name;
  int begin = 0, end = 0;        // layers [begin, end)
  int64_t params = 0;            // float parameters of the stage
  int in_flight = 0;             // micro-batches kept for backward
  int64_t memory_bytes = 0;      // needed: memory.total(), what the stage's daemon checks and the coordinator reports
  int64_t weight_state_bytes = 0;  // of which weights + grads + optimizer state
  StageMemory memory;            // memory_bytes by what holds it (memory_model.h)
  bool recompute = false;        // the stage recomputes its activations in backward (memory.recompute)
  int64_t memory_available = 0;  // the device's usable memory
  double compute_seconds = 0;    // per batch, with the recomputed forward where the stage recomputes
  double transfer_seconds = 0;   // per batch, the cut after this stage (0 for the last)
  double transfer_bytes = 0;     // per batch, one direction, encoded (0 for the last)
  double link_cpu_seconds = 0;   // per batch, the links' CPU this stage pays out of its compute (LinkTimes::cpu)
  bool bottleneck = false;       // this stage's compute or outgoing transfer is the bottleneck
  std::string bottleneck_kind;   // "compute" | "transfer" | "" when not the bottleneck
};

struct Plan {
  PlanOptions options;
  int64_t microbatch_size = 0;
  std::vector<StagePlan> stages;
  std::vector<std::string> unused_devices;
  double bottleneck_seconds = 0;      // max over stages and cuts, per batch
  double batch_seconds = 0;           // max(bottleneck, CostModel::pipeline_seconds): e.g. (M + p - 1) / M * bottleneck for equal gpipe / 1f1b stages and free links
  double weight_share = 0;            // of the stages' compute, what their W's take (ZB-H1's bubble depends on it)
  double samples_per_second = 0;      // B / batch_seconds
  int search_runs = 0;                // exact feasibility passes the search made
  // plan_shared_hosts(): the largest factor by which co-located devices' compute
  // was slowed down for this plan's stage count (1: none).
  double shared_host_slowdown = 1;
};

// The optimal plan (see the header comment). Throws PlanError when no
// assignment fits, naming the layer or stage that fits nowhere and the memory it
// needs, or when the inputs are invalid (no layers, no devices, bad numbers,
// a measured layer-time list of the wrong length, more devices than the exact
// search handles).
Plan plan(const ModelProfile& model, const Cluster& cluster, const PlanOptions& options);

// plan() for devices that may share machines (DeviceProfile::host). When the
// devices of one machine together compute with more threads than it has cores,
// they slow each other down as soon as more than cores / threads of them hold
// stages. For each stage count p this plans with at most p stages and each such
// device's compute (layer times, update time) scaled by
// max(1, min(p, devices on its machine) * their mean threads / cores), and keeps
// the fastest plan (fewest stages on ties). Exact when every co-located device
// is on one machine; conservative when several machines each host several.
// Without contention it is plan(). Throws what plan() throws.
Plan plan_shared_hosts(const ModelProfile& model, const Cluster& cluster, const PlanOptions& options);

// The plan cleave plan and cleave train use: plan_shared_hosts() for the
// options' M, or, with options.microbatches_auto, plan_shared_hosts() for every
// M in 1..B, keeping the plan with the smallest predicted batch time (fewer
// micro-batches on ties; docs/planner.md "Choosing M"). Every M that fits is
// tried: a cost that grows with M (each micro-batch's per-layer fixed time and
// link latency) against a bubble that shrinks with it. The plan's options hold
// the M chosen. Throws what plan() throws; when no M fits, the error of the
// most micro-batches (the least activation memory per micro-batch).
Plan plan_microbatches(const ModelProfile& model, const Cluster& cluster, const PlanOptions& options);

// Evaluates a given assignment under the cost model (stages filled in, bottleneck
// marked). `devices[s]` hosts layers [cuts[s], cuts[s + 1]); cuts has p + 1
// entries from 0 to n. Does not check memory (memory_bytes vs memory_available
// shows it). Throws PlanError for a malformed assignment.
Plan evaluate_plan(const CostModel& cost, const std::vector<int>& devices, const std::vector<int>& cuts);

// Largest number of devices the exact search accepts.
inline constexpr int kMaxPlannerDevices = 20;

}  // namespace cleave
