// fed_client.cpp: federated client rounds inside cleaved; see fed_client.h.
#include "core/runtime/daemon/fed_client.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>

#include "core/data/loader.h"
#include "core/data/shard.h"
#include "core/model/partition.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"
#include "core/runtime/daemon/fed_secagg_client.h"
#include "core/runtime/daemon/job_channel.h"
#include "core/planner/memory_model.h"
#include "core/runtime/common/wire.h"
#include "core/train/train_step.h"
#include "core/util/rng.h"
#include "transport/log.h"

namespace cleave {

using namespace transport;

void parse_shard_spec(const std::string& text, int& shard, int& num_shards) {
  const auto slash = text.find('/');
  auto bad = [&](const std::string& why) { return std::invalid_argument("--shard " + text + ": " + why); };
  if (slash == std::string::npos) throw bad("expected i/N, e.g. 0/4 (shards are numbered from 0)");
  long long i = 0, n = 0;
  try {
    size_t used_i = 0, used_n = 0;
    const std::string a = text.substr(0, slash), b = text.substr(slash + 1);
    i = std::stoll(a, &used_i);
    n = std::stoll(b, &used_n);
    if (used_i != a.size() || used_n != b.size()) throw std::invalid_argument("trailing text");
  } catch (const std::exception&) {
    throw bad("expected two integers i/N, e.g. 0/4");
  }
  if (n < 1 || n > 1000000) throw bad("the number of shards must be in [1, 1000000]");
  if (i < 0 || i >= n) throw bad("shard index must be in [0, " + std::to_string(n) + ")");
  shard = static_cast<int>(i);
  num_shards = static_cast<int>(n);
}

namespace {

// K of "scale:K", or nothing when `poison` is not of that form.
std::optional<double> poison_scale(const std::string& poison) {
  if (poison.rfind("scale:", 0) != 0) return std::nullopt;
  const std::string k = poison.substr(6);
  try {
    size_t used = 0;
    const double v = std::stod(k, &used);
    if (used == k.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The --poison test hook: corrupts the update `values` trained from `global`.
void poison_update(const std::string& poison, std::vector<float>& values, const std::vector<float>& global) {
  if (poison == "nan") std::fill(values.begin(), values.end(), std::numeric_limits<float>::quiet_NaN());
  if (poison == "inf") std::fill(values.begin(), values.end(), std::numeric_limits<float>::infinity());
  if (poison == "shape") values.pop_back();
  // A Byzantine client: its own step from the global block, reversed or magnified.
  const std::optional<double> scale = poison == "sign-flip" ? std::optional<double>(-1.0) : poison_scale(poison);
  if (scale)
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>(global[i] + *scale * (static_cast<double>(values[i]) - global[i]));
}

}  // namespace

std::string fed_poison_refusal(const std::string& poison) {
  if (poison.empty() || poison == "nan" || poison == "inf" || poison == "shape" || poison == "sign-flip" ||
      poison_scale(poison))
    return "";
  return "must be nan, inf, shape, sign-flip or scale:K (K a finite number), got '" + poison + "'";
}

bool is_fed_assign(const AssignMsg& assign) { return std::holds_alternative<transport::FedJob>(assign.job); }

void add_proximal_term(Device& device, const Tensor& grads, const Tensor& params, const Tensor& global, float mu) {
  if (!std::isfinite(mu) || mu < 0) throw std::invalid_argument("FedProx mu must be finite and >= 0, got " + std::to_string(mu));
  if (grads.numel() != params.numel() || global.numel() != params.numel())
    throw std::invalid_argument("proximal term: gradient, parameter and global blocks differ in size (" +
                                std::to_string(grads.numel()) + ", " + std::to_string(params.numel()) + ", " +
                                std::to_string(global.numel()) + ")");
  if (mu == 0) return;
  device.axpy(mu, params, grads);   // grads += mu * w
  device.axpy(-mu, global, grads);  // grads -= mu * w_global
}

FedClient::FedClient(FedClientOptions options) : options_(std::move(options)) {
  if (!options_.enabled()) throw std::invalid_argument("federated client: no --dataset given");
  if (options_.num_shards < 1 || options_.shard < 0 || options_.shard >= options_.num_shards)
    throw std::invalid_argument("federated client: shard " + std::to_string(options_.shard) + " of " +
                                std::to_string(options_.num_shards) + " is out of range");
  if (const std::string why = fed_poison_refusal(options_.poison); !why.empty()) throw std::invalid_argument("--poison " + why);
  if (options_.supplied) {
    check_dataset(*options_.supplied);
    data_ = *options_.supplied;
    return;
  }
  Dataset all = load_dataset(options_.dataset, options_.dataset_dir, /*train=*/true, options_.limit);
  data_ = subset(all, shard_indices(all, options_.shard, options_.num_shards, options_.partition, options_.seed));
}

nlohmann::json FedClient::register_details() const {
  return {{"fed_client", true},
          {"samples", data_.size()},
          {"shard", std::to_string(options_.shard) + "/" + std::to_string(options_.num_shards)},
          {"partition", options_.supplied ? "app" : options_.partition},
          {"dataset", data_.name}};
}

namespace {

using Clock = std::chrono::steady_clock;

// One federated job: the model, the received global block and the connection.
class FedClientJob {
 public:
  FedClientJob(JobChannel& channel, Device& device, const Dataset& data, const FedClientOptions& options,
               const KeyPair& keys, const std::string& name, int timeout_ms, const std::atomic<bool>& stop,
               const FedRoundHook& on_round)
      : channel_(channel), device_(device), data_(data), options_(options), keys_(keys), name_(name),
        timeout_ms_(timeout_ms), stop_(stop), on_round_(on_round) {}

  // Builds the model; throws with a message for the coordinator when it cannot.
  void setup(const AssignMsg& assign) {
    spec_ = parse_model_text(assign.model_spec_json, "assigned model");
    job_ = std::get<transport::FedJob>(assign.job);
    ocfg_ = from_wire(assign.optimizer);
    if (numel(spec_.input) != data_.sample_numel())
      throw std::runtime_error(name_ + ": the model's input " + shape_str(spec_.input) + " does not match its data (" +
                               data_.name + " samples " + shape_str(data_.sample_shape) + ")");
    const int64_t batch = job_.batch;
    StageMemory need = stage_memory(spec_, 0, spec_.num_layers(), ocfg_, batch, 1, 1, device_.backend());
    need.optimizer += need.params;  // the global block kept for FedProx
    const MemoryInfo mem = device_.memory();
    if (need.total() > mem.free)
      throw OutOfMemory(name_ + " cannot train the model: it needs " + need.describe() + " but only " +
                        format_mib(mem.free) + " is available");
    model_ = std::make_unique<Partition>(device_, spec_, 0, spec_.num_layers());
    model_->init(job_.seed);
    model_->zero_grad();
    global_ = Tensor(device_, {model_->param_count()});
  }

  JobEnd serve() {
    return serve_job(
        serving(), [this] {
          log(LogLevel::kInfo, "cleaved " + name_ + ": federated job finished after " + std::to_string(rounds_done_) +
                                   " round(s)");
          return nlohmann::json{{"rounds", rounds_done_}};
        },
        [this](const Command& c, uint64_t rid) { return handle(c, rid); });
  }

 private:
  JobServing serving() const { return {channel_, name_, "federated job", timeout_ms_, stop_}; }

  std::optional<JobEnd> handle(const Command& c, uint64_t rid) {
    const auto* fr = std::get_if<FedRoundCmd>(&c);
    if (!fr) {
      send(error_message(ErrorCode::kBadMessage, std::string("unexpected command '") + command_name(c) +
                                                     "' in a federated job", rid));
      return std::nullopt;
    }
    try {
      round(*fr, rid);
    } catch (const std::exception& e) {
      send(error_message(ErrorCode::kInternal, name_ + ": federated round failed: " + e.what(), rid));
    }
    return std::nullopt;
  }

  // Trains on the shard from the global block of this round; sends weights + metrics.
  // A stop, a shutdown, a silent coordinator or a stopping daemon abandons the
  // round; serve_job then ends the job.
  void round(const FedRoundCmd& cmd, uint64_t rid) {
    const int64_t r = cmd.round;
    const int epochs = cmd.local_epochs;
    const int64_t batch = cmd.batch;
    const float mu = cmd.mu;
    if (epochs < 1 || batch < 1) throw std::invalid_argument("local_epochs and batch must be positive");
    auto global_msg = channel_.take_weights(0);
    if (!global_msg || std::get<WeightsMsg>(global_msg->body).round != r)
      throw std::runtime_error("no global weights for round " + std::to_string(r) + " arrived before the round started");
    const std::vector<float> global_values = weights_values(*global_msg);
    if (static_cast<int64_t>(global_values.size()) != model_->param_count())
      throw std::runtime_error("global weights of round " + std::to_string(r) + " hold " +
                               std::to_string(global_values.size()) + " values, the model has " +
                               std::to_string(model_->param_count()));
    if (data_.size() == 0) throw std::runtime_error("this client's shard holds no training samples");
    const auto t0 = Clock::now();
    model_->params().from_host(global_values);
    global_.from_host(global_values);
    model_->zero_grad();
    const uint64_t seed = job_.seed;
    BatchLoader loader(data_, batch, /*shuffle=*/true, derive_seed(seed, static_cast<uint64_t>(r), 0xFED,
                                                                   static_cast<uint64_t>(options_.shard)));
    OptimizerConfig ocfg = ocfg_;
    if (ocfg.total_steps == 0) ocfg.total_steps = loader.batches_per_epoch() * epochs;
    Optimizer opt(device_, ocfg, model_->param_count());  // fresh state every round
    double loss_sum = 0;
    int64_t correct = 0, samples = 0, steps = 0;
    for (int e = 0; e < epochs; ++e) {
      loader.start_epoch(e);
      for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
        // Stay responsive: answer heartbeats, notice a stop.
        channel_.poll(Millis(0));
        if (const std::string why = job_interruption(serving()); !why.empty()) {
          log(LogLevel::kWarning, "cleaved " + name_ + ": round " + std::to_string(r + 1) + " abandoned: " + why);
          return;
        }
        const StepResult st = accumulate_gradients(
            *model_, loader.get(b), 1, DropoutKey::in_round(seed, static_cast<uint64_t>(r), static_cast<uint64_t>(steps)));
        add_proximal_term(device_, model_->grads(), model_->params(), global_, mu);
        apply_gradients(*model_, opt);
        loss_sum += st.loss_sum;
        correct += st.correct;
        samples += st.samples;
        ++steps;
      }
    }
    auto values = std::make_shared<std::vector<float>>(model_->params().to_host());
    poison_update(options_.poison, *values, global_values);
    const double train_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!upload(cmd, rid, global_values, values, samples)) return;
    MetricsMsg mm;
    mm.stage = 0;
    mm.step = r;
    mm.loss_sum = std::isfinite(loss_sum) ? loss_sum : 0.0;
    mm.correct = correct;
    mm.sample_count = samples;
    mm.train_ms = train_ms;
    mm.local_steps = steps;
    send(message_of(mm, rid));
    ++rounds_done_;
    if (on_round_) on_round_(r, samples ? loss_sum / static_cast<double>(samples) : 0.0);
    log(LogLevel::kInfo, "cleaved " + name_ + ": round " + std::to_string(r + 1) + ": " + std::to_string(samples) +
                             " samples, local loss " + std::to_string(samples ? loss_sum / static_cast<double>(samples) : 0.0));
  }

 public:
  void send(const Message& m) { channel_.send(m); }

 private:
  // The round's update to the coordinator: its weights in the clear, or, with
  // secure aggregation, only its masked difference from the global block
  // (fed_secagg_client.h). False when the secure exchange stopped short.
  bool upload(const FedRoundCmd& cmd, uint64_t rid, const std::vector<float>& global,
              const std::shared_ptr<std::vector<float>>& values, int64_t samples) {
    if (cmd.secagg) {
      // In double: the difference of two floats is exact there, so only the fixed-point step rounds.
      std::vector<double> delta(values->size());
      for (size_t i = 0; i < delta.size(); ++i) delta[i] = static_cast<double>((*values)[i]) - global[i];
      if (cmd.secagg->noise_stddev > 0 && !noise_) noise_ = std::make_unique<NoiseSource>();
      const std::string why = run_secure_upload(serving(), keys_, cmd, delta, samples, rid, noise_.get());
      if (!why.empty())
        log(LogLevel::kWarning, "cleaved " + name_ + ": round " + std::to_string(cmd.round + 1) + " abandoned: " + why);
      return why.empty();
    }
    WeightsMsg w;
    w.stage = 0;
    w.round = cmd.round;
    w.sample_count = samples;
    w.num_elements = static_cast<int64_t>(values->size());
    Message wm;
    wm.request_id = rid;
    wm.body = w;
    wm.payloads.push_back(Payload::of_floats(values));
    send(wm);
    return true;
  }

  JobChannel& channel_;
  Device& device_;
  const Dataset& data_;
  const FedClientOptions& options_;
  const KeyPair& keys_;
  std::unique_ptr<NoiseSource> noise_;  // secure aggregation with DP: this client's share of the noise
  std::string name_;
  int timeout_ms_;
  const std::atomic<bool>& stop_;
  const FedRoundHook& on_round_;
  ModelSpec spec_;
  transport::FedJob job_;
  OptimizerConfig ocfg_;
  std::unique_ptr<Partition> model_;
  Tensor global_;
  int64_t rounds_done_ = 0;
};

}  // namespace

JobEnd FedClient::run(JobChannel& channel, Device& device, const AssignMsg& assign, uint64_t assign_request_id,
                      const KeyPair& keys, const std::string& name, int coordinator_timeout_ms,
                      const std::atomic<bool>& stop, const FedRoundHook& on_round) {
  FedClientJob job(channel, device, data_, options_, keys, name, coordinator_timeout_ms, stop, on_round);
  try {
    job.setup(assign);
  } catch (const std::exception& e) {
    log(LogLevel::kWarning, "cleaved " + name + ": refused federated job: " + e.what());
    job.send(error_message(ErrorCode::kRefused, e.what(), assign_request_id));
    return JobEnd::refused;
  }
  log(LogLevel::kInfo, "cleaved " + name + ": federated job started (" + std::to_string(data_.size()) + " local samples)");
  job.send(ack_message(assign_request_id, {{"op", "fed_setup"}, {"samples", data_.size()}}));
  return job.serve();
}

}  // namespace cleave
