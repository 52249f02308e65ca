// pipeline_recovery.cpp: the pipeline driver's checkpoints and its recovery
// from a lost device (pipeline.h, docs/recovery.md).
//
// A loss (DeviceLost) ends the plan: every stage still there is told to drop
// its job and registers again; a stage that does not within --peer-timeout is
// dead too. The devices left and the spares that registered since are planned
// again, the newest valid checkpoint (or what the run started from) is cut
// into the new stages, and train() replays from its step. Each plan has its
// own epoch number: steps and metrics carry it, so a frozen device that wakes
// up cannot feed a step of an old plan into the new one.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <stdexcept>

#include "core/planner/memory_model.h"
#include "core/runtime/coordinator/pipeline_driver.h"
#include "core/train/train_data.h"
#include "core/util/seconds.h"
#include "transport/log.h"

namespace cleave {

void resolve_checkpoint_dir(ClusterOptions& cluster, const TrainConfig& config) {
  if (!cluster.checkpoint_dir.empty()) return;
  cluster.checkpoint_dir = default_checkpoint_dir(config.save_path, "cleave-train");
  cluster.checkpoint_dir_temporary = config.save_path.empty();
  cluster.checkpoint_dir_chosen = true;
}

namespace pipeline_detail {

using namespace transport;

// Opens the checkpoint directory and reads where the run starts: --resume's
// newest valid checkpoint, else --load / --init, else the seed.
void Driver::open_checkpoints() {
  ClusterOptions resolved = opts_;
  resolve_checkpoint_dir(resolved, cfg_);
  checkpoints_ = std::make_unique<CheckpointDir>(resolved.checkpoint_dir);
  temporary_checkpoints_ = resolved.checkpoint_dir_temporary;
  std::random_device rd;
  job_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  if (cfg_.progress)
    std::fprintf(stderr, "cleave: checkpoints in %s (every %s)\n", checkpoints_->dir().c_str(),
                 opts_.checkpoint_every > 0 ? (std::to_string(opts_.checkpoint_every) + " steps").c_str() : "epoch");
  if (!opts_.resume) {
    start_ = read_starting_point(cfg_, spec_, ocfg_, bounds_);
    // A new run: the checkpoints of an earlier one must not outrank its own.
    if (resolved.checkpoint_dir_chosen) checkpoints_->remove_checkpoints();
    else checkpoints_->refuse_foreign(start_.position.step, "cleave train --resume");
    return;
  }
  nlohmann::json from;
  start_ = restore_point(from);
  if (from.value("from", "") == "start")
    fail("--resume " + checkpoints_->dir() + ": no valid checkpoint there" +
         (checkpoint_warnings_.empty() ? std::string() : " (" + checkpoint_warnings_.dump() + ")") +
         ": start the run without --resume");
  resumed_ = from;
}

// The whole model and optimizer state, gathered from the stages, into the
// checkpoint directory and/or --save (atomic, checksummed: core/io/checkpoint.h).
void Driver::checkpoint(bool to_dir, bool to_save) {
  collect(step_);  // every stage has applied this step
  const TrainingState st =
      assemble_training_state(cfg_, spec_, ocfg_, pos_, gather_states(optimizer_state_names(ocfg_).size()));
  if (to_save) save_training_state(cfg_.save_path, st);
  if (to_dir) {
    checkpoints_->save(pos_.step, [&](const std::string& path) { save_training_state(path, st); });
    ++checkpoints_written_;
  }
  last_progress_ = Clock::now();  // the checkpoint's time is not a stall
}

// What to replay from: the newest checkpoint that loads and fits the model
// (a corrupt one is skipped, with the warning logged and kept for the
// result), else what the run started from. `from` says which.
StartingPoint Driver::restore_point(nlohmann::json& from) {
  std::vector<std::string> skipped;
  const auto newest = checkpoints_->newest<std::pair<std::string, StartingPoint>>(
      [&](const std::string& path) {
        TrainConfig c = cfg_;
        c.load_path = path;
        c.init_path.clear();
        return std::make_pair(path, read_starting_point(c, spec_, ocfg_, bounds_));
      },
      skipped);
  for (const std::string& s : skipped) {
    log(LogLevel::kWarning, "cleave: checkpoint skipped: " + s + "; using the one before it");
    checkpoint_warnings_.push_back(s);
  }
  from = {{"skipped", skipped}};
  if (newest) {
    from["from"] = newest->first;
    from["step"] = newest->second.position.step;
    return newest->second;
  }
  from["from"] = "start";
  if (opts_.resume && checkpoints_written_ + static_cast<int64_t>(resumed_.is_null() ? 0 : 1) > 0)
    fail("no valid checkpoint is left in " + checkpoints_->dir() + " to recover from");
  StartingPoint initial = read_starting_point(cfg_, spec_, ocfg_, bounds_);
  from["step"] = initial.position.step;
  return initial;
}

void Driver::recover(const DeviceLost& lost) {
  const auto t0 = Clock::now();
  const int64_t lost_step = next_loss_step_;
  if (static_cast<int>(recoveries_.size()) >= opts_.max_recoveries)
    fail(std::string(lost.what()) + "; the run has recovered " + std::to_string(recoveries_.size()) +
         " time(s), the most --max-recoveries allows");
  log(LogLevel::kWarning, std::string("cleave: ") + lost.what() + "; recovering");
  if (in_epoch_) train_seconds_ += seconds_since(t_epoch_);
  in_epoch_ = false;
  // How long each stage had been silent when the loss was noticed.
  std::map<std::string, double> silent;
  for (const auto& d : devices_) {
    const auto since = session_->server().since_last_seen(d.name);
    silent[d.name] = since ? since->count() / 1000.0 : 0.0;
  }
  settle_stages();
  nlohmann::json lost_devices = nlohmann::json::array();
  std::string device = lost.device;  // the device blamed first; the dead one when another died
  for (const auto& d : devices_)
    if (session_->pool().at(d.name).dead) lost_devices.push_back(d.name);
  if (!lost_devices.empty() && std::find(lost_devices.begin(), lost_devices.end(), device) == lost_devices.end())
    device = lost_devices.front().get<std::string>();
  nlohmann::json entry = {{"step", lost_step},
                          {"device", device},
                          {"reason", device == lost.device ? lost.reason : session_->pool().at(device).dead_reason},
                          {"detected_as", lost.what()},
                          {"lost_devices", lost_devices},
                          {"detect_seconds", silent[device]}};
  replan(lost_step);
  entry["replan_seconds"] = seconds_since(t0);
  const auto t_read = Clock::now();
  nlohmann::json from;
  start_ = restore_point(from);
  entry["read_seconds"] = seconds_since(t_read);
  entry["checkpoint"] = from;
  entry["replayed_steps"] = lost_step - start_.position.step;
  entry["plan"] = stages_json();
  entry["plan_epoch"] = plan_epoch_;
  entry["restore_seconds"] = nullptr;   // filled in once the new stages hold the checkpoint
  entry["catch_up_seconds"] = nullptr;  // and once they are back at `step` (null: another loss came first)
  recoveries_.push_back(entry);
  // Progress goes back to the checkpoint: its steps are trained again, in the same order.
  const auto kept = static_cast<size_t>(std::max<int64_t>(0, start_.position.step - first_position_.step));
  if (losses_.size() > kept) losses_.erase(losses_.begin() + static_cast<std::ptrdiff_t>(kept), losses_.end());
  if (step_done_.size() > kept) step_done_.resize(kept);
  const auto epochs_kept = static_cast<size_t>(std::max<int64_t>(0, start_.position.epoch - first_position_.epoch));
  if (val_losses_.size() > epochs_kept) val_losses_.erase(val_losses_.begin() + static_cast<std::ptrdiff_t>(epochs_kept), val_losses_.end());
  step_batch_.clear();
  last_metrics_.clear();
  progress_.clear();
  catch_up_step_ = lost_step;
  restored_at_ = Clock::now();
  if (cfg_.progress)
    std::fprintf(stderr, "\ncleave: recovery %zu: %zu stage(s) now, replaying from step %lld\n", recoveries_.size(),
                 devices_.size(), static_cast<long long>(start_.position.step));
}

// Ends the plan: every stage still alive is told to drop its job and comes
// back by registering again (cleaved does once its job ends). A stage that
// has not within --peer-timeout (plus a grace for a step in progress) is dead.
void Driver::settle_stages() {
  PeerPool& pool = session_->pool();
  assigned_ = false;
  acked_.clear();
  std::set<std::string> waiting;
  for (const auto& d : devices_) {
    if (pool.at(d.name).dead || left_job_.count(d.name)) continue;  // gone, or back already
    (void)session_->server().send(d.name, command_message(FinishCmd{}, session_->next_request_id()));
    waiting.insert(d.name);
  }
  const auto deadline = Clock::now() + Millis(opts_.peer_timeout_ms + 3000);
  while (!waiting.empty() && Clock::now() < deadline) {
    auto got = pool.receive(Millis(100));
    for (auto it = waiting.begin(); it != waiting.end();)
      it = pool.at(*it).dead ? waiting.erase(it) : std::next(it);
    if (!got) continue;
    if (const auto* reg = std::get_if<RegisterMsg>(&got->message.body)) {
      if (waiting.erase(got->peer) == 0) offer_spare(*got);
      else pool.at(got->peer).reg = *reg;  // back, its job's memory freed: what the re-plan counts
    } else if (const auto* mm = std::get_if<MetricsMsg>(&got->message.body)) {
      accept_metrics(got->peer, *mm);  // of the plan that ended: refused as stale once the epoch moves on
    }
  }
  for (const std::string& name : waiting)
    pool.mark_dead(name, "did not leave its job within " + seconds_text(opts_.peer_timeout_ms + 3000));
  left_job_.clear();
}

// Plans again over the devices still alive and the spares; checks the model
// still fits them.
void Driver::replan(int64_t lost_step) {
  PeerPool& pool = session_->pool();
  std::vector<StageDevice> live;
  for (auto group : {&devices_, &idle_})
    for (StageDevice d : *group)
      if (!pool.at(d.name).dead) {
        d.stage = -1;
        d.reg = pool.at(d.name).reg;  // its newest registration: free memory now
        live.push_back(std::move(d));
      }
  if (live.empty())
    fail("every device is gone after step " + std::to_string(lost_step) + ": start cleaved daemons again");
  std::sort(live.begin(), live.end(), [](const StageDevice& a, const StageDevice& b) { return a.name < b.name; });
  devices_ = std::move(live);
  idle_.clear();
  ++plan_epoch_;
  choose_stages();
  check_fits();
}

// Each stage's memory on its device (the one memory model), against what the
// device said it has free: a plan that no longer fits stops the run, saying
// how much is missing.
void Driver::check_fits() const {
  const auto memory = stage_memories();
  std::string missing;
  for (size_t s = 0; s < devices_.size(); ++s) {
    const size_t need = memory[s].total(), free = static_cast<size_t>(std::max<int64_t>(0, devices_[s].reg.memory_free));
    if (need > free)
      missing += "; stage " + std::to_string(s) + " on " + devices_[s].name + " needs " + format_mib(need) +
                 " but it has " + format_mib(free) + " free (" + format_mib(need - free) + " missing)";
  }
  if (!missing.empty())
    fail("the model no longer fits the " + std::to_string(devices_.size()) + " device(s) left" + missing);
}

// A registration during the run: a new device or one that came back waits as
// a spare for the next re-plan; a stage whose assignment was acknowledged
// registering again has left its job (messages of one connection arrive in order).
void Driver::offer_spare(const Received& r) {
  PeerPool& pool = session_->pool();
  const auto& reg = std::get<RegisterMsg>(r.message.body);
  if (is_stage(r.peer) && acked_.count(r.peer)) {
    left_job_.insert(r.peer);
    throw DeviceLost("device " + r.peer + " left its job at step " + std::to_string(current_step_) +
                         " (it registered again)",
                     r.peer, "left its job");
  }
  const Registration registration = parse_registration(r.peer, reg);
  const nlohmann::json& details = registration.details;
  if (!registration.details_error.empty())
    return session_->refuse_registration("device", r.peer, registration.details_error);
  if (const std::string why = check_pipeline_details(details); !why.empty())
    return session_->refuse_registration("device", r.peer, why);
  if (pool.has(r.peer) && !pool.at(r.peer).dead) {
    pool.at(r.peer).reg = reg;  // alive already: its free memory, now
    return;
  }
  const bool returning = pool.has(r.peer);
  pool.revive(r.peer, reg, details);
  auto known = [&](const std::vector<StageDevice>& v) {
    return std::any_of(v.begin(), v.end(), [&](const StageDevice& d) { return d.name == r.peer; });
  };
  if (!known(devices_) && !known(idle_)) idle_.push_back({r.peer, reg, -1, "", details});
  log(LogLevel::kInfo, "cleave: device " + r.peer + (returning ? " is back" : " registered") +
                           ": a spare for the next re-plan");
}

std::string Driver::resume_hint() const {
  if (!checkpoints_ || checkpoints_->list().empty()) return "";
  return ". The checkpoints are kept in " + checkpoints_->dir() + ": resume with `cleave train --resume " +
         checkpoints_->dir() + "` once enough cleaved daemons are running";
}

// The directory is ours when open_checkpoints made it, or when the CLI did
// (resolve_checkpoint_dir) and the run failed before opening it.
void Driver::remove_temporary_checkpoints(bool unless_resumable) {
  const bool ours = checkpoints_ ? temporary_checkpoints_ : opts_.checkpoint_dir_temporary;
  if (ours) remove_temporary_checkpoint_dir(checkpoints_ ? checkpoints_->dir() : opts_.checkpoint_dir, unless_resumable);
}

nlohmann::json Driver::recovery_json() const {
  nlohmann::json out = {{"recoveries", recoveries_},
                        {"checkpoints", {{"dir", checkpoints_->dir()},
                                         {"temporary", temporary_checkpoints_},
                                         {"every_steps", opts_.checkpoint_every},
                                         {"written", checkpoints_written_}}},
                        {"checkpoint_warnings", checkpoint_warnings_},
                        {"plan_epoch", plan_epoch_}};
  if (!resumed_.is_null()) out["resumed"] = resumed_;
  return out;
}

}  // namespace pipeline_detail
}  // namespace cleave
