// local_trainer.cpp: one-process training loop; see local_trainer.h.
#include "core/train/local_trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "core/model/partition.h"
#include "core/train/evaluate.h"
#include "core/train/progress.h"
#include "core/train/train_checkpoint.h"
#include "core/train/train_step.h"

namespace cleave {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

nlohmann::json train_local(const TrainConfig& cfg) {
  const auto t_start = Clock::now();
  ModelSpec spec = ModelSpec::load(cfg.model_path);
  Dataset train = load_dataset(cfg.dataset, cfg.dataset_dir, /*train=*/true, cfg.limit_train);
  Dataset test = load_dataset(cfg.dataset, cfg.dataset_dir, /*train=*/false, cfg.limit_test);
  if (numel(train.sample_shape) != numel(spec.input))
    throw std::runtime_error(cfg.model_path + ": model input " + shape_str(spec.input) + " does not match the " +
                             train.name + " samples " + shape_str(train.sample_shape));

  DeviceOptions dopts;
  dopts.threads = cfg.threads;
  auto device = open_device(cfg.backend, dopts);
  Partition model(*device, spec, 0, spec.num_layers());

  BatchLoader loader(train, cfg.batch, /*shuffle=*/true, cfg.seed);
  const int64_t per_epoch = loader.batches_per_epoch();
  OptimizerConfig ocfg = cfg.optimizer;
  if (ocfg.total_steps == 0) ocfg.total_steps = per_epoch * cfg.epochs;
  ocfg.validate();
  Optimizer opt(*device, ocfg, model.param_count());

  TrainPosition pos;
  if (!cfg.load_path.empty()) {
    TrainingState st = load_resume_state(cfg.load_path, spec, model.param_count(), cfg.batch);
    model.params().from_host(st.params);
    opt.load_state(st.optimizer_state, st.optimizer_blocks);
    pos = st.position;
  } else if (!cfg.init_path.empty()) {
    model.params().from_host(load_init_weights(spec, cfg.init_path));
  } else {
    model.init(cfg.seed);
  }
  model.zero_grad();

  auto save = [&](const std::string& path) {
    TrainingState st;
    st.model = spec.to_json();
    st.optimizer = ocfg.to_json();
    st.optimizer_state = opt.state_meta();
    st.position = pos;
    st.seed = cfg.seed;
    st.batch_size = cfg.batch;
    st.params = model.params().to_host();
    for (const Tensor& t : opt.state()) st.optimizer_blocks.push_back(t.to_host());
    save_training_state(path, st);
  };

  nlohmann::json losses = nlohmann::json::array();
  nlohmann::json epochs_json = nlohmann::json::array();
  const int64_t start_step = pos.step;
  int64_t samples = 0;
  double train_seconds = 0;
  ProgressBar bar(cfg.progress);
  bool stopped = false;

  for (int64_t epoch = pos.epoch; epoch < cfg.epochs && !stopped; ++epoch) {
    loader.start_epoch(epoch);
    bar.begin(epoch + 1, cfg.epochs, per_epoch);
    const auto t_epoch = Clock::now();
    double epoch_loss = 0;
    int64_t epoch_steps = 0, epoch_samples = 0;
    for (int64_t b = (epoch == pos.epoch ? pos.batch : 0); b < per_epoch; ++b) {
      if (cfg.max_steps >= 0 && pos.step >= cfg.max_steps) {
        stopped = true;
        break;
      }
      const Batch batch = loader.get(b);
      const StepResult r =
          train_step(model, opt, batch, cfg.microbatches, DropoutKey(cfg.seed, static_cast<uint64_t>(pos.step)));
      const double loss = r.loss_sum / static_cast<double>(r.samples);
      if (!std::isfinite(loss))
        throw std::runtime_error("training diverged at step " + std::to_string(pos.step) +
                                 " (loss is " + std::to_string(loss) + "): lower --lr");
      losses.push_back(loss);
      epoch_loss += loss;
      ++epoch_steps;
      epoch_samples += batch.size;
      samples += batch.size;
      ++pos.step;
      pos.batch = b + 1;
      bar.update(b + 1, loss, epoch_samples / std::max(1e-9, seconds_since(t_epoch)));
      if (cfg.save_every > 0 && !cfg.save_path.empty() && pos.step % cfg.save_every == 0) save(cfg.save_path);
    }
    const double epoch_seconds = seconds_since(t_epoch);
    train_seconds += epoch_seconds;
    if (!stopped || pos.batch == per_epoch) {
      pos.epoch = epoch + 1;
      pos.batch = 0;
    }
    nlohmann::json ej = {{"epoch", epoch + 1},
                         {"steps", epoch_steps},
                         {"mean_loss", epoch_steps ? epoch_loss / epoch_steps : 0.0},
                         {"seconds", epoch_seconds},
                         {"samples_per_sec", epoch_samples / std::max(1e-9, epoch_seconds)}};
    char summary[64];
    std::snprintf(summary, sizeof summary, "mean loss %.4f", ej["mean_loss"].get<double>());
    bar.end(summary);
    epochs_json.push_back(ej);
  }

  if (!cfg.save_path.empty()) save(cfg.save_path);
  EvalResult ev = evaluate(model, test, 256);
  if (cfg.progress)
    std::fprintf(stderr, "test accuracy %.4f  test loss %.4f  (%lld samples)\n", ev.accuracy, ev.loss,
                 static_cast<long long>(ev.samples));

  nlohmann::json out;
  out["mode"] = "local";
  out["model"] = spec.name;
  out["model_path"] = cfg.model_path;
  out["dataset"] = train.name;
  out["train_samples"] = train.size();
  out["test_samples"] = test.size();
  out["epochs"] = cfg.epochs;
  out["batch"] = cfg.batch;
  out["microbatches"] = cfg.microbatches;
  out["seed"] = cfg.seed;
  out["start_step"] = start_step;
  out["steps"] = pos.step - start_step;
  out["losses"] = losses;
  out["epoch_stats"] = epochs_json;
  out["test_accuracy"] = ev.accuracy;
  out["test_loss"] = ev.loss;
  out["samples_per_sec"] = samples / std::max(1e-9, train_seconds);
  out["wall_seconds"] = seconds_since(t_start);
  out["optimizer"] = ocfg.to_json();
  out["backend"] = backend_name(device->backend());
  out["device"] = device->name();
  out["parameters"] = model.param_count();
  return out;
}

}  // namespace cleave
