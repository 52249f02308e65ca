// pipeline_driver.h (internal to the coordinator): the pipeline driver's
// state and phases. pipeline_driver.cpp runs a training job
// (train_pipeline); pipeline_profile.cpp measures the registered daemons and
// their links for the planner and for `cleave profile`.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "core/io/untrusted_json.h"
#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/optim/optimizer.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/trace.h"
#include "core/planner/planner.h"
#include "core/runtime/common/stage_state.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/runtime/coordinator/session.h"
#include "core/train/checkpoint_dir.h"
#include "core/train/evaluate.h"
#include "core/train/progress.h"
#include "transport/message.h"

namespace cleave::pipeline_detail {

using Clock = std::chrono::steady_clock;

// A registered daemon, and its stage once assigned (-1: none).
struct StageDevice {
  std::string name;
  transport::RegisterMsg reg;
  int stage = -1;
  std::string peer_endpoint;
  nlohmann::json details = nlohmann::json::object();  // its registration details, read within kPeerJsonLimits
};

// The backend a daemon registered with ("backend" in its details), if it
// said. Throws std::invalid_argument for a "backend" that is not a string.
std::optional<Backend> registered_backend(const nlohmann::json& details);
// What the planner reads of a daemon's registration details, checked when it
// registers: "" when usable, else why not (pipeline_profile.cpp).
std::string check_pipeline_details(const nlohmann::json& details);

// A stage's device is gone for this plan (dead, disconnected, silent, its
// job failed or ended): what recovery starts from. Any other failure is a
// std::runtime_error that ends the run.
struct DeviceLost : std::runtime_error {
  DeviceLost(const std::string& text, std::string device_name, std::string why)
      : std::runtime_error(text), device(std::move(device_name)), reason(std::move(why)) {}
  std::string device, reason;
};

class Driver {
 public:
  Driver(const TrainConfig& cfg, const ClusterOptions& opts) : cfg_(cfg), opts_(opts) {}

  nlohmann::json run();

 private:
  nlohmann::json run_job();
  // Phases (pipeline_driver.cpp), in the order run_job() calls them.
  void load_inputs();
  void register_devices();
  nlohmann::json profile_result();  // `cleave profile`: what profile_cluster measured
  void plan();
  void choose_stages();  // bounds_, recompute_ and devices_ (in stage order) over the live devices
  // Each stage's memory on its device (the one model, recomputing where recompute_ says).
  std::vector<StageMemory> stage_memories() const;
  void assign_stages();
  void train();
  void end_of_step(int64_t per_epoch);  // checkpoints that fall due after step_
  void stream_batch(int64_t step, Batch batch);
  void collect(int64_t upto);  // records the losses of every step < upto, in order
  transport::Millis step_deadline() const;
  int late_stage() const;
  std::string stall_report() const;
  std::vector<float> gather_params();
  // The gathered `params` into `whole` (the whole model); fails on a size mismatch.
  static void load_whole(Partition& whole, const std::vector<float>& params);
  double validation_loss();  // --text, between epochs: the stages' weights on the validation windows
  void finish_stages();
  void write_trace();
  nlohmann::json result(const EvalResult& ev, int64_t parameters) const;
  double mean_step_seconds() const;
  double median_step_seconds() const;
  nlohmann::json prediction() const;
  nlohmann::json stages_json() const;

  // Recovery (pipeline_recovery.cpp).
  void open_checkpoints();
  void checkpoint(bool to_dir, bool to_save);
  void recover(const DeviceLost& lost);
  void settle_stages();  // ends the plan's jobs; the devices that do not come back are dead
  void replan(int64_t lost_step);
  StartingPoint restore_point(nlohmann::json& from);
  void check_fits() const;
  void offer_spare(const transport::Received& r);
  std::string resume_hint() const;
  // Removes the run's temporary checkpoint directory; with unless_resumable
  // only when it holds no checkpoint (core/train/checkpoint_dir.h).
  void remove_temporary_checkpoints(bool unless_resumable);
  nlohmann::json recovery_json() const;

  // Planner input from the live devices (pipeline_profile.cpp).
  Cluster profile_cluster();
  // One device's per-sample layer times at micro-batches of `samples`; its reply in `detail`.
  transport::Message profile_request(int64_t samples, bool update) const;
  // Whether the layers are timed at two micro-batch sizes and fitted
  // (--microbatches auto at the first plan, `cleave profile`).
  bool profiles_two_sizes() const { return (opts_.microbatches_auto && plan_epoch_ == 0) || opts_.profile_only; }
  std::vector<double> layer_times(const StageDevice& d, int64_t samples, nlohmann::json& detail, bool update = true);
  std::vector<double> layer_times_of(const transport::Received& r, nlohmann::json& detail);
  void measure_host_contention(Cluster& cluster, int64_t samples);
  // Round-trip probes to `peer`: (one-way latency ms, bandwidth Mbit/s).
  std::pair<double, double> probe_link(const std::string& peer);

  // Messages (pipeline_driver.cpp).
  std::optional<transport::Received> receive(transport::Millis timeout);
  void fail_if_a_stage_died();
  bool is_stage(const std::string& peer) const;  // a device of the plan being run
  void accept_metrics(const std::string& peer, const transport::MetricsMsg& mm);
  void send(const std::string& peer, const transport::Message& m);
  [[noreturn]] static void fail(const std::string& text);
  transport::Received request(const std::string& peer, transport::Message m, const char* what,
                              transport::Millis timeout);
  // `m` to every one of `peers` at once (each its own request id), then their
  // replies in the order of `peers`.
  std::vector<transport::Received> request_all(const std::vector<std::string>& peers, const transport::Message& m,
                                               const char* what, transport::Millis timeout);
  transport::Received wait_for_reply(const std::string& peer, uint64_t request_id, const char* what,
                                     transport::Millis timeout);
  nlohmann::json ack_detail(const transport::Received& r);
  // Runs `read` over a reply of `peer` to `what`: a field of the wrong type
  // or range ends the run naming the device and the reply (counted as
  // "ack_detail_invalid"), never with a raw JSON error.
  template <typename Read>
  auto reading(const std::string& peer, const char* what, Read&& read) -> decltype(read()) {
    try {
      return read();
    } catch (const nlohmann::json::exception& e) {
      unreadable(peer, what, e.what());
    } catch (const std::invalid_argument& e) {
      unreadable(peer, what, e.what());
    }
  }
  [[noreturn]] void unreadable(const std::string& peer, const char* what, const std::string& why);
  void keep_reply(transport::Received&& r);
  void stop_all();
  // Every stage's parameters in stage order, with their optimizer's `buffers`
  // state blocks (0: weights only).
  std::vector<StageState> gather_states(size_t buffers);

  TrainConfig cfg_;  // a copy: --microbatches auto sets its microbatches at the first plan
  const ClusterOptions& opts_;
  std::unique_ptr<Session> session_;
  Clock::time_point t_start_ = Clock::now();

  // The job.
  ModelSpec spec_;
  Dataset train_, test_;
  ScheduleKind schedule_ = ScheduleKind::gpipe;
  transport::Encoding encoding_ = transport::Encoding::kF32;
  OptimizerConfig ocfg_;
  std::vector<StageDevice> devices_;  // in stage order once assigned
  std::vector<StageDevice> idle_;     // registered, left unused by the planner
  std::vector<int> bounds_;           // stage s has layers [bounds_[s], bounds_[s + 1])
  Recompute recompute_policy_ = Recompute::none;  // --recompute
  std::vector<bool> recompute_;       // stage s recomputes its activations in backward
  std::vector<int64_t> stage_counts_;
  nlohmann::json plan_json_, profile_json_;  // null with --planner balance
  double predicted_batch_seconds_ = 0;
  StartingPoint start_;
  TrainPosition pos_;

  // Training progress.
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<ProgressBar> bar_;
  nlohmann::json losses_ = nlohmann::json::array();
  nlohmann::json val_losses_ = nlohmann::json::array();  // --text: after each epoch
  std::map<int64_t, int64_t> step_batch_;    // step -> its batch size
  std::vector<Clock::time_point> step_done_;  // when each step's loss arrived
  std::map<int64_t, transport::MetricsMsg> last_metrics_;  // step -> metrics of the last stage
  std::map<std::string, int64_t> progress_;  // device -> last step it finished
  Clock::time_point last_progress_ = Clock::now();  // when a stage last finished a step
  Clock::duration slowest_step_{};                   // longest gap between two steps' losses
  int64_t step_ = 0, next_loss_step_ = 0, samples_ = 0;
  int64_t epoch_first_step_ = 0, epoch_samples_ = 0;
  Clock::time_point t_epoch_;
  double train_seconds_ = 0;
  int64_t current_step_ = -1;
  bool assigned_ = false;

  // Finish.
  std::vector<TraceEvent> events_;
  nlohmann::json busy_ = nlohmann::json::array();
  std::vector<nlohmann::json> stage_memory_;  // per stage: what its daemon estimated and measured

  // Recovery.
  std::unique_ptr<CheckpointDir> checkpoints_;
  bool temporary_checkpoints_ = false;  // ours: removed when the run succeeds
  int64_t checkpoints_written_ = 0;
  nlohmann::json checkpoint_warnings_ = nlohmann::json::array();  // corrupt checkpoints skipped
  nlohmann::json resumed_;                                        // --resume: where from
  nlohmann::json recoveries_ = nlohmann::json::array();
  TrainPosition first_position_;  // where this coordinator started (--load, --resume or 0)
  uint64_t job_id_ = 0;
  uint32_t plan_epoch_ = 0;
  uint64_t plan_first_request_ = 0;  // requests (and their answers) of earlier plans have smaller ids
  std::set<std::string> acked_;     // stage devices whose assignment was acknowledged this plan
  std::set<std::string> left_job_;  // stage devices seen registering again since the loss
  int64_t catch_up_step_ = -1;    // after a recovery: the step to reach again, and since when
  Clock::time_point restored_at_;
  bool in_epoch_ = false;

  uint64_t probe_seq_ = 0;
  std::map<std::string, uint64_t> awaiting_;           // the requests in flight: peer -> request id
  std::map<std::string, transport::Received> replies_;  // their replies, once they arrived
};

}  // namespace cleave::pipeline_detail
