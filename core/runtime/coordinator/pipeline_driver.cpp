// pipeline_driver.cpp: pipelined training across daemons; see pipeline.h,
// pipeline_driver.h and docs/protocol.md.
#include "core/runtime/coordinator/pipeline_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "core/model/partition.h"
#include "core/nn/loss.h"
#include "core/planner/balance.h"
#include "core/planner/plan_report.h"
#include "core/planner/devices_file.h"
#include "core/planner/memory_model.h"
#include "core/planner/profile.h"
#include "core/runtime/common/wire.h"
#include "core/io/untrusted_json.h"
#include "core/train/train_data.h"
#include "core/train/train_result.h"
#include "core/util/seconds.h"
#include "device/device.h"
#include "transport/log.h"

namespace cleave {
namespace pipeline_detail {

using namespace transport;

// A run that fails before its first checkpoint leaves nothing to resume: its
// temporary checkpoint directory (made by the CLI before the run starts, or
// by open_checkpoints) goes with it, whatever the failure.
nlohmann::json Driver::run() {
  try {
    return run_job();
  } catch (...) {
    remove_temporary_checkpoints(/*unless_resumable=*/true);
    throw;
  }
}

nlohmann::json Driver::run_job() {
  load_inputs();
  // Nothing a peer sends this job may be larger than its biggest state block or batch tensor.
  session_ = std::make_unique<Session>(session_options(
      "cleave", opts_, job_payload_cap(spec_, cfg_.optimizer.kind, cfg_.optimizer.momentum, cfg_.batch)));
  if (cfg_.progress)
    std::fprintf(stderr, "cleave: listening on %s, waiting for %d device(s)\n", session_->server().endpoint().c_str(),
                 opts_.devices);
  register_devices();
  return session_->stop_on_error(
      [&] {
        if (opts_.profile_only) return profile_result();
        plan();
        std::vector<float> params;
        try {
          for (;;) {
            try {
              assign_stages();
              train();
              params = gather_params();
              break;
            } catch (const DeviceLost& lost) {
              recover(lost);  // throws when the run cannot go on
            }
          }
        } catch (const std::runtime_error& e) {
          throw std::runtime_error(e.what() + resume_hint());  // "" before the first checkpoint
        }
        auto cpu = open_device("cpu", DeviceOptions{});
        Partition whole(*cpu, spec_, 0, spec_.num_layers());
        load_whole(whole, params);
        finish_stages();
        remove_temporary_checkpoints(/*unless_resumable=*/false);
        // Evaluate only after the daemons are released: this takes seconds in
        // which no daemon has reason to talk to us.
        const EvalResult ev = evaluate(whole, test_, 256);
        if (!cfg_.text_path.empty()) val_losses_.push_back(ev.loss);
        write_trace();
        print_evaluation(cfg_, ev);
        return result(ev, whole.param_count());
      },
      [&] { stop_all(); });
}

void Driver::load_inputs() {
  spec_ = ModelSpec::load(cfg_.model_path);
  if (!opts_.profile_only) {  // a profile times the layers on synthetic inputs: it reads no data
    TrainData data = load_train_data(cfg_, spec_);
    train_ = std::move(data.train);
    test_ = std::move(data.test);
  }
  schedule_ = parse_schedule(opts_.schedule);
  encoding_ = transport::parse_encoding(opts_.encoding);
  try {
    recompute_policy_ = parse_recompute(opts_.recompute);
  } catch (const std::invalid_argument& e) {
    fail(std::string("--recompute: ") + e.what());
  }
  if (opts_.devices < 1) fail("--devices must be at least 1");
  if (opts_.devices > spec_.num_layers())
    fail(cfg_.model_path + " has " + std::to_string(spec_.num_layers()) + " layers: it cannot be split over " +
         std::to_string(opts_.devices) + " devices");
  if (!cfg_.load_path.empty() && !cfg_.init_path.empty())
    fail("--load and --init both say where training starts: give one of them");
}

void Driver::register_devices() {
  session_->register_until(
      opts_.register_timeout_ms, [&] { return static_cast<int>(devices_.size()) >= opts_.devices; },
      [&](const Registration& r) {
        std::string why = r.details_error;
        if (why.empty()) why = check_pipeline_details(r.details);
        if (!why.empty()) return session_->refuse_registration("device", r.peer, why);
        devices_.push_back({r.peer, r.reg, -1, "", r.details});
        session_->pool().add(r.peer, r.reg, r.details);
        if (cfg_.progress)
          std::fprintf(stderr, "cleave: device %s registered (%s, %.1f GFLOP/s, %.0f MiB free)\n", r.peer.c_str(),
                       r.reg.device_name.c_str(), r.reg.compute_gflops, r.reg.memory_free / 1048576.0);
      },
      [&](const std::string& names) {
        std::string text = "only " + std::to_string(devices_.size()) + " of " + std::to_string(opts_.devices) +
                           " devices registered within " + seconds_text(opts_.register_timeout_ms) +
                           (names.empty() ? "" : " (" + names + ")") + ": start more cleaved daemons with keys in " +
                           opts_.allow_path;
        return text + session_->refused_registrations();
      });
  std::sort(devices_.begin(), devices_.end(),
            [](const StageDevice& a, const StageDevice& b) { return a.name < b.name; });
}

// `cleave profile`: release the daemons and return what was measured, in the
// devices-file format `cleave plan --devices` reads.
nlohmann::json Driver::profile_result() {
  const Cluster cluster = profile_cluster();
  stop_all();
  nlohmann::json out = cluster_to_json(cluster);  // devices carry "layer_seconds" for this model
  out["description"] = "measured by cleave profile for model " + spec_.name + " (batch " +
                       std::to_string(cfg_.batch) + ", " + std::to_string(cfg_.microbatches) + " micro-batches, " +
                       schedule_name(schedule_) + ")";
  return out;
}

// "balance": every device gets a stage, layers split evenly by compute
// (core/planner/balance.h). "auto": profile the devices (per-layer times
// measured on each for this model, links probed over their encrypted
// connections, bandwidth limits they declare) and let the planner choose
// stages and devices.
void Driver::plan() {
  choose_stages();
  ocfg_ = cfg_.optimizer;
  loader_ = std::make_unique<BatchLoader>(train_, cfg_.batch, true, cfg_.seed);
  if (ocfg_.total_steps == 0) ocfg_.total_steps = loader_->batches_per_epoch() * cfg_.epochs;
  ocfg_.validate();
  // --load / --init / --resume: read and check the file before any daemon is assigned.
  open_checkpoints();
  first_position_ = start_.position;
}

// The stages over devices_ (every live device, sorted by name), in stage
// order; the devices left out wait in idle_ as spares.
void Driver::choose_stages() {
  const int n = std::min(opts_.devices, static_cast<int>(devices_.size()));
  if (opts_.planner == "balance" || (n == 1 && !opts_.microbatches_auto)) {
    idle_.insert(idle_.end(), devices_.begin() + n, devices_.end());
    devices_.resize(static_cast<size_t>(n));
    bounds_ = balanced_bounds(spec_, cfg_.batch, n);
    // --recompute auto on a fixed split: where a stage does not fit its device's free memory otherwise.
    recompute_.assign(devices_.size(), false);
    const std::vector<StageMemory> plain = stage_memories();
    for (size_t s = 0; s < devices_.size(); ++s)
      recompute_[s] = stage_recomputes(recompute_policy_, plain[s].total(),
                                       static_cast<int64_t>(devices_[s].reg.memory_free));
  } else if (opts_.planner == "auto") {
    const Cluster cluster = profile_cluster();
    PlanOptions po;
    po.schedule = schedule_;
    po.microbatches = cfg_.microbatches;
    po.batch = cfg_.batch;
    po.encoding = encoding_;
    po.recompute = recompute_policy_;
    // --microbatches auto chooses M at the first plan only: a re-plan after a lost
    // device keeps it, so that the recovered run computes what the lost one would have.
    po.microbatches_auto = opts_.microbatches_auto && plan_epoch_ == 0;
    const ModelProfile mp = profile_model(spec_, cfg_.optimizer.kind, cfg_.optimizer.momentum);
    Plan pl = plan_microbatches(mp, cluster, po);
    cfg_.microbatches = pl.options.microbatches;
    pl.options.microbatches_auto = opts_.microbatches_auto;
    plan_json_ = to_json(pl, mp);
    profile_json_ = cluster_to_json(cluster);
    if (cfg_.progress) std::fprintf(stderr, "%s", format_plan_table(pl, mp).c_str());
    std::vector<StageDevice> ordered;
    bounds_ = {0};
    recompute_.clear();
    for (const StagePlan& st : pl.stages) {
      recompute_.push_back(st.recompute);
      ordered.push_back(*std::find_if(devices_.begin(), devices_.end(),
                                      [&](const StageDevice& d) { return d.name == st.device_name; }));
      bounds_.push_back(st.end);
    }
    for (const auto& d : devices_)
      if (std::none_of(ordered.begin(), ordered.end(), [&](const StageDevice& o) { return o.name == d.name; }))
        idle_.push_back(d);
    devices_ = ordered;
    predicted_batch_seconds_ = pl.batch_seconds;
  } else {
    fail("unknown --planner '" + opts_.planner + "': use auto or balance");
  }
  for (size_t i = 0; i < devices_.size(); ++i) devices_[i].stage = static_cast<int>(i);
  for (auto& d : idle_) d.stage = -1;
  stage_counts_ = stage_param_counts(spec_, bounds_);
}

// Assign stages (each daemon with a previous stage answers with the endpoint
// that stage must dial), connect them, and send the state to start from.
void Driver::assign_stages() {
  assigned_ = true;
  acked_.clear();
  plan_first_request_ = session_->next_request_id();  // every request of this plan has this id or a later one
  session_->pool().set_monitoring(true);
  const int p = static_cast<int>(devices_.size());
  for (int s = 0; s < p; ++s) {
    const PipelineJob job{schedule_to_wire(schedule_), cfg_.microbatches, cfg_.seed, cfg_.batch, job_id_, plan_epoch_,
                          recompute_[s]};
    AssignMsg a;
    a.stage = s;
    a.num_stages = p;
    a.layer_begin = bounds_[s];
    a.layer_end = bounds_[s + 1];
    a.model_spec_json = spec_.to_json().dump();
    a.optimizer = to_wire(ocfg_);
    a.job = job;
    a.link_encoding = encoding_;
    auto peer_of = [&](int i) { return PeerInfo{"", devices_[i].reg.public_key, devices_[i].name}; };
    if (s > 0) a.prev = peer_of(s - 1);
    if (s + 1 < p) a.next = peer_of(s + 1);
    Message m;
    m.body = a;
    const Received r = request(devices_[s].name, std::move(m), "its stage assignment", Millis(60000));
    acked_.insert(devices_[s].name);  // from now on, a registration of it means it left the job
    const nlohmann::json detail = ack_detail(r);
    devices_[s].peer_endpoint =
        reading(r.peer, "its stage assignment", [&] { return json_string(detail, "peer_endpoint", ""); });
  }
  for (int s = 0; s < p; ++s)
    (void)request(devices_[s].name,
                  command_message(ConnectCmd{s + 1 < p ? devices_[s + 1].peer_endpoint : std::string()}),
                  "the connect request", Millis(30000));
  for (const StageState& st : start_.stages)  // weights (and optimizer state) to start from
    (void)request(devices_[st.stage].name, stage_state_message(st, 0), "its starting state", Millis(60000));
  if (!recoveries_.empty() && catch_up_step_ >= 0 && recoveries_.back()["restore_seconds"].is_null()) {
    recoveries_.back()["restore_seconds"] = seconds_since(restored_at_);
    restored_at_ = Clock::now();
  }
}

void Driver::train() {
  pos_ = start_.position;
  step_ = next_loss_step_ = pos_.step;
  bar_ = std::make_unique<ProgressBar>(cfg_.progress);
  last_progress_ = Clock::now();
  const int64_t per_epoch = loader_->batches_per_epoch();
  bool stopped = false;
  for (int64_t epoch = pos_.epoch; epoch < cfg_.epochs && !stopped; ++epoch) {
    loader_->start_epoch(epoch);
    bar_->begin(epoch + 1, cfg_.epochs, per_epoch);
    t_epoch_ = Clock::now();
    epoch_first_step_ = step_;
    epoch_samples_ = 0;
    in_epoch_ = true;
    for (int64_t b = (epoch == start_.position.epoch ? start_.position.batch : 0); b < per_epoch; ++b) {
      if (cfg_.max_steps >= 0 && step_ >= cfg_.max_steps) {
        stopped = true;
        break;
      }
      stream_batch(step_, loader_->get(b));
      ++step_;
      pos_.step = step_;
      pos_.batch = b + 1;
      // Keep at most two steps in flight so the first stage can start the
      // next batch while the last one finishes this one.
      collect(step_ - 1);
      end_of_step(per_epoch);
    }
    collect(step_);
    if (!stopped || pos_.batch == per_epoch) {
      pos_.epoch = epoch + 1;
      pos_.batch = 0;
    }
    train_seconds_ += seconds_since(t_epoch_);
    in_epoch_ = false;
    // The default: one checkpoint per epoch (not after the last: the run ends there).
    if (opts_.checkpoint_every == 0 && pos_.batch == 0 && epoch + 1 < cfg_.epochs && !stopped) checkpoint(true, false);
    char summary[64];
    std::snprintf(summary, sizeof summary, "%.1f s", seconds_since(t_epoch_));
    bar_->end(summary);
    // --text: validate after each epoch; the last one's is the final evaluation (run()).
    if (!cfg_.text_path.empty() && !stopped && epoch + 1 < cfg_.epochs) val_losses_.push_back(validation_loss());
  }
  current_step_ = step_;
}

// --save-every and --checkpoint-every: one gather of the state serves both.
void Driver::end_of_step(int64_t per_epoch) {
  const bool to_save = cfg_.save_every > 0 && !cfg_.save_path.empty() && step_ % cfg_.save_every == 0;
  const bool to_dir = opts_.checkpoint_every > 0 && step_ % opts_.checkpoint_every == 0;
  if (!to_save && !to_dir) return;
  const TrainPosition here = pos_;
  if (pos_.batch == per_epoch) pos_ = {pos_.epoch + 1, 0, pos_.step};  // an epoch's last step: resume at the next
  checkpoint(to_dir, to_save);
  pos_ = here;
}

void Driver::load_whole(Partition& whole, const std::vector<float>& params) {
  if (static_cast<int64_t>(params.size()) != whole.param_count())
    fail("gathered " + std::to_string(params.size()) + " parameters from the stages but the model has " +
         std::to_string(whole.param_count()));
  whole.params().from_host(params);
}

// Between epochs, every step collected: the stages' weights evaluated here on
// the CPU, reading what the daemons send between batches so that their
// heartbeats keep flowing both ways.
double Driver::validation_loss() {
  std::vector<float> params;
  for (const StageState& s : gather_states(0)) params.insert(params.end(), s.params.begin(), s.params.end());
  auto cpu = open_device("cpu", DeviceOptions{});
  Partition whole(*cpu, spec_, 0, spec_.num_layers());
  load_whole(whole, params);
  const EvalResult ev = evaluate(whole, test_, 256, [&] {
    for (int i = 0; i < 64; ++i) {
      auto got = receive(Millis(0));
      if (!got) break;
      keep_reply(std::move(*got));
    }
  });
  last_progress_ = Clock::now();  // the evaluation's time is not a stall
  if (cfg_.progress)
    std::fprintf(stderr, "validation loss %.4f nats/byte (%lld windows)\n", ev.loss, static_cast<long long>(ev.samples));
  return ev.loss;
}

// One step: the step command to every stage, each micro-batch's inputs to the
// first stage and its labels to the last.
void Driver::stream_batch(int64_t step, Batch batch) {
  current_step_ = step;
  step_batch_[step] = batch.size;
  const Shape target = target_shape(spec_.loss, spec_.output());  // per sample: () class, (T) tokens, or the output
  const int64_t in_floats = numel(spec_.input);
  const int64_t target_floats = numel(target);
  const int m = static_cast<int>(std::min<int64_t>(cfg_.microbatches, batch.size));
  const auto deadline = static_cast<uint32_t>(std::min<int64_t>(step_deadline().count(), UINT32_MAX));
  const Message sc = command_message(StepCmd{step, batch.size, deadline, plan_epoch_}, session_->next_request_id());
  for (const auto& d : devices_) send(d.name, sc);
  auto xs = std::make_shared<std::vector<float>>(std::move(batch.x));
  auto ys = std::make_shared<std::vector<float>>(std::move(batch.y));
  for (int mb = 0; mb < m; ++mb) {
    const int64_t lo = microbatch_offset(batch.size, m, mb), hi = microbatch_offset(batch.size, m, mb + 1);
    TensorMsg xh{TensorKind::kInput, step, mb, batched(hi - lo, spec_.input), transport::Encoding::kF32, 0.f};
    send(devices_.front().name,
         make_tensor_message(xh, xs->data() + lo * in_floats, static_cast<size_t>((hi - lo) * in_floats), xs));
    TensorMsg yh{TensorKind::kLabels, step, mb, batched(hi - lo, target), transport::Encoding::kF32, 0.f};
    send(devices_.back().name, make_tensor_message(yh, ys->data() + lo * target_floats,
                                                   static_cast<size_t>((hi - lo) * target_floats), ys));
  }
  samples_ += batch.size;
  epoch_samples_ += batch.size;
}

void Driver::collect(int64_t upto) {
  while (next_loss_step_ < upto) {
    auto it = last_metrics_.find(next_loss_step_);
    if (it == last_metrics_.end()) {
      if (Clock::now() - last_progress_ > step_deadline() + Millis(opts_.peer_timeout_ms)) {
        const std::string text = stall_report();
        throw DeviceLost(text, devices_[static_cast<size_t>(late_stage())].name, "stalled");
      }
      (void)receive(Millis(50));
      continue;
    }
    const double loss = it->second.loss_sum / static_cast<double>(step_batch_[next_loss_step_]);
    losses_.push_back(loss);
    step_done_.push_back(Clock::now());
    if (step_done_.size() >= 2)
      slowest_step_ = std::max(slowest_step_, step_done_.back() - step_done_[step_done_.size() - 2]);
    last_metrics_.erase(it);
    ++next_loss_step_;
    if (catch_up_step_ >= 0 && next_loss_step_ >= catch_up_step_) {  // back where the loss was: caught up
      recoveries_.back()["catch_up_seconds"] = seconds_since(restored_at_);
      catch_up_step_ = -1;
    }
    bar_->update(next_loss_step_ - epoch_first_step_, loss,
                 epoch_samples_ / std::max(1e-9, seconds_since(t_epoch_)));
  }
}

// The longest any one wait of a step may take, on the daemons and here:
// --peer-timeout plus four times the slowest step so far; before a step has
// been timed, a minute (or ten predicted steps) for the warm-up.
Millis Driver::step_deadline() const {
  using std::chrono::duration_cast;
  const auto warm_up = std::max<Clock::duration>(std::chrono::seconds(60),
                                                 duration_cast<Clock::duration>(std::chrono::duration<double>(
                                                     10 * predicted_batch_seconds_)));
  const Clock::duration allowance = step_done_.size() >= 2 ? 4 * slowest_step_ : warm_up;
  return Millis(opts_.peer_timeout_ms) + duration_cast<Millis>(allowance);
}

// The first stage that has not finished the step the run waits for.
int Driver::late_stage() const {
  for (const auto& d : devices_) {
    const auto it = progress_.find(d.name);
    if ((it == progress_.end() ? -1 : it->second) < next_loss_step_) return d.stage;
  }
  return 0;
}

// What a stalled run was waiting for: each stage's last finished step.
std::string Driver::stall_report() const {
  std::string stages;
  for (const auto& d : devices_) {
    const auto it = progress_.find(d.name);
    const int64_t done = it == progress_.end() ? -1 : it->second;
    stages += (stages.empty() ? "" : ", ") + std::string("stage ") + std::to_string(d.stage) + " (" + d.name + ") " +
              (done < 0 ? "none yet" : "step " + std::to_string(done));
  }
  const StageDevice& late = devices_[static_cast<size_t>(late_stage())];
  return "the pipeline stalled: no stage finished a step for " +
         std::to_string(std::chrono::duration_cast<Millis>(Clock::now() - last_progress_).count() / 1000) +
         " s (the deadline is " + std::to_string(step_deadline().count() + opts_.peer_timeout_ms) +
         " ms, from --peer-timeout and the slowest step). Waiting for step " + std::to_string(next_loss_step_) +
         " of stage " + std::to_string(late.stage) + " (" + late.name + ")" +
         (late.stage > 0 ? ", which needs the link from stage " + std::to_string(late.stage - 1) + " (" +
                               devices_[static_cast<size_t>(late.stage - 1)].name + ")"
                         : "") +
         ". Last finished: " + stages;
}

// The stage blocks concatenate to the whole model's block; with the optimizer
// state when there is a checkpoint to write.
std::vector<float> Driver::gather_params() {
  if (!cfg_.save_path.empty()) {
    TrainingState st = assemble_training_state(cfg_, spec_, ocfg_, pos_,
                                               gather_states(optimizer_state_names(ocfg_).size()));
    save_training_state(cfg_.save_path, st);
    return std::move(st.params);
  }
  std::vector<float> params;
  for (const StageState& s : gather_states(0)) params.insert(params.end(), s.params.begin(), s.params.end());
  return params;
}

// Ends every stage's job, collecting its trace and busy time; releases the rest.
void Driver::finish_stages() {
  acked_.clear();  // each registers again once its job has ended: that is no loss now
  for (const auto& d : devices_) {
    const Received r = request(d.name, command_message(FinishCmd{}), "the finish request", Millis(30000));
    session_->pool().release(d.name);
    const nlohmann::json detail = ack_detail(r);
    reading(d.name, "the finish request", [&] {
      const nlohmann::json trace = detail.value("trace", nlohmann::json::array());
      if (!trace.is_array()) throw std::invalid_argument("\"trace\" must be an array, got " + json_type_name(trace));
      for (const auto& e : trace) events_.push_back(trace_event_from_json(e));
      stage_memory_.push_back({{"estimated", json_integer(detail, "estimated_memory_bytes", 0)},
                               {"peak", json_integer(detail, "peak_memory_bytes", 0)}});
      busy_.push_back({{"stage", d.stage}, {"device", d.name}, {"busy_seconds", json_object(detail, "busy")}});
    });
  }
  assigned_ = false;
  session_->pool().set_monitoring(false);
  std::vector<std::string> idle;
  for (const auto& d : idle_) idle.push_back(d.name);
  session_->release(idle, opts_.shutdown_daemons);
  if (opts_.shutdown_daemons)
    for (const auto& d : devices_) (void)session_->server().send(d.name, command_message(ShutdownCmd{}, session_->next_request_id()));
}

void Driver::write_trace() {
  if (opts_.trace_path.empty()) return;
  double origin = std::numeric_limits<double>::max();
  for (const auto& e : events_) origin = std::min(origin, e.start_us);
  for (auto& e : events_) e.start_us -= origin;
  std::vector<std::string> tracks;
  for (const auto& d : devices_) tracks.push_back("stage " + std::to_string(d.stage) + " (" + d.name + ")");
  std::ofstream out(opts_.trace_path);
  if (!out) fail("cannot write the trace to " + opts_.trace_path);
  out << chrome_trace(events_, tracks).dump() << "\n";
}

nlohmann::json Driver::result(const EvalResult& ev, int64_t parameters) const {
  TrainSummary summary{"pipeline", spec_, train_, test_, first_position_.step, step_ - first_position_.step, losses_,
                       ev, train_seconds_, seconds_since(t_start_), samples_, ocfg_, parameters};
  summary.val_losses = val_losses_;
  nlohmann::json out = training_result(cfg_, summary);
  out["schedule"] = schedule_name(schedule_);
  out["encoding"] = encoding_name(encoding_);
  out["recompute"] = recompute_name(recompute_policy_);
  out["microbatches_auto"] = opts_.microbatches_auto;  // "microbatches" (training_result) is the count used
  out["train_seconds"] = train_seconds_;
  out["median_step_seconds"] = median_step_seconds();
  nlohmann::json devs = nlohmann::json::array(), plan = nlohmann::json::array();
  for (const auto& d : devices_) {
    devs.push_back({{"name", d.name}, {"stage", d.stage}, {"gflops", d.reg.compute_gflops},
                    {"memory_total", d.reg.memory_total}, {"memory_free", d.reg.memory_free},
                    {"backends", d.reg.backends}, {"details", d.details}});
    plan.push_back({{"stage", d.stage}, {"device", d.name}, {"layers", {bounds_[d.stage], bounds_[d.stage + 1]}},
                    {"parameters", stage_counts_[static_cast<size_t>(d.stage)]}});
  }
  for (const auto& d : idle_)
    devs.push_back({{"name", d.name}, {"stage", -1}, {"gflops", d.reg.compute_gflops}, {"memory_free", d.reg.memory_free}});
  out["devices"] = devs;
  out["plan"] = plan;
  out["stages"] = stages_json();
  out["planner"] = plan_json_.is_null() ? "balance" : "auto";
  if (!plan_json_.is_null()) {
    out["planner_plan"] = plan_json_;
    out["cluster_profile"] = profile_json_;
    out["prediction"] = prediction();
  }
  out["stage_busy"] = busy_;
  out["refused_messages"] = session_->pool().refused_json();
  out.update(recovery_json());
  const int p = static_cast<int>(devices_.size());
  out["bubble_theoretical"] = bubble_fraction(schedule_, p, cfg_.microbatches);
  if (!opts_.trace_path.empty()) out["trace"] = opts_.trace_path;
  return out;
}

std::vector<StageMemory> Driver::stage_memories() const {
  std::vector<std::optional<Backend>> backends;
  for (const auto& d : devices_) backends.push_back(registered_backend(d.details));
  const std::vector<bool> recompute = recompute_.size() == devices_.size() ? recompute_ : std::vector<bool>{};
  return pipeline_memory(spec_, bounds_, cfg_.optimizer, cfg_.batch, cfg_.microbatches, schedule_, backends, recompute);
}

// Each stage's memory: the one model's estimate for the stage on its daemon's
// backend (what the planner placed it with and the daemon admitted it with),
// whether it recomputes its activations, and the peak its daemon's device
// really held (0 where the backend cannot tell: GPUs).
nlohmann::json Driver::stages_json() const {
  const auto memory = stage_memories();
  nlohmann::json out = nlohmann::json::array();
  for (size_t s = 0; s < devices_.size(); ++s) {
    const nlohmann::json& m = s < stage_memory_.size() ? stage_memory_[s] : nlohmann::json::object();
    out.push_back({{"stage", s},
                   {"device", devices_[s].name},
                   {"layers", {bounds_[s], bounds_[s + 1]}},
                   {"recompute", memory[s].recompute},
                   {"estimated_memory_bytes", memory[s].total()},
                   {"daemon_estimated_memory_bytes", m.value("estimated", nlohmann::json(0))},
                   {"peak_memory_bytes", m.value("peak", nlohmann::json(0))}});
  }
  return out;
}

// The plain mean batch time over the run (its first step included).
double Driver::mean_step_seconds() const {
  const int64_t run_steps = step_ - first_position_.step;
  return run_steps > 0 ? train_seconds_ / static_cast<double>(run_steps) : 0.0;
}

// The steady state's batch time: the median time between consecutive steps'
// completions (the first step's set-up and warm-up excluded); the mean when
// the run has fewer than three steps.
double Driver::median_step_seconds() const {
  std::vector<double> gaps;
  for (size_t i = 1; i < step_done_.size(); ++i)
    gaps.push_back(std::chrono::duration<double>(step_done_[i] - step_done_[i - 1]).count());
  if (gaps.size() < 2) return mean_step_seconds();
  std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
  return gaps[gaps.size() / 2];
}

// The planner predicts the steady state: compare with median_step_seconds;
// the plain mean over the run is reported beside it.
nlohmann::json Driver::prediction() const {
  const int64_t run_steps = step_ - first_position_.step;
  const double mean = mean_step_seconds();
  const double measured = median_step_seconds();
  // Each stage's compute (forward, backward, B, W, optimizer) per batch: the
  // plan's against the daemons' busy time over the steps run. It tells a wrong
  // layer profile apart from a wrong bubble.
  nlohmann::json stages = nlohmann::json::array();
  const auto& planned = plan_json_.contains("stages") ? plan_json_.at("stages") : nlohmann::json::array();
  for (size_t s = 0; s < busy_.size() && s < planned.size(); ++s) {
    double busy = 0;
    for (const char* k : {"forward", "backward", "B", "W", "optimizer"})
      busy += json_number(busy_[s].at("busy_seconds"), k, 0.0);
    const double per_batch = run_steps > 0 ? busy / static_cast<double>(run_steps) : 0.0;
    const double predicted = json_number(planned[s], "compute_seconds", 0.0);
    stages.push_back({{"stage", s},
                      {"compute_seconds", predicted},
                      {"link_cpu_seconds", json_number(planned[s], "link_cpu_seconds", 0.0)},
                      {"measured_compute_seconds", per_batch},
                      {"measured_over_predicted", predicted > 0 ? per_batch / predicted : 0.0}});
  }
  return {{"batch_seconds", predicted_batch_seconds_},
          {"measured_batch_seconds", measured},
          {"measured_mean_batch_seconds", mean},
          {"measured_over_predicted", predicted_batch_seconds_ > 0 ? measured / predicted_batch_seconds_ : 0.0},
          {"stages", stages}};
}

// ---------------------------------------------------------------------------
// Messages

void Driver::fail(const std::string& text) { throw std::runtime_error(text); }

void Driver::send(const std::string& peer, const Message& m) {
  Status s = session_->server().send(peer, m);
  if (s) return;
  const std::string text =
      "cannot reach device " + peer + " at step " + std::to_string(current_step_) + ": " + s.failure().message;
  if (is_stage(peer)) throw DeviceLost(text, peer, "unreachable: " + s.failure().message);
  fail(text);
}

bool Driver::is_stage(const std::string& peer) const {
  return assigned_ && std::any_of(devices_.begin(), devices_.end(), [&](const StageDevice& d) { return d.name == peer; });
}

void Driver::fail_if_a_stage_died() {
  if (!assigned_) return;
  for (const auto& d : devices_) {
    const PoolPeer& p = session_->pool().at(d.name);
    if (p.dead && !p.released)
      throw DeviceLost("device " + d.name + " (stage " + std::to_string(d.stage) + ") " + p.dead_reason +
                           " at step " + std::to_string(current_step_),
                       d.name, p.dead_reason);
  }
}

std::optional<Received> Driver::receive(Millis timeout) {
  auto r = session_->pool().receive(timeout);
  fail_if_a_stage_died();
  if (!r) return std::nullopt;
  Received& got = *r;
  if (std::holds_alternative<RegisterMsg>(got.message.body)) {
    offer_spare(got);  // a new or returning device, or a stage that left its job (DeviceLost)
    return std::nullopt;
  }
  if (auto* e = std::get_if<ErrorMsg>(&got.message.body)) {
    const std::string text =
        "device " + got.peer + " reported an error at step " + std::to_string(current_step_) + ": " + e->message;
    // The answer to a request of an earlier plan (a step the daemon popped
    // after that job ended), or a spare's: it changes nothing now.
    const bool stale = e->request_id != 0 && e->request_id < plan_first_request_;
    if (stale || (assigned_ && !is_stage(got.peer))) {
      session_->pool().refuse(got.peer, stale ? "stale_plan_epoch" : "error_outside_plan",
                              "refused an error report of " + got.peer + " (" + e->message + "): " +
                                  (stale ? "it answers a request of an earlier plan" : "it runs no stage of this plan"));
      return std::nullopt;
    }
    if (!assigned_) {  // registering, profiling or re-planning: an error answers our request
      if (e->code != ErrorCode::kNotAssigned) fail(text);
      return std::nullopt;
    }
    if (e->code == ErrorCode::kRefused) fail(text);  // an assignment it cannot take: re-planning would repeat it
    throw DeviceLost(text, got.peer, "its job failed: " + e->message);
  }
  if (auto* mm = std::get_if<MetricsMsg>(&got.message.body)) {
    accept_metrics(got.peer, *mm);
    return std::nullopt;
  }
  return std::move(got);
}

// A step's metrics count only from the daemon assigned the stage they name
// (by its authenticated name, not by the stage number it writes) and for a
// step in flight; the last stage's loss must be finite.
void Driver::accept_metrics(const std::string& peer, const MetricsMsg& mm) {
  PeerPool& pool = session_->pool();
  if (mm.job_id != job_id_ || mm.plan_epoch != plan_epoch_) {
    pool.refuse(peer, "stale_plan_epoch",
                "refused metrics from " + peer + " for step " + std::to_string(mm.step) + " of plan " +
                    std::to_string(mm.plan_epoch) + (mm.job_id != job_id_ ? " of another job" : "") +
                    ": the run is in plan " + std::to_string(plan_epoch_));
    return;
  }
  const auto it = std::find_if(devices_.begin(), devices_.end(), [&](const StageDevice& d) { return d.name == peer; });
  if (it == devices_.end() || it->stage < 0 || mm.stage != it->stage) {
    pool.refuse(peer, "metrics_from_wrong_stage",
                "refused metrics from " + peer + " for stage " + std::to_string(mm.stage) +
                    (it == devices_.end() || it->stage < 0 ? ": it runs no stage"
                                                           : ": it runs stage " + std::to_string(it->stage)));
    return;
  }
  // In flight for this stage: streamed, and after the last step it finished.
  const int64_t first = progress_.count(peer) ? progress_[peer] + 1 : start_.position.step;
  if (mm.step < first || mm.step >= step_) {
    pool.refuse(peer, "metrics_outside_step_window",
                "refused metrics from " + peer + " for step " + std::to_string(mm.step) + ": its steps in flight are " +
                    std::to_string(first) + ".." + std::to_string(step_ - 1));
    return;
  }
  progress_[peer] = mm.step;
  last_progress_ = Clock::now();
  if (mm.stage != static_cast<int>(devices_.size()) - 1) return;
  const double loss = mm.loss_sum / static_cast<double>(std::max<int64_t>(1, step_batch_[mm.step]));
  if (!std::isfinite(loss))
    fail("device " + peer + " (stage " + std::to_string(mm.stage) + ", the last) reported a non-finite loss (" +
         std::to_string(loss) + ") at step " + std::to_string(mm.step) + ": training diverged; lower --lr");
  last_metrics_[mm.step] = mm;
}

Received Driver::request(const std::string& peer, Message m, const char* what, Millis timeout) {
  m.request_id = session_->next_request_id();
  send(peer, m);
  awaiting_ = {{peer, m.request_id}};
  Received r = wait_for_reply(peer, m.request_id, what, timeout);
  awaiting_.clear();
  return r;
}

std::vector<Received> Driver::request_all(const std::vector<std::string>& peers, const Message& m, const char* what,
                                          Millis timeout) {
  awaiting_.clear();
  for (const std::string& peer : peers) {
    Message each = m;
    each.request_id = session_->next_request_id();
    send(peer, each);
    awaiting_[peer] = each.request_id;
  }
  // The replies come in any order: keep_reply holds each until its turn here.
  const auto t0 = Clock::now();
  std::vector<Received> out;
  for (const std::string& peer : peers) {
    const auto left = std::max(Millis(1), timeout - std::chrono::duration_cast<Millis>(Clock::now() - t0));
    out.push_back(wait_for_reply(peer, awaiting_.at(peer), what, left));
  }
  awaiting_.clear();
  return out;
}

Received Driver::wait_for_reply(const std::string& peer, uint64_t request_id, const char* what, Millis timeout) {
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < timeout) {
    if (auto it = replies_.find(peer); it != replies_.end()) {
      Received r = std::move(it->second);
      replies_.erase(it);
      return r;
    }
    auto got = receive(Millis(100));
    if (got) keep_reply(std::move(*got));
  }
  const std::string text =
      "device " + peer + " did not answer " + what + " within " + seconds_text(timeout.count());
  if (is_stage(peer)) throw DeviceLost(text, peer, "did not answer " + std::string(what));
  fail(text);
}

nlohmann::json Driver::ack_detail(const Received& r) {
  return reading(r.peer, "a request", [&] {
    const auto* a = std::get_if<AckMsg>(&r.message.body);
    if (!a) throw std::invalid_argument(std::string("expected an ack, got ") + body_kind_name(r.message.body));
    return parse_untrusted_object(a->detail, kReplyJsonLimits, "its acknowledgement", false);
  });
}

void Driver::unreadable(const std::string& peer, const char* what, const std::string& why) {
  session_->pool().count_refused("ack_detail_invalid");
  fail("device " + peer + " sent an unreadable reply to " + what + ": " + why);
}

// Requests go one at a time: the reply (ack or weights) counts only from the
// daemon asked, with the request's id; any other reply is refused.
void Driver::keep_reply(Received&& r) {
  const auto* a = std::get_if<AckMsg>(&r.message.body);
  if (!a && !std::holds_alternative<WeightsMsg>(r.message.body)) return;
  const uint64_t id = a ? a->request_id : r.message.request_id;
  if (auto it = awaiting_.find(r.peer); it != awaiting_.end() && id == it->second && id != 0) {
    const std::string peer = r.peer;
    replies_.insert_or_assign(peer, std::move(r));
    return;
  }
  session_->pool().refuse(r.peer, "unexpected_reply",
                          "refused a reply from " + r.peer + " to request " + std::to_string(id) +
                              ": nothing was asked of it");
}

void Driver::stop_all() {
  std::vector<std::string> all;
  for (const auto& d : devices_) all.push_back(d.name);
  for (const auto& d : idle_) all.push_back(d.name);
  session_->release(all, opts_.shutdown_daemons);
}

std::vector<StageState> Driver::gather_states(size_t buffers) {
  std::vector<StageState> out;
  const bool with_optimizer = buffers > 0;
  for (const auto& d : devices_) {
    const Received r =
        request(d.name, command_message(CheckpointCmd{with_optimizer ? StateKind::kParamsAndOptimizer : StateKind::kParams}),
                with_optimizer ? "the state request" : "the weights request", Millis(60000));
    try {
      StageState s = read_stage_state(r.message, stage_counts_[static_cast<size_t>(d.stage)], buffers);
      if (s.buffers.size() != buffers) throw std::invalid_argument("it holds no optimizer state");
      out.push_back(std::move(s));
    } catch (const std::exception& e) {
      fail("device " + d.name + " sent an unusable state for stage " + std::to_string(d.stage) + ": " + e.what());
    }
  }
  return out;
}

}  // namespace pipeline_detail

nlohmann::json train_pipeline(const TrainConfig& config, const ClusterOptions& cluster) {
  pipeline_detail::Driver driver(config, cluster);
  return driver.run();
}

}  // namespace cleave
