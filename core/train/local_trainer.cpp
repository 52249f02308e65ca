// local_trainer.cpp: one-process training loop; see local_trainer.h.
#include "core/train/local_trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "core/model/partition.h"
#include "core/planner/memory_model.h"
#include "core/train/evaluate.h"
#include "core/train/progress.h"
#include "core/train/train_checkpoint.h"
#include "core/train/train_data.h"
#include "core/train/train_result.h"
#include "core/train/train_step.h"
#include "core/util/seconds.h"

namespace cleave {
namespace {

using Clock = std::chrono::steady_clock;

// One run in one process: the model on its device, its optimizer, where
// training stands, and what it has recorded so far.
class LocalRun {
 public:
  explicit LocalRun(const TrainConfig& cfg);
  nlohmann::json run();

 private:
  // The memory model's estimate of this run; throws OutOfMemory when it exceeds
  // what the device has free.
  size_t check_memory() const;
  void start();  // --load, --init or a fresh seeded model
  void save(const std::string& path);
  // One epoch; false when --max-steps stopped it.
  bool train_epoch(int64_t epoch);

  const TrainConfig& cfg_;
  const Clock::time_point t_start_ = Clock::now();
  ModelSpec spec_;
  Dataset train_, test_;
  std::unique_ptr<Device> device_;
  size_t estimated_bytes_ = 0;  // check_memory()
  std::unique_ptr<Partition> model_;
  std::unique_ptr<BatchLoader> loader_;
  OptimizerConfig ocfg_;
  std::unique_ptr<Optimizer> opt_;
  TrainPosition pos_;
  ProgressBar bar_;
  nlohmann::json losses_ = nlohmann::json::array();
  nlohmann::json epochs_json_ = nlohmann::json::array();
  nlohmann::json val_losses_ = nlohmann::json::array();  // --text: after each epoch
  int64_t samples_ = 0;
  double train_seconds_ = 0;
};

LocalRun::LocalRun(const TrainConfig& cfg) : cfg_(cfg), bar_(cfg.progress) {
  spec_ = ModelSpec::load(cfg.model_path);
  DeviceOptions dopts;
  dopts.threads = cfg.threads;
  device_ = open_device(cfg.backend, dopts);
  estimated_bytes_ = check_memory();  // before the data, the model or anything else is allocated
  TrainData data = load_train_data(cfg, spec_);
  train_ = std::move(data.train);
  test_ = std::move(data.test);
  model_ = std::make_unique<Partition>(*device_, spec_, 0, spec_.num_layers());
  loader_ = std::make_unique<BatchLoader>(train_, cfg.batch, /*shuffle=*/true, cfg.seed);
  ocfg_ = cfg.optimizer;
  if (ocfg_.total_steps == 0) ocfg_.total_steps = loader_->batches_per_epoch() * cfg.epochs;
  ocfg_.validate();
  opt_ = std::make_unique<Optimizer>(*device_, ocfg_, model_->param_count());
}

// The whole model is one stage on this device with one micro-batch in flight
// (train_step runs each micro-batch's forward and backward before the next):
// the number a daemon would admit it with (core/planner/memory_model.h).
size_t LocalRun::check_memory() const {
  const StageMemory need = stage_memory(spec_, 0, spec_.num_layers(), cfg_.optimizer, cfg_.batch, cfg_.microbatches,
                                        /*in_flight=*/1, device_->backend());
  const MemoryInfo mem = device_->memory();
  if (need.total() > mem.free)
    throw OutOfMemory(cfg_.model_path + " with --batch " + std::to_string(cfg_.batch) + " and --microbatches " +
                      std::to_string(cfg_.microbatches) + " needs an estimated " + need.describe() + " on " +
                      device_->name() + ", but only " + format_mib(mem.free) + " is free: use a smaller --batch, " +
                      "more --microbatches or a model with fewer layers, or split the model over cleaved daemons " +
                      "(cleave train without --local)");
  return need.total();
}

void LocalRun::start() {
  if (!cfg_.load_path.empty()) {
    TrainingState st = load_resume_state(cfg_.load_path, spec_, model_->param_count(), cfg_.batch);
    model_->params().from_host(st.params);
    opt_->load_state(st.optimizer_state, st.optimizer_blocks);
    pos_ = st.position;
  } else if (!cfg_.init_path.empty()) {
    model_->params().from_host(load_init_weights(spec_, cfg_.init_path));
  } else {
    model_->init(cfg_.seed);
  }
  model_->zero_grad();
}

void LocalRun::save(const std::string& path) {
  TrainingState st;
  st.model = spec_.to_json();
  st.optimizer = ocfg_.to_json();
  st.optimizer_state = opt_->state_meta();
  st.position = pos_;
  st.seed = cfg_.seed;
  st.batch_size = cfg_.batch;
  st.params = model_->params().to_host();
  for (const Tensor& t : opt_->state()) st.optimizer_blocks.push_back(t.to_host());
  save_training_state(path, st);
}

bool LocalRun::train_epoch(int64_t epoch) {
  const int64_t per_epoch = loader_->batches_per_epoch();
  loader_->start_epoch(epoch);
  bar_.begin(epoch + 1, cfg_.epochs, per_epoch);
  const auto t_epoch = Clock::now();
  double epoch_loss = 0;
  int64_t epoch_steps = 0, epoch_samples = 0;
  bool stopped = false;
  for (int64_t b = (epoch == pos_.epoch ? pos_.batch : 0); b < per_epoch; ++b) {
    if (cfg_.max_steps >= 0 && pos_.step >= cfg_.max_steps) {
      stopped = true;
      break;
    }
    const Batch batch = loader_->get(b);
    const StepResult r =
        train_step(*model_, *opt_, batch, cfg_.microbatches, DropoutKey(cfg_.seed, static_cast<uint64_t>(pos_.step)));
    const double loss = r.loss_sum / static_cast<double>(r.samples);
    if (!std::isfinite(loss))
      throw std::runtime_error("training diverged at step " + std::to_string(pos_.step) + " (loss is " +
                               std::to_string(loss) + "): lower --lr");
    losses_.push_back(loss);
    epoch_loss += loss;
    ++epoch_steps;
    epoch_samples += batch.size;
    samples_ += batch.size;
    ++pos_.step;
    pos_.batch = b + 1;
    bar_.update(b + 1, loss, epoch_samples / std::max(1e-9, seconds_since(t_epoch)));
    if (cfg_.save_every > 0 && !cfg_.save_path.empty() && pos_.step % cfg_.save_every == 0) save(cfg_.save_path);
  }
  const double epoch_seconds = seconds_since(t_epoch);
  train_seconds_ += epoch_seconds;
  if (!stopped || pos_.batch == per_epoch) {
    pos_.epoch = epoch + 1;
    pos_.batch = 0;
  }
  nlohmann::json ej = {{"epoch", epoch + 1},
                       {"steps", epoch_steps},
                       {"mean_loss", epoch_steps ? epoch_loss / epoch_steps : 0.0},
                       {"seconds", epoch_seconds},
                       {"samples_per_sec", epoch_samples / std::max(1e-9, epoch_seconds)}};
  char summary[64];
  std::snprintf(summary, sizeof summary, "mean loss %.4f", ej["mean_loss"].get<double>());
  bar_.end(summary);
  epochs_json_.push_back(ej);
  return !stopped;
}

nlohmann::json LocalRun::run() {
  start();
  const int64_t start_step = pos_.step;
  const bool text = !cfg_.text_path.empty();
  bool more = true;
  for (int64_t epoch = pos_.epoch; epoch < cfg_.epochs && more; ++epoch) {
    more = train_epoch(epoch);
    // The last epoch's validation is the final evaluation below.
    if (text && more && epoch + 1 < cfg_.epochs) val_losses_.push_back(evaluate(*model_, test_, 256).loss);
  }
  if (!cfg_.save_path.empty()) save(cfg_.save_path);
  const EvalResult ev = evaluate(*model_, test_, 256);
  if (text) val_losses_.push_back(ev.loss);
  print_evaluation(cfg_, ev);
  TrainSummary summary{"local", spec_, train_, test_, start_step, pos_.step - start_step, losses_, ev, train_seconds_,
                       seconds_since(t_start_), samples_, ocfg_, model_->param_count()};
  summary.val_losses = val_losses_;
  nlohmann::json out = training_result(cfg_, summary);
  out["epoch_stats"] = epochs_json_;
  out["backend"] = backend_name(device_->backend());
  out["device"] = device_->name();
  out["estimated_memory_bytes"] = estimated_bytes_;
  out["peak_memory_bytes"] = device_->peak_bytes_in_use();  // 0 where the backend cannot tell
  return out;
}

}  // namespace

nlohmann::json train_local(const TrainConfig& cfg) { return LocalRun(cfg).run(); }

}  // namespace cleave
