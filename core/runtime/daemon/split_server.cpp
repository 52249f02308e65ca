// split_server.cpp: the server role of split learning; see split_job.h.
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/model/partition.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"
#include "core/planner/memory_model.h"
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

bool is_split_assign(const AssignMsg& assign) { return std::holds_alternative<SplitJob>(assign.job); }

namespace {

using Clock = std::chrono::steady_clock;

void info(const SplitJobContext& ctx, const std::string& text) {
  log(LogLevel::kInfo, "cleaved " + ctx.options.name + ": " + text);
}

// The server's part and one link per client.
class SplitServer {
 public:
  explicit SplitServer(const SplitJobContext& ctx) : ctx_(ctx) {}

  // Builds the part and binds the clients' endpoints; returns them for the ack.
  nlohmann::json setup(const AssignMsg& a) {
    spec_ = parse_model_text(a.model_spec_json, "assigned model");
    const SplitJob& job = std::get<SplitJob>(a.job);
    labels_on_client_ = job.labels_on_client;
    seed_ = job.seed;
    const int64_t batch = job.batch;
    const OptimizerConfig ocfg = from_wire(a.optimizer);
    const auto& clients = job.clients;
    if (clients.empty()) throw std::invalid_argument("a split server needs at least one client");
    // Activations of one batch in flight, plus the evaluation batch's working set.
    const StageMemory need = stage_memory(spec_, a.layer_begin, a.layer_end, ocfg,
                                          std::max<int64_t>(batch, job.eval_batch), 1, 1, ctx_.device.backend());
    const MemoryInfo mem = ctx_.device.memory();
    if (need.total() > mem.free)
      throw OutOfMemory(ctx_.options.name + " cannot host the split server part (layers " + std::to_string(a.layer_begin) +
                        ".." + std::to_string(a.layer_end - 1) + "): it needs " + need.describe() + " but only " +
                        format_mib(mem.free) + " is available");
    part_ = std::make_unique<Partition>(ctx_.device, spec_, a.layer_begin, a.layer_end);
    part_->init(seed_);
    part_->zero_grad();
    optimizer_ = std::make_unique<Optimizer>(ctx_.device, ocfg, part_->param_count());
    peers_ = clients;
    encoding_ = a.link_encoding;
    clients_.resize(clients.size());
    nlohmann::json endpoints = nlohmann::json::object();
    for (size_t ci = 0; ci < clients.size(); ++ci) endpoints[clients[ci].name] = bind_client(static_cast<int>(ci));
    info(ctx_, "split server: layers " + std::to_string(a.layer_begin) + ".." + std::to_string(a.layer_end - 1) + " for " +
                   std::to_string(clients_.size()) + " client(s), labels on the " + (labels_on_client_ ? "client" : "server"));
    return endpoints;
  }

  JobEnd serve() {
    return serve_job(
        split_serving(ctx_), [this] { return nlohmann::json{{"received", received_record()}}; },
        [this](const Command& c, uint64_t rid) { return handle(c, rid); });
  }

 private:
  struct Client {
    std::unique_ptr<ServerEndpoint> endpoint;  // outlives `link`, which serves on it
    std::unique_ptr<SplitLink> link;
    int64_t seq = 0;          // tensors exchanged on the link (training and evaluation batches)
    int64_t train_steps = 0;  // training batches served (dropout seeds)
    int64_t served = 0;       // training batches served in the running round
  };

  // Binds a fresh endpoint admitting only client `ci`'s key and its link
  // (at set-up, and again when the client rejoins: a new process starts its
  // `seq` from 0). Returns the endpoint for the client to dial.
  std::string bind_client(int ci) {
    const PeerInfo& c = peers_[static_cast<size_t>(ci)];
    ServerOptions so;
    so.bind = ctx_.options.peer_bind;
    so.keys = ctx_.keys;
    so.insecure = ctx_.options.insecure;
    if (!so.insecure) so.allow.add(c.name, c.public_key);
    so.label = "cleaved " + ctx_.options.name + " split server for " + c.name;
    Client fresh;
    fresh.endpoint = std::make_unique<ServerEndpoint>(so);
    auto link = serve_tensor_link(*fresh.endpoint, c.name, encoding_);
    if (ctx_.options.bandwidth_limit > 0) link = throttle_link(std::move(link), ctx_.options.bandwidth_limit);
    fresh.link = std::make_unique<SplitLink>(std::move(link), c.name, ctx_);
    fresh.link->set_on_wait([this, ci] {
      take_drop_notices();
      if (dropped_.count(ci)) throw SplitPeerDropped(peers_[static_cast<size_t>(ci)].name + " was dropped");
    });
    Client& slot = clients_[static_cast<size_t>(ci)];
    if (slot.link) {
      fresh.link->carry_record_from(*slot.link);
      fresh.train_steps = slot.train_steps;
    }
    std::string endpoint = fresh.endpoint->endpoint();
    slot.link.reset();  // the old link before the endpoint it serves on
    slot = std::move(fresh);
    return endpoint;
  }

  // Drop notices arrive while a phase runs: they are taken from the queue at
  // once. A queued stop is left there (check_split_job_alive acts on it); no
  // other command may come mid-phase, and one that does is refused.
  void take_drop_notices() {
    if (ctx_.channel.stop_queued()) return;
    while (auto m = ctx_.channel.pop_command()) {
      const auto* cm = std::get_if<CommandMsg>(&m->body);
      const auto* cmd = cm ? std::get_if<SplitRoundCmd>(&cm->command) : nullptr;
      if (cmd && cmd->phase == SplitPhase::kDrop) {
        for (int ci : cmd->order)
          if (ci >= 0 && ci < static_cast<int>(clients_.size()) && dropped_.insert(ci).second)
            info(ctx_, "split server: the coordinator dropped " + clients_[static_cast<size_t>(ci)].link->peer() +
                           ": no longer served this phase");
        continue;
      }
      const std::string what = cm ? command_name(cm->command) : std::string(body_kind_name(m->body));
      ctx_.channel.send(error_message(ErrorCode::kUnexpectedKind, ctx_.options.name + " (split server) got '" + what +
                                                                      "' while serving a phase: refused", m->request_id));
    }
  }

  void check_order(const std::vector<int32_t>& order) const {
    for (int ci : order)
      if (ci < 0 || ci >= static_cast<int>(clients_.size()))
        throw std::invalid_argument("split order names client " + std::to_string(ci) + " of " +
                                    std::to_string(clients_.size()));
  }

  std::optional<JobEnd> handle(const Command& c, uint64_t rid) {
    const auto* cmd = std::get_if<SplitRoundCmd>(&c);
    if (!cmd || cmd->phase == SplitPhase::kAverage) {
      ctx_.channel.send(error_message(ErrorCode::kBadMessage, std::string("unexpected command '") + command_name(c) +
                                                                  "' for a split server", rid));
      return std::nullopt;
    }
    if (cmd->phase == SplitPhase::kDrop) return std::nullopt;  // the phase it was for has ended: nothing to skip
    const std::string op = split_phase_name(cmd->phase);
    const int round = static_cast<int>(cmd->round);
    return run_split_command(ctx_, "split server", rid, [&]() -> std::optional<JobEnd> {
      check_order(cmd->order);
      if (cmd->phase == SplitPhase::kRejoin) {
        nlohmann::json endpoints = nlohmann::json::object();
        for (int ci : cmd->order) endpoints[peers_[static_cast<size_t>(ci)].name] = bind_client(ci);
        ctx_.channel.send(ack_message(rid, {{"op", op + "_done"}, {"round", round}, {"endpoints", endpoints}}));
        return std::nullopt;
      }
      serve_phase(*cmd);
      nlohmann::json links = nlohmann::json::object(), served = nlohmann::json::object();
      for (const auto& cl : clients_) {
        const LinkStats s = cl.link->stats();
        links[cl.link->peer()] = {{"bytes_sent", s.payload_bytes_sent}, {"bytes_received", s.payload_bytes_received},
                                  {"messages_sent", s.messages_sent}, {"messages_received", s.messages_received}};
        served[cl.link->peer()] = cl.served;
      }
      nlohmann::json done = {{"op", op + "_done"}, {"round", round}, {"links", links}, {"received", received_record()}};
      if (cmd->phase == SplitPhase::kTrain) done["served"] = served;  // training batches per client, this round
      ctx_.channel.send(ack_message(rid, done));
      return std::nullopt;
    });
  }

  // One training or evaluation pass in `cmd.order`; a client the coordinator
  // drops meanwhile is skipped from then on (its half-done batch discarded).
  void serve_phase(const SplitRoundCmd& cmd) {
    dropped_.clear();
    for (auto& cl : clients_) cl.served = 0;
    for (int ci : cmd.order) {
      take_drop_notices();
      if (dropped_.count(ci)) continue;
      try {
        if (cmd.phase == SplitPhase::kTrain) {
          train_batch(ci, static_cast<int>(cmd.round));
          ++clients_[static_cast<size_t>(ci)].served;
        } else {
          eval_batch(ci);
        }
      } catch (const SplitPeerDropped&) {
        part_->zero_grad();  // the batch's gradients are never applied
      }
    }
  }

  void train_batch(int ci, int round) {
    Client& cl = clients_[static_cast<size_t>(ci)];
    Tensor x = cl.link->receive(TensorKind::kActivation, cl.seq, part_->input_shape());
    const uint64_t dropout_seed =
        DropoutKey(seed_ + static_cast<uint64_t>(ci), static_cast<uint64_t>(cl.train_steps)).microbatch_seed(0);
    const int64_t n = x.dim(0);
    Tensor dx;
    std::optional<MetricsMsg> metrics;  // vanilla: sent once the client has its gradient (a served batch)
    if (!labels_on_client_) {  // the part ends the model: the one-process micro-batch step
      Tensor t = cl.link->receive(TensorKind::kLabels, cl.seq);
      const MicrobatchResult r =
          train_microbatch(*part_, x, t, 0, dropout_seed, 1.0f / static_cast<float>(n), /*need_dx=*/true);
      dx = r.dx;
      metrics.emplace();
      metrics->stage = ci;
      metrics->step = cl.train_steps;
      metrics->loss_sum = r.loss.loss_sum;
      metrics->correct = r.loss.correct;
      metrics->sample_count = n;
      metrics->phase = SplitPhase::kTrain;
      metrics->round = round;
    } else {
      Tensor y = part_->forward(x, 0, /*training=*/true, dropout_seed);
      cl.link->send(TensorKind::kActivation, cl.seq, y);
      Tensor dy = cl.link->receive(TensorKind::kGradient, cl.seq, part_->output_shape(), n);
      dx = part_->backward(dy, 0, /*need_dx=*/true);
    }
    cl.link->send(TensorKind::kGradient, cl.seq, dx);
    if (metrics) ctx_.channel.send(message_of(*metrics));
    apply_gradients(*part_, *optimizer_);
    ++cl.seq;
    ++cl.train_steps;
  }

  void eval_batch(int ci) {
    Client& cl = clients_[static_cast<size_t>(ci)];
    Tensor x = cl.link->receive(TensorKind::kActivation, cl.seq, part_->input_shape());
    Tensor y = part_->forward(x, 0, /*training=*/false);
    cl.link->send(TensorKind::kActivation, cl.seq, y);
    ++cl.seq;
  }

  nlohmann::json received_record() const {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& cl : clients_) out[cl.link->peer()] = cl.link->received_record();
    return out;
  }

  const SplitJobContext& ctx_;
  ModelSpec spec_;
  bool labels_on_client_ = false;
  uint64_t seed_ = 1;
  std::unique_ptr<Partition> part_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<PeerInfo> peers_;  // the clients (name, key), by client index
  Encoding encoding_ = Encoding::kF32;
  std::vector<Client> clients_;  // by client index
  std::set<int> dropped_;        // clients dropped from the running phase
};

}  // namespace

JobEnd run_split_server(const SplitJobContext& ctx, const AssignMsg& assign, uint64_t request_id) {
  SplitServer server(ctx);
  const bool ready = set_up_job(ctx, "split server job", request_id, [&] {
    return nlohmann::json{{"op", "split_setup"}, {"endpoints", server.setup(assign)}};
  });
  if (!ready) return JobEnd::refused;
  return server.serve();
}

}  // namespace cleave
