// split_client.cpp: the client role of split learning; see split_job.h.
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>

#include "core/data/loader.h"
#include "core/data/shard.h"
#include "core/model/partition.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"
#include "core/planner/memory_model.h"
#include "core/runtime/daemon/activation_noise.h"
#include "core/runtime/daemon/split_job.h"
#include "core/runtime/daemon/split_link.h"
#include "core/runtime/common/wire.h"
#include "core/train/train_step.h"
#include "core/util/rng.h"
#include "transport/endpoint.h"
#include "transport/link.h"
#include "transport/log.h"

namespace cleave {

using namespace transport;

namespace {

using Clock = std::chrono::steady_clock;

// The client's front (and tail), its data and its link to the server.
class SplitClient {
 public:
  SplitClient(const SplitJobContext& ctx, const Dataset& train, const FedClientOptions& data)
      : ctx_(ctx), train_(train), data_(data) {}

  nlohmann::json setup(const AssignMsg& a) {
    spec_ = parse_model_text(a.model_spec_json, "assigned model");
    const SplitJob& job = std::get<SplitJob>(a.job);
    labels_on_client_ = job.labels_on_client;
    index_ = job.client_index;
    seed_ = job.seed;
    batch_ = job.batch;
    eval_batch_ = job.eval_batch;
    if (batch_ < 1 || eval_batch_ < 1) throw std::invalid_argument("batch sizes must be positive");
    set_activation_noise(job);
    const int cut = a.layer_end, cut_back = job.cut_back >= 0 ? job.cut_back : spec_.num_layers();
    if (a.layer_begin != 0 || cut < 1 || cut >= spec_.num_layers() || (labels_on_client_ && (cut_back <= cut || cut_back >= spec_.num_layers())))
      throw std::invalid_argument("bad split layout: front [" + std::to_string(a.layer_begin) + ", " + std::to_string(cut) +
                                  "), back cut " + std::to_string(cut_back) + " of " + std::to_string(spec_.num_layers()) + " layers");
    if (numel(spec_.input) != train_.sample_numel())
      throw std::runtime_error(ctx_.options.name + ": the model's input " + shape_str(spec_.input) +
                               " does not match its data (" + train_.name + " samples " + shape_str(train_.sample_shape) + ")");
    if (train_.size() == 0) throw std::runtime_error(ctx_.options.name + ": this client's shard holds no training samples");
    OptimizerConfig ocfg = from_wire(a.optimizer);
    loader_ = std::make_unique<BatchLoader>(train_, batch_, /*shuffle=*/true, seed_ + static_cast<uint64_t>(index_));
    if (ocfg.total_steps == 0) ocfg.total_steps = loader_->batches_per_epoch() * job.epochs;
    check_memory(ocfg, cut, cut_back);
    front_ = std::make_unique<Partition>(ctx_.device, spec_, 0, cut);
    front_->init(seed_);
    front_->zero_grad();
    front_opt_ = std::make_unique<Optimizer>(ctx_.device, ocfg, front_->param_count());
    if (labels_on_client_) {
      tail_ = std::make_unique<Partition>(ctx_.device, spec_, cut_back, spec_.num_layers());
      tail_->init(seed_);
      tail_->zero_grad();
      tail_opt_ = std::make_unique<Optimizer>(ctx_.device, ocfg, tail_->param_count());
    }
    load_test_split(job.limit_test);
    // The cut-layer link: straight to the server, never through the coordinator.
    if (!a.next) throw std::invalid_argument("the split assignment names no server");
    ClientOptions lo;
    lo.connect = a.next->endpoint;
    lo.keys = ctx_.keys;
    lo.server_public_key = a.next->public_key;
    lo.insecure = ctx_.options.insecure;
    lo.label = "cleaved " + ctx_.options.name + " -> split server";
    auto link = dial_tensor_link(lo, a.link_encoding);
    if (ctx_.options.bandwidth_limit > 0) link = throttle_link(std::move(link), ctx_.options.bandwidth_limit);
    link_ = std::make_unique<SplitLink>(std::move(link), a.next->name.empty() ? "server" : a.next->name, ctx_);
    log(LogLevel::kInfo, "cleaved " + ctx_.options.name + ": split client " + std::to_string(index_) + ": layers 0.." +
                             std::to_string(cut - 1) + (labels_on_client_ ? " and " + std::to_string(cut_back) + ".." +
                                                                               std::to_string(spec_.num_layers() - 1) : "") +
                             ", " + std::to_string(train_.size()) + " training and " + std::to_string(test_.size()) +
                             " test samples");
    return {{"op", "split_setup"}, {"samples", train_.size()}, {"test_samples", test_.size()},
            {"batches_per_epoch", loader_->batches_per_epoch()}, {"test_batches", test_batches()}};
  }

  JobEnd serve() {
    return serve_job(
        split_serving(ctx_), [this] { return nlohmann::json{{"steps", train_steps_}}; },
        [this](const Command& c, uint64_t rid) { return handle(c, rid); });
  }

 private:
  // Throws OutOfMemory when the front (and tail) cannot fit on the device.
  void check_memory(const OptimizerConfig& ocfg, int cut, int cut_back) const {
    const int64_t work_batch = std::max(batch_, eval_batch_);
    StageMemory need = stage_memory(spec_, 0, cut, ocfg, work_batch, 1, 1, ctx_.device.backend());
    if (labels_on_client_) {
      const StageMemory tail = stage_memory(spec_, cut_back, spec_.num_layers(), ocfg, work_batch, 1, 1, ctx_.device.backend());
      need.params += tail.params;
      need.grads += tail.grads;
      need.optimizer += tail.optimizer;
      need.activations += tail.activations;
      need.workspace += tail.workspace;
    }
    const MemoryInfo mem = ctx_.device.memory();
    if (need.total() > mem.free)
      throw OutOfMemory(ctx_.options.name + " cannot host the split client part: it needs " + need.describe() +
                        " but only " + format_mib(mem.free) + " is available");
  }

  // The test split, cut into the same shards as the training split (an app
  // supplies its own test samples, or none: evaluation then covers 0 samples).
  void load_test_split(int64_t limit_test) {
    if (data_.supplied_test) {
      const int64_t keep = limit_test > 0 ? std::min<int64_t>(limit_test, data_.supplied_test->size())
                                          : data_.supplied_test->size();
      std::vector<int64_t> first(static_cast<size_t>(keep));
      std::iota(first.begin(), first.end(), int64_t{0});
      test_ = subset(*data_.supplied_test, first);
    } else if (!data_.supplied) try {
      Dataset all = load_dataset(data_.dataset, data_.dataset_dir, /*train=*/false, limit_test);
      test_ = subset(all, shard_indices(all, data_.shard, data_.num_shards, data_.partition, data_.seed));
    } catch (const std::exception& e) {
      log(LogLevel::kWarning, "cleaved " + ctx_.options.name + ": no test data for split evaluation: " + e.what());
    }
  }

  int64_t test_batches() const { return (test_.size() + eval_batch_ - 1) / eval_batch_; }

  std::optional<JobEnd> handle(const Command& c, uint64_t rid) {
    return run_split_command(ctx_, "split client", rid, [&]() -> std::optional<JobEnd> {
      if (std::holds_alternative<CheckpointCmd>(c)) {  // SplitFed: hand the client-side blocks in for averaging
        send_weights(0, *front_, rid);
        if (tail_) send_weights(2, *tail_, rid);
        return std::nullopt;
      }
      const auto* cmd = std::get_if<SplitRoundCmd>(&c);
      if (!cmd) {
        ctx_.channel.send(error_message(ErrorCode::kBadMessage, std::string("unexpected command '") + command_name(c) +
                                                                    "' in a split job", rid));
        return std::nullopt;
      }
      const int round = static_cast<int>(cmd->round);
      nlohmann::json done = {{"op", std::string(split_phase_name(cmd->phase)) + "_done"}, {"round", round}};
      if (cmd->phase == SplitPhase::kTrain) {
        done["steps"] = train_round(round);
      } else if (cmd->phase == SplitPhase::kEval) {
        evaluate(round);
      } else {  // SplitFed: the averaged blocks arrived just before
        take_weights(0, *front_);
        if (tail_) take_weights(2, *tail_);
      }
      const LinkStats s = link_->stats();
      done["bytes_sent"] = s.payload_bytes_sent;
      done["bytes_received"] = s.payload_bytes_received;
      ctx_.channel.send(ack_message(rid, done));
      return std::nullopt;
    });
  }

  // One pass over the shard; returns the batches trained.
  int64_t train_round(int round) {
    Device& dev = ctx_.device;
    loader_->start_epoch(round);
    const bool classify = spec_.loss == LossKind::cross_entropy;
    int64_t steps = 0;
    samples_last_round_ = 0;
    for (int64_t b = 0; b < loader_->batches_per_epoch(); ++b) {
      ctx_.channel.drain();
      check_split_job_alive(ctx_);
      const Batch bt = loader_->get(b);
      Tensor x(dev, batched(bt.size, spec_.input));
      x.from_host(bt.x.data());
      Tensor t(dev, classify ? Shape{bt.size} : batched(bt.size, spec_.output()));
      t.from_host(bt.y.data());
      const uint64_t dropout_seed =
          DropoutKey(seed_ + static_cast<uint64_t>(index_), static_cast<uint64_t>(train_steps_)).microbatch_seed(0);
      double step_loss = std::nan("");
      Tensor a = front_->forward(x, 0, /*training=*/true, dropout_seed);
      std::vector<float> clip_scales;
      link_->send(TensorKind::kActivation, seq_, released(a, clip_scales));
      if (!labels_on_client_) {
        link_->send(TensorKind::kLabels, seq_, t);  // vanilla: the labels go to the server
      } else {
        Tensor h = link_->receive(TensorKind::kActivation, seq_, tail_->input_shape(), bt.size);
        const MicrobatchResult tr =
            train_microbatch(*tail_, h, t, 0, dropout_seed, 1.0f / static_cast<float>(bt.size), /*need_dx=*/true);
        link_->send(TensorKind::kGradient, seq_, tr.dx);
        apply_gradients(*tail_, *tail_opt_);
        MetricsMsg mm;
        mm.stage = index_;
        mm.step = train_steps_;
        mm.loss_sum = tr.loss.loss_sum;
        step_loss = tr.loss.loss_sum / static_cast<double>(bt.size);
        mm.correct = tr.loss.correct;
        mm.sample_count = bt.size;
        mm.phase = SplitPhase::kTrain;
        mm.round = round;
        ctx_.channel.send(message_of(mm));
      }
      Tensor da = link_->receive(TensorKind::kGradient, seq_, front_->output_shape(), bt.size);
      front_->backward(through_clip(da, clip_scales), 0, /*need_dx=*/false);
      apply_gradients(*front_, *front_opt_);
      ctx_.progress("split", train_steps_, step_loss);  // the loss only where this client computes it (U-shaped)
      ++seq_;
      ++train_steps_;
      ++steps;
      samples_last_round_ += bt.size;
    }
    return steps;
  }

  void evaluate(int round) {
    Device& dev = ctx_.device;
    const bool classify = spec_.loss == LossKind::cross_entropy;
    double loss_sum = 0;
    int64_t correct = 0;
    for (int64_t lo = 0; lo < test_.size(); lo += eval_batch_) {
      ctx_.channel.drain();
      check_split_job_alive(ctx_);
      const int64_t n = std::min(eval_batch_, test_.size() - lo);
      const int64_t per = test_.sample_numel();
      Tensor x(dev, batched(n, spec_.input));
      x.from_host(test_.x.data() + lo * per);
      Tensor t(dev, classify ? Shape{n} : batched(n, spec_.output()));
      t.from_host(test_.y.data() + lo * (classify ? 1 : numel(spec_.output())));
      Tensor a = front_->forward(x, 0, /*training=*/false);
      std::vector<float> clip_scales;  // no backward: unused
      link_->send(TensorKind::kActivation, seq_, released(a, clip_scales));
      Tensor z = link_->receive(TensorKind::kActivation, seq_, tail_ ? tail_->input_shape() : spec_.output(), n);
      ++seq_;
      if (tail_) z = tail_->forward(z, 0, /*training=*/false);
      Tensor dz(dev, z.shape());
      const LossResult r = compute_loss(dev, spec_.loss, z, t, dz, 1.0f);
      loss_sum += r.loss_sum;
      correct += r.correct;
    }
    MetricsMsg mm;
    mm.stage = index_;
    mm.step = round;
    mm.loss_sum = loss_sum;
    mm.correct = correct;
    mm.sample_count = test_.size();
    mm.phase = SplitPhase::kEval;
    mm.round = round;
    ctx_.channel.send(message_of(mm));
  }


  // Local DP on the cut layer (activation_noise.h), when the job asks for it.
  void set_activation_noise(const SplitJob& job) {
    act_noise_ = job.activation_noise;
    act_clip_ = job.activation_clip;
    if (!std::isfinite(act_noise_) || act_noise_ < 0 || (act_noise_ > 0 && !(std::isfinite(act_clip_) && act_clip_ > 0)))
      throw std::invalid_argument("bad cut-layer noise: activation_noise and a positive activation_clip are needed");
    if (act_noise_ > 0) noise_ = std::make_unique<NoiseSource>();  // from the OS, never from the run's seed
  }

  // What leaves the device for the front's output `a`: `a` itself without
  // noise; with it, a new tensor of the clipped and noised rows (the front
  // keeps `a`, which its backward may read), and `scales` the rows' clip factors.
  // Evaluation batches too: local DP must hold for every release, and the
  // server cannot tell a test batch from a training one.
  Tensor released(const Tensor& a, std::vector<float>& scales) {
    if (!noise_) return a;
    std::vector<float> v = a.to_host();
    scales = clip_and_noise(v, numel(front_->output_shape()), act_clip_, act_noise_, *noise_);
    Tensor out(ctx_.device, a.shape());
    out.from_host(v);
    return out;
  }

  // The server's gradient is with respect to the released rows. The noise is
  // additive, so it passes unchanged; through the clip each row's scale
  // s = min(1, C / |a|) is held constant and the front gets s * da (the usual
  // treatment of a norm clip). The exact Jacobian of a clipped row,
  // s (I - u u^T) with u = a / |a|, would also remove the gradient's component
  // along a, since changing |a| does not move a row that stays clipped;
  // holding s passes that component on, so the front may grow or shrink |a|
  // as well, which changes nothing the server sees while |a| > C. It keeps
  // the backward a per-row scale on the host, exact for every row within the clip.
  Tensor through_clip(Tensor da, const std::vector<float>& scales) {
    if (!noise_) return da;
    std::vector<float> g = da.to_host();
    scale_rows(g, numel(front_->output_shape()), scales);
    da.from_host(g);  // `da` is the link's fresh tensor: nobody else holds it
    return da;
  }

  void send_weights(int stage, const Partition& p, uint64_t rid) {
    auto values = std::make_shared<std::vector<float>>(p.params().to_host());
    WeightsMsg w;
    w.stage = stage;
    w.round = train_steps_;
    w.sample_count = samples_last_round_;
    w.num_elements = static_cast<int64_t>(values->size());
    Message m = make_weights_message(w, values->data(), values->size(), values);
    m.request_id = rid;
    ctx_.channel.send(m);
  }

  void take_weights(int stage, Partition& p) {
    auto m = ctx_.channel.take_weights(stage);
    if (!m) throw std::runtime_error("no averaged weights for block " + std::to_string(stage) + " arrived");
    const auto& w = std::get<WeightsMsg>(m->body);
    if (w.num_elements != p.param_count())
      throw std::runtime_error("averaged block " + std::to_string(stage) + " holds " + std::to_string(w.num_elements) +
                               " values, the part has " + std::to_string(p.param_count()));
    p.params().from_host(weights_values(*m));
  }

  const SplitJobContext& ctx_;
  const Dataset& train_;
  const FedClientOptions& data_;
  ModelSpec spec_;
  bool labels_on_client_ = false;
  int index_ = 0;
  uint64_t seed_ = 1;
  int64_t batch_ = 64, eval_batch_ = 256;
  std::unique_ptr<BatchLoader> loader_;
  Dataset test_;
  std::unique_ptr<Partition> front_, tail_;
  std::unique_ptr<Optimizer> front_opt_, tail_opt_;
  std::unique_ptr<SplitLink> link_;
  float act_noise_ = 0, act_clip_ = 0;  // SIGMA and C of the cut-layer noise (0: off)
  std::unique_ptr<NoiseSource> noise_;  // set when act_noise_ > 0
  int64_t seq_ = 0, train_steps_ = 0, samples_last_round_ = 0;
};

}  // namespace

JobEnd run_split_client(const SplitJobContext& ctx, const Dataset& train, const FedClientOptions& data,
                             const AssignMsg& assign, uint64_t request_id) {
  SplitClient client(ctx, train, data);
  if (!set_up_job(ctx, "split client job", request_id, [&] { return client.setup(assign); })) return JobEnd::refused;
  return client.serve();
}

}  // namespace cleave
