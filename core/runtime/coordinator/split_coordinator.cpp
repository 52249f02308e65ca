// split_coordinator.cpp: the split-learning driver; see split_coordinator.h
// and docs/split.md.
#include "core/runtime/coordinator/split_coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "core/fed/client_details.h"
#include "core/fed/strategy.h"
#include "core/io/untrusted_json.h"
#include "core/model/model_spec.h"
#include "core/runtime/coordinator/session.h"
#include "core/runtime/common/split_layout.h"
#include "core/runtime/common/wire.h"
#include "core/train/progress.h"
#include "core/train/train_data.h"
#include "core/util/seconds.h"
#include "transport/codec.h"
#include "transport/log.h"

namespace cleave {

void SplitOptions::validate() const {
  auto bad = [](const std::string& s) { throw std::invalid_argument(s); };
  if (clients < 1) bad("--clients must be at least 1");
  if (labels != "server" && labels != "client") bad("--labels must be server or client, got '" + labels + "'");
  if (cut_back >= 0 && labels != "client") bad("--cut-back applies to --labels client (U-shaped) only");
  (void)transport::parse_encoding(encoding);
  if (eval_batch < 1) bad("--eval-batch must be positive");
  // The job carries both as float, and the noise's stddev is their product: a
  // value that does not survive that is refused here, not by every client.
  const auto noise = static_cast<float>(activation_noise), clip = static_cast<float>(activation_clip);
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  if (!std::isfinite(noise) || !(noise >= 0))
    bad("--activation-noise must be a finite float >= 0, got " + num(activation_noise));
  if (!std::isfinite(clip) || !(clip > 0))
    bad("--activation-clip must be a finite float > 0, got " + num(activation_clip));
  if (!std::isfinite(noise * clip)) bad("--activation-noise times --activation-clip is too large for a float");
  if (!(epoch_timeout_s > 0)) bad("--epoch-timeout must be positive");
}

namespace {

using namespace transport;
using Clock = std::chrono::steady_clock;

// Round-robin over the clients' batch counts: the server's serving order.
std::vector<int> round_robin(const std::vector<int64_t>& counts) {
  std::vector<int> order;
  const int64_t most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  for (int64_t b = 0; b < most; ++b)
    for (size_t c = 0; c < counts.size(); ++c)
      if (b < counts[c]) order.push_back(static_cast<int>(c));
  return order;
}

// What one epoch's training pass produced.
struct EpochTraining {
  double loss_sum = 0;
  int64_t samples = 0, steps = 0;
  double seconds = 0;
  int64_t cut_up = 0, cut_down = 0;  // the clients' cut-layer link bytes in this pass
  std::map<std::string, int64_t> served;  // training batches the server served each client
};

// What one epoch's evaluation produced (summed over the clients).
struct EpochEvaluation {
  double loss_sum = 0;
  int64_t correct = 0, samples = 0;
  nlohmann::json per_client = nlohmann::json::object();
  int64_t up = 0, down = 0;  // link bytes
};

// A dropped client's daemon that registered again: it rejoins at the next epoch.
struct ReturnedClient {
  RegisterMsg reg;
  nlohmann::json details;
  int64_t samples = 0;
};

class SplitDriver {
 public:
  SplitDriver(const TrainConfig& cfg, const SplitOptions& opts) : cfg_(cfg), opts_(opts), bar_(cfg.progress, "epoch") {}
  nlohmann::json run();

 private:
  [[noreturn]] void fail(const std::string& text) { throw std::runtime_error(text); }
  // Sends to the server (failing the run if it cannot be reached) or to a
  // client in the job (dropping it if it cannot; one dropped already gets nothing).
  void send(const std::string& peer, const Message& m) {
    if (peer != server_name_ && !active_.count(peer)) return;
    Status s = session_->server().send(peer, m);
    if (s) return;
    if (peer == server_name_) fail("cannot reach the server " + peer + ": " + s.failure().message);
    drop_client(peer, "is unreachable (" + s.failure().message + ")");
  }
  // Serves the participants' messages until `done()`, handing each to
  // `on_message`. A client that dies, disconnects, falls silent or leaves the
  // job is dropped (drop_client) and the wait goes on without it; the
  // server's loss, an error or the deadline fails the run (the message names
  // what `waiting_for()` says is still missing).
  void await(const std::function<bool()>& done, const std::function<std::string()>& waiting_for,
             Clock::time_point deadline, const std::function<void(const Received&)>& on_message);
  // Waits until every peer in `want` that is still in the job acknowledged
  // `op`; hands other messages (metrics, weights) to `on_message`. Returns the
  // acks' details by peer (a peer dropped meanwhile has none).
  std::map<std::string, nlohmann::json> await_acks(const std::set<std::string>& want, const std::string& op,
                                                   Clock::time_point deadline,
                                                   const std::function<void(const Received&)>& on_message);
  bool in_job(const std::string& peer) const { return peer == server_name_ || active_.count(peer) > 0; }
  int index_of(const std::string& client) const;
  // Drops the clients the pool found dead; fails the run when the server is.
  void check_liveness();
  // Takes `client` out of the running epoch: the server stops serving it, the
  // daemon is told to end its job (it registers again and may rejoin), and
  // the epoch's "dropped" records it. Fails the run when no client is left.
  void drop_client(const std::string& client, const std::string& reason, bool tell_it = true);
  // A registration during the job: a dropped client coming back (or a client
  // that left its job: dropped first), or the server having left (fatal).
  void on_register(const Received& r);

  void prepare();  // options, model, layout: before anyone is contacted
  void listen();
  void register_daemons();
  // A registration's details, or nothing when they are refused (logged and counted once per daemon).
  std::optional<FedClientDetails> daemon_details(const Registration& got);
  // The detail of an ack from a participant, as an object; a detail that is
  // not one fails the run naming the sender.
  nlohmann::json ack_detail(const Received& r, const AckMsg& a);
  // `read()` of fields of `peer`'s ack detail; a wrong type fails the run naming the sender.
  template <class Read>
  auto read_ack(const std::string& peer, Read&& read) -> decltype(read()) {
    try {
      return read();
    } catch (const std::invalid_argument& e) {
      fail(peer + "'s acknowledgement during " + phase_ + ": " + e.what());
    }
  }
  // Set-up: the server its part (it answers with an endpoint per client),
  // then each client the front (and tail) dialling that endpoint.
  void set_up();
  SplitJob common_job() const;
  nlohmann::json assign_server(const SplitJob& common);
  // Assigns each of `names` its part, dialling its endpoint in `endpoints`,
  // and waits for their acks (the batches each serves). Returns those that acknowledged.
  std::vector<std::string> assign_clients(const std::vector<std::string>& names, const nlohmann::json& endpoints,
                                          Clock::time_point deadline);
  void assign_client(const std::string& name, const nlohmann::json& endpoints);
  // Start of an epoch: every dropped client that registered again gets its
  // part back (SplitFed: with the last averaged blocks).
  void rejoin_returned(int e, Clock::time_point deadline);
  // One epoch: training, SplitFed averaging, evaluation. Returns its entry of the result JSON.
  nlohmann::json run_epoch(int e);
  EpochTraining train_epoch(int e, Clock::time_point t_round, Clock::time_point deadline);
  int64_t average_client_blocks(int e, Clock::time_point deadline);  // returns the weights bytes
  // Sends the averaged blocks to `names` and waits for them to load them.
  void send_averaged(int e, std::set<std::string> names, Clock::time_point deadline);
  EpochEvaluation evaluate_epoch(int e, Clock::time_point deadline);
  // The server's serving order over the clients in the job (round-robin over `batches`).
  std::vector<int> serving_order(const std::map<std::string, int64_t>& batches) const;
  // The phase's command to the server (serving `order`) and to every client in the job.
  void send_round(SplitPhase phase, int e, const std::vector<int>& order);
  // The clients' link bytes since the last call, from their acks: {up, down}.
  std::pair<int64_t, int64_t> link_bytes(const std::map<std::string, nlohmann::json>& acks);
  // The epoch's "dropped" entries with "step" (training batches served this
  // epoch) and "missed_steps" filled in.
  nlohmann::json epoch_drops(const std::map<std::string, int64_t>& served) const;
  nlohmann::json finish();  // the server's record of what each client sent it
  nlohmann::json result(const nlohmann::json& rounds, const nlohmann::json& cut_messages, Clock::time_point t_start);

  const TrainConfig& cfg_;
  const SplitOptions& opts_;
  ModelSpec spec_;
  SplitLayout layout_;
  Encoding encoding_ = Encoding::kF32;
  OptimizerConfig ocfg_;
  std::unique_ptr<Session> session_;
  std::vector<std::string> clients_;  // the roster, sorted by name: the client index
  std::set<std::string> client_set_;
  std::string server_name_;
  std::set<std::string> participants_;  // the roster and the server
  std::set<std::string> active_;        // the clients in the job now (not dropped)
  std::set<std::string> acked_;         // participants that acknowledged their assignment
  std::string phase_ = "registration";
  int epoch_ = 0;  // the running epoch (0-based, as on the wire)
  std::map<std::string, int64_t> train_batches_, test_batches_;  // per epoch, as each client acknowledged
  std::map<std::string, int64_t> test_samples_by_;
  // Across the epochs:
  ProgressBar bar_;
  nlohmann::json losses_ = nlohmann::json::array();            // one per training batch, in the server's order
  std::map<std::string, int64_t> last_sent_, last_received_;  // cumulative link bytes by client
  double train_seconds_ = 0, test_accuracy_ = 0, test_loss_ = 0;
  int64_t trained_samples_ = 0;
  std::set<std::string> warned_;                              // daemons logged as not taken
  std::map<std::string, int64_t> registered_samples_;         // each client's shard size, as it registered
  // Drops and rejoins:
  nlohmann::json drops_ = nlohmann::json::array();     // this epoch's, "step" still to fill in
  nlohmann::json rejoined_ = nlohmann::json::array();  // this epoch's
  std::string gone_;                                   // "dev2 disconnected, ..." over the run
  std::map<std::string, ReturnedClient> returned_;     // dropped clients that registered again
  std::map<int, std::shared_ptr<std::vector<float>>> averaged_;  // SplitFed: the last averaged blocks by stage
  nlohmann::json averaged_samples_ = nlohmann::json::object();   // SplitFed: {client: samples} of this epoch's average
};

nlohmann::json SplitDriver::run() {
  const auto t_start = Clock::now();
  prepare();
  listen();
  register_daemons();
  const std::vector<std::string> daemons(participants_.begin(), participants_.end());
  return session_->run_job(daemons, opts_.shutdown_daemons, [&] {
    set_up();
    nlohmann::json rounds = nlohmann::json::array();
    for (int e = 0; e < cfg_.epochs; ++e) rounds.push_back(run_epoch(e));
    return result(rounds, finish(), t_start);
  });
}

std::map<std::string, nlohmann::json> SplitDriver::await_acks(const std::set<std::string>& want, const std::string& op,
                                                              Clock::time_point deadline,
                                                              const std::function<void(const Received&)>& on_message) {
  std::map<std::string, nlohmann::json> got;
  auto missing = [&] {
    std::string out;
    for (const auto& w : want)
      if (in_job(w) && !got.count(w)) out += (out.empty() ? "" : ", ") + w;
    return out;
  };
  await([&] { return missing().empty(); }, missing, deadline, [&](const Received& r) {
    if (auto* a = std::get_if<AckMsg>(&r.message.body)) {
      nlohmann::json detail = ack_detail(r, *a);
      if (json_string(detail, "op", "") == op && want.count(r.peer)) got[r.peer] = std::move(detail);
    } else if (on_message) {
      on_message(r);
    }
  });
  return got;
}

void SplitDriver::await(const std::function<bool()>& done, const std::function<std::string()>& waiting_for,
                        Clock::time_point deadline, const std::function<void(const Received&)>& on_message) {
  PeerPool& pool = session_->pool();
  for (;;) {
    check_liveness();
    if (done()) return;
    if (Clock::now() > deadline)
      fail(phase_ + " did not finish in time: still waiting for " + waiting_for() + " (--epoch-timeout " +
           std::to_string(static_cast<int>(opts_.epoch_timeout_s)) + " s)");
    auto r = pool.receive(Millis(50));
    if (!r || !participants_.count(r->peer)) continue;
    if (std::holds_alternative<RegisterMsg>(r->message.body)) {
      on_register(*r);
      continue;
    }
    if (!in_job(r->peer)) continue;  // a dropped client's late words change nothing
    if (auto* e = std::get_if<ErrorMsg>(&r->message.body)) fail(r->peer + " failed during " + phase_ + ": " + e->message);
    on_message(*r);
  }
}

int SplitDriver::index_of(const std::string& client) const {
  return static_cast<int>(std::find(clients_.begin(), clients_.end(), client) - clients_.begin());
}

void SplitDriver::check_liveness() {
  PeerPool& pool = session_->pool();
  if (const PoolPeer& s = pool.at(server_name_); s.dead)
    fail("the server " + server_name_ + " " + s.dead_reason + " during " + phase_ + ": it holds layers " +
         std::to_string(layout_.server_begin()) + ".." + std::to_string(layout_.server_end() - 1) +
         " of every client's model, so the run cannot go on; start it again and rerun");
  const std::set<std::string> now = active_;  // drop_client changes active_
  for (const auto& c : now)
    if (const PoolPeer& p = pool.at(c); p.dead) drop_client(c, p.dead_reason);
}

void SplitDriver::drop_client(const std::string& client, const std::string& reason, bool tell_it) {
  if (!active_.erase(client)) return;
  acked_.erase(client);
  session_->pool().mark_dead(client, reason);  // no more heartbeats or health checks until it rejoins
  drops_.push_back({{"client", client}, {"reason", reason}, {"phase", phase_}});
  gone_ += (gone_.empty() ? "" : ", ") + client + " " + reason;
  log(LogLevel::kWarning, "cleave split: client " + client + " " + reason + " during " + phase_ +
                              ": dropped from this epoch; the others go on, and it rejoins at the next epoch if its "
                              "daemon registers again");
  // The server stops waiting for it; the daemon, if it still runs, ends its job and registers again.
  (void)session_->server().send(
      server_name_, command_message(SplitRoundCmd{SplitPhase::kDrop, epoch_, {index_of(client)}}, session_->next_request_id()));
  if (tell_it) (void)session_->server().send(client, command_message(FinishCmd{}, session_->next_request_id()));
  if (active_.empty())
    fail("every client is gone (" + gone_ + ") by " + phase_ + ": split learning needs at least one client; start "
         "the clients' daemons again and rerun");
}

void SplitDriver::on_register(const Received& r) {
  const auto& reg = std::get<RegisterMsg>(r.message.body);
  if (r.peer == server_name_) {
    // A daemon never registers while it serves a job: after its ack, this one has left it.
    if (acked_.count(server_name_))
      fail("the server " + server_name_ + " left the job (it registered again) during " + phase_ +
           ": it holds the middle layers of every client's model, so the run cannot go on");
    return;
  }
  if (active_.count(r.peer)) {
    if (!acked_.count(r.peer)) return;  // a registration sent before its assignment arrived
    const PoolPeer& p = session_->pool().at(r.peer);  // dead already when its old connection's end came first
    drop_client(r.peer, p.dead ? p.dead_reason : "left the job (it registered again)", /*tell_it=*/false);
  }
  Registration registration = parse_registration(r.peer, reg);
  const std::optional<FedClientDetails> d = daemon_details(registration);
  if (!d || !d->fed_client || !d->split_jobs) return;
  if (!returned_.count(r.peer) && cfg_.progress)
    std::fprintf(stderr, "cleave split: client %s registered again: it rejoins at the next epoch\n", r.peer.c_str());
  returned_[r.peer] = ReturnedClient{reg, std::move(registration.details), d->samples};
}

nlohmann::json SplitDriver::ack_detail(const Received& r, const AckMsg& a) {
  try {
    nlohmann::json detail = parse_untrusted_object(a.detail, kReplyJsonLimits, "its acknowledgement");
    (void)json_string(detail, "op", "");
    return detail;
  } catch (const std::invalid_argument& e) {
    session_->pool().count_refused("ack_detail_invalid");
    fail(r.peer + " answered during " + phase_ + " with an unreadable acknowledgement: " + e.what());
  }
}

void SplitDriver::prepare() {
  try {
    opts_.validate();
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  if (!cfg_.save_path.empty() || !cfg_.load_path.empty() || !cfg_.init_path.empty())
    fail("--save, --load and --init are not supported by cleave split in this version: the client-side weights "
         "never leave the clients");
  spec_ = ModelSpec::load(cfg_.model_path);
  if (language_model_mismatch(spec_).empty())
    fail(cfg_.model_path + " is a byte-level language model: cleave split cannot train one yet (its clients hold "
         "class-labelled --dataset samples); train it with cleave train --text FILE");
  try {
    layout_ = make_split_layout(spec_, opts_.cut, opts_.cut_back, opts_.labels == "client");
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  encoding_ = parse_encoding(opts_.encoding);
  ocfg_ = cfg_.optimizer;
  ocfg_.validate();
}

void SplitDriver::listen() {
  // Nothing a peer sends this job may be larger than its biggest state block or batch tensor.
  session_ = std::make_unique<Session>(session_options(
      "cleave split", opts_, job_payload_cap(spec_, cfg_.optimizer.kind, cfg_.optimizer.momentum, cfg_.batch)));
  session_->pool().context = [this] { return " (" + phase_ + ")"; };
  if (cfg_.progress)
    std::fprintf(stderr, "cleave split: listening on %s, waiting for %d client(s) and a server\n",
                 session_->server().endpoint().c_str(), opts_.clients);
}

// N clients with data and one server: the daemon named by --server, or the first without data.
void SplitDriver::register_daemons() {
  PeerPool& pool = session_->pool();
  std::set<std::string> warned;
  std::vector<std::string> data_less;
  auto have_server = [&] { return opts_.server.empty() ? !data_less.empty() : pool.has(opts_.server); };
  session_->register_until(
      opts_.register_timeout_ms,
      [&] { return static_cast<int>(clients_.size()) >= opts_.clients && have_server(); },
      [&](const Registration& got) {
        const std::optional<FedClientDetails> details = daemon_details(got);
        if (!details) return;
        const bool has_data = details->fed_client;
        if (has_data && !details->split_jobs) {  // an SDK app that joined as a federated client only
          if (warned_.insert(got.peer).second)
            log(LogLevel::kInfo, "cleave split: " + got.peer + " joined as a federated client only: left idle");
          return;
        }
        const bool named_server = !opts_.server.empty() && got.peer == opts_.server;
        if (named_server || (!has_data && opts_.server.empty() && data_less.empty())) {
          pool.add(got.peer, got.reg, got.details);
          data_less.push_back(got.peer);
          if (cfg_.progress) std::fprintf(stderr, "cleave split: server %s registered\n", got.peer.c_str());
        } else if (has_data && static_cast<int>(clients_.size()) < opts_.clients) {
          pool.add(got.peer, got.reg, got.details);
          clients_.push_back(got.peer);
          registered_samples_[got.peer] = details->samples;
          if (cfg_.progress)
            std::fprintf(stderr, "cleave split: client %s registered (%lld samples, shard %s)\n", got.peer.c_str(),
                         static_cast<long long>(details->samples), details->shard.c_str());
        } else if (warned_.insert(got.peer).second) {
          log(LogLevel::kInfo, "cleave split: " + got.peer + " registered but is not needed (" +
                                   (has_data ? "enough clients" : "the server is chosen") + "): left idle");
        }
      },
      [&](const std::string& names) {
        const std::string refused = session_->refused_registrations();
        return "split learning needs " + std::to_string(opts_.clients) + " client(s) with data and one server; within " +
               seconds_text(opts_.register_timeout_ms) + " " + std::to_string(clients_.size()) +
               " client(s) and " + (have_server() ? "a" : "no") + " server registered" +
               (names.empty() ? "" : " (" + names + ")") +
               refused + ": start clients with cleaved --dataset ... --shard i/N, a server with plain cleaved" +
               (opts_.server.empty() ? "" : " named " + opts_.server) + ", all keys on the allow-list";
      });
  server_name_ = opts_.server.empty() ? data_less.front() : opts_.server;
  std::sort(clients_.begin(), clients_.end());
  client_set_ = std::set<std::string>(clients_.begin(), clients_.end());
  participants_ = client_set_;
  participants_.insert(server_name_);
  active_ = client_set_;
}

std::optional<FedClientDetails> SplitDriver::daemon_details(const Registration& got) {
  try {
    return read_fed_client_details(got.details, got.details_error);
  } catch (const std::invalid_argument& e) {
    session_->refuse_registration("daemon", got.peer, e.what());
    return std::nullopt;
  }
}

void SplitDriver::set_up() {
  phase_ = "set-up";
  const nlohmann::json endpoints = assign_server(common_job());
  (void)assign_clients(clients_, endpoints, Clock::now() + std::chrono::seconds(120));
  if (cfg_.progress)
    std::fprintf(stderr, "cleave split: %zu client(s), server %s; client layers 0..%d%s, server layers %d..%d, "
                 "labels on the %s, %s cut-layer link%s\n", clients_.size(), server_name_.c_str(), layout_.cut - 1,
                 layout_.has_tail() ? (" and " + std::to_string(layout_.cut_back) + ".." + std::to_string(spec_.num_layers() - 1)).c_str() : "",
                 layout_.server_begin(), layout_.server_end() - 1, opts_.labels.c_str(), encoding_name(encoding_),
                 opts_.splitfed ? ", SplitFed averaging" : "");
  if (cfg_.progress && opts_.activation_noise > 0)
    std::fprintf(stderr, "cleave split: local DP on the cut layer: each activation row clipped to L2 norm %g, "
                 "Gaussian noise of stddev %g added\n", opts_.activation_clip,
                 opts_.activation_noise * opts_.activation_clip);
}

SplitJob SplitDriver::common_job() const {
  SplitJob common;
  common.labels_on_client = opts_.labels == "client";
  common.seed = cfg_.seed;
  common.batch = cfg_.batch;
  common.eval_batch = opts_.eval_batch;
  common.epochs = cfg_.epochs;
  return common;
}

// Returns the server's endpoint for each client, by client name.
nlohmann::json SplitDriver::assign_server(const SplitJob& common) {
  int64_t server_steps = 0;
  for (const auto& c : clients_) {
    const int64_t samples = registered_samples_.at(c);
    server_steps += (samples + cfg_.batch - 1) / cfg_.batch;
  }
  OptimizerConfig server_opt = ocfg_;
  if (server_opt.total_steps == 0) server_opt.total_steps = server_steps * cfg_.epochs;
  SplitJob job = common;
  job.role = SplitRole::kServer;
  for (const auto& c : clients_) job.clients.push_back(PeerInfo{"", session_->pool().at(c).reg.public_key, c});
  AssignMsg a;
  a.stage = 1;
  a.num_stages = layout_.has_tail() ? 3 : 2;
  a.layer_begin = layout_.server_begin();
  a.layer_end = layout_.server_end();
  a.model_spec_json = spec_.to_json().dump();
  a.optimizer = to_wire(server_opt);
  a.job = job;
  a.link_encoding = encoding_;
  send(server_name_, Message{session_->next_request_id(), a, {}});
  auto server_ack = await_acks({server_name_}, "split_setup", Clock::now() + std::chrono::seconds(60), nullptr);
  acked_.insert(server_name_);
  return read_ack(server_name_, [&] { return json_object(server_ack[server_name_], "endpoints"); });
}

void SplitDriver::assign_client(const std::string& name, const nlohmann::json& endpoints) {
  SplitJob job = common_job();
  job.role = SplitRole::kClient;
  job.client_index = static_cast<int32_t>(index_of(name));
  job.limit_test = cfg_.limit_test;
  if (layout_.has_tail()) job.cut_back = layout_.cut_back;
  if (opts_.activation_noise > 0) {  // off: both stay 0, and the client sends its activations as they are
    job.activation_noise = static_cast<float>(opts_.activation_noise);
    job.activation_clip = static_cast<float>(opts_.activation_clip);
  }
  AssignMsg a;
  a.stage = 0;
  a.num_stages = layout_.has_tail() ? 3 : 2;
  a.layer_begin = 0;
  a.layer_end = layout_.cut;
  a.model_spec_json = spec_.to_json().dump();
  a.optimizer = to_wire(ocfg_);
  a.job = job;
  a.link_encoding = encoding_;
  a.next = PeerInfo{read_ack(server_name_, [&] { return json_string(endpoints, name, ""); }),
                    session_->pool().at(server_name_).reg.public_key, server_name_};
  if (a.next->endpoint.empty()) fail("the server gave no endpoint for client " + name);
  send(name, Message{session_->next_request_id(), a, {}});
}

// Also learns from the clients' acks how many batches each serves: the serving orders.
std::vector<std::string> SplitDriver::assign_clients(const std::vector<std::string>& names,
                                                     const nlohmann::json& endpoints, Clock::time_point deadline) {
  for (const auto& c : names) assign_client(c, endpoints);
  auto acks = await_acks(std::set<std::string>(names.begin(), names.end()), "split_setup", deadline, nullptr);
  std::vector<std::string> ready;
  for (const auto& [c, ack] : acks) {
    read_ack(c, [&] {
      train_batches_[c] = json_integer(ack, "batches_per_epoch", 0, 0, int64_t{1} << 40);
      test_batches_[c] = json_integer(ack, "test_batches", 0, 0, int64_t{1} << 40);
      test_samples_by_[c] = json_integer(ack, "test_samples", 0, 0, int64_t{1} << 50);
    });
    acked_.insert(c);
    last_sent_[c] = last_received_[c] = 0;  // a (re)started client's link counts from 0
    ready.push_back(c);
  }
  return ready;
}

void SplitDriver::rejoin_returned(int e, Clock::time_point deadline) {
  if (returned_.empty()) return;
  phase_ = "epoch " + std::to_string(e + 1) + " rejoin";
  PeerPool& pool = session_->pool();
  std::vector<std::string> back;
  std::vector<int32_t> indices;
  for (auto& [name, r] : returned_) {
    pool.revive(name, r.reg, r.details);  // alive again, as it registered now
    registered_samples_[name] = r.samples;
    active_.insert(name);
    back.push_back(name);
    indices.push_back(index_of(name));
  }
  returned_.clear();
  send(server_name_, command_message(SplitRoundCmd{SplitPhase::kRejoin, e, indices}, session_->next_request_id()));
  auto ack = await_acks({server_name_}, "split_rejoin_done", deadline, nullptr);
  const nlohmann::json endpoints = read_ack(server_name_, [&] { return json_object(ack[server_name_], "endpoints"); });
  const std::vector<std::string> ready = assign_clients(back, endpoints, deadline);
  // SplitFed: the blocks every other client holds now. Without it the client
  // keeps the initial weights it built (the run's seed): see docs/split.md.
  if (opts_.splitfed && !averaged_.empty()) send_averaged(e - 1, std::set<std::string>(ready.begin(), ready.end()), deadline);
  for (const auto& c : ready)
    if (active_.count(c)) rejoined_.push_back(c);
  if (cfg_.progress && !rejoined_.empty())
    std::fprintf(stderr, "cleave split: %s rejoined at epoch %d\n", rejoined_.dump().c_str(), e + 1);
}

nlohmann::json SplitDriver::run_epoch(int e) {
  const auto t_round = Clock::now();
  const auto deadline = t_round + std::chrono::milliseconds(static_cast<int64_t>(opts_.epoch_timeout_s * 1000));
  epoch_ = e;
  rejoin_returned(e, deadline);
  const EpochTraining train = train_epoch(e, t_round, deadline);
  const int64_t weights_bytes = opts_.splitfed ? average_client_blocks(e, deadline) : 0;
  const EpochEvaluation eval = evaluate_epoch(e, deadline);
  test_accuracy_ = eval.samples ? static_cast<double>(eval.correct) / static_cast<double>(eval.samples) : 0.0;
  test_loss_ = eval.samples ? eval.loss_sum / static_cast<double>(eval.samples) : 0.0;
  const double train_loss = train.samples ? train.loss_sum / static_cast<double>(train.samples) : 0.0;
  nlohmann::json round = {{"round", e + 1},
                          {"accuracy", test_accuracy_},
                          {"loss", test_loss_},
                          {"train_loss", train_loss},
                          {"steps", train.steps},
                          {"test_samples", eval.samples},
                          {"per_client", eval.per_client},
                          {"cut_bytes_up", train.cut_up},
                          {"cut_bytes_down", train.cut_down},
                          {"eval_bytes_up", eval.up},
                          {"eval_bytes_down", eval.down},
                          {"weights_bytes", weights_bytes},
                          {"train_seconds", train.seconds},
                          {"dropped", epoch_drops(train.served)},
                          {"rejoined", rejoined_},
                          {"seconds", seconds_since(t_round)}};
  if (opts_.splitfed) round["splitfed_samples"] = averaged_samples_;
  drops_ = nlohmann::json::array();
  rejoined_ = nlohmann::json::array();
  char summary[96];
  std::snprintf(summary, sizeof summary, "train loss %.4f, test acc %.4f", train_loss, test_accuracy_);
  bar_.end(summary);
  return round;
}

// Every client passes once over its shard; the server serves them in turn.
EpochTraining SplitDriver::train_epoch(int e, Clock::time_point t_round, Clock::time_point deadline) {
  phase_ = "epoch " + std::to_string(e + 1) + " training";
  const std::vector<int> order = serving_order(train_batches_);
  bar_.begin(e + 1, cfg_.epochs, static_cast<int64_t>(order.size()));
  send_round(SplitPhase::kTrain, e, order);
  EpochTraining out;
  const std::string metrics_from = layout_.labels_on_client ? "" : server_name_;
  std::set<std::string> want = active_;
  want.insert(server_name_);
  auto acks = await_acks(want, "split_round_done", deadline, [&](const Received& r) {
    auto* mm = std::get_if<MetricsMsg>(&r.message.body);
    if (!mm || mm->sample_count <= 0) return;
    if (!metrics_from.empty() ? r.peer != metrics_from : !active_.count(r.peer)) return;
    losses_.push_back(mm->loss_sum / static_cast<double>(mm->sample_count));
    out.loss_sum += mm->loss_sum;
    out.samples += mm->sample_count;
    ++out.steps;
    const double t = seconds_since(t_round);
    bar_.update(out.steps, losses_.back().get<double>(), t > 0 ? static_cast<double>(out.samples) / t : 0.0);
  });
  out.seconds = seconds_since(t_round);
  train_seconds_ += out.seconds;
  trained_samples_ += out.samples;
  std::tie(out.cut_up, out.cut_down) = link_bytes(acks);
  const nlohmann::json served = read_ack(server_name_, [&] { return json_object(acks[server_name_], "served"); });
  for (auto it = served.begin(); it != served.end(); ++it)
    if (client_set_.count(it.key()))
      out.served[it.key()] = read_ack(server_name_, [&] { return json_integer(served, it.key(), 0, 0, int64_t{1} << 40); });
  return out;
}

// SplitFed: average the blocks of the clients that finished the epoch (FedAvg, weighted by samples).
int64_t SplitDriver::average_client_blocks(int e, Clock::time_point deadline) {
  phase_ = "epoch " + std::to_string(e + 1) + " averaging";
  const EndpointStats before = session_->server().stats();
  std::map<int, std::map<std::string, ClientUpdate>> blocks;  // by stage, then client
  const Message ck = command_message(CheckpointCmd{StateKind::kParams}, session_->next_request_id());
  for (const auto& c : std::set<std::string>(active_)) send(c, ck);  // a copy: a failed send drops the client
  const size_t per_client = layout_.has_tail() ? 2 : 1;
  std::map<std::string, size_t> have;
  auto missing = [&] {
    std::string out;
    for (const auto& c : active_)
      if (have[c] < per_client) out += (out.empty() ? "" : ", ") + c;
    return out;
  };
  await([&] { return missing().empty(); }, [&] { return "the blocks of " + missing(); }, deadline,
        [&](const Received& r) {
          auto* w = std::get_if<WeightsMsg>(&r.message.body);
          if (!w || !active_.count(r.peer)) return;
          if (blocks[w->stage].emplace(r.peer, ClientUpdate{r.peer, weights_values(r.message), w->sample_count}).second)
            ++have[r.peer];
        });
  averaged_samples_ = nlohmann::json::object();
  for (auto& [stage, by_client] : blocks) {
    std::vector<ClientUpdate> list;
    for (auto& [c, u] : by_client)
      if (active_.count(c)) list.push_back(std::move(u));  // a client dropped meanwhile is left out
    if (list.empty()) continue;
    const size_t size = list.front().params.size();
    for (const auto& u : list) {  // an epoch is one pass over the shard: no more samples than it registered
      if (const auto why = refuse_update(u, UpdateBounds{size, registered_samples_.at(u.client), -1})) {
        session_->pool().count_refused(why->reason);
        fail("SplitFed: the block of " + u.client + " is unusable: " + why->message + " (" + why->reason + ")");
      }
      averaged_samples_[u.client] = u.samples;
    }
    AggregateResult agg = aggregate(FedStrategy::fedavg, list, size);
    averaged_[stage] = std::make_shared<std::vector<float>>(std::move(agg.params));
  }
  send_averaged(e, active_, deadline);
  const EndpointStats after = session_->server().stats();
  return static_cast<int64_t>(after.bytes_sent - before.bytes_sent + after.bytes_received - before.bytes_received);
}

void SplitDriver::send_averaged(int e, std::set<std::string> names, Clock::time_point deadline) {
  for (const auto& [stage, values] : averaged_) {
    WeightsMsg w;
    w.stage = stage;
    w.round = e;
    w.sample_count = 0;
    w.num_elements = static_cast<int64_t>(values->size());
    for (const auto& c : names) send(c, make_weights_message(w, values->data(), values->size(), values));
  }
  for (const auto& c : names)
    send(c, command_message(SplitRoundCmd{SplitPhase::kAverage, e, {}}, session_->next_request_id()));
  (void)await_acks(names, "split_weights_done", deadline, nullptr);
}

// Every client in the job runs its shard of the test split through the split model.
EpochEvaluation SplitDriver::evaluate_epoch(int e, Clock::time_point deadline) {
  phase_ = "epoch " + std::to_string(e + 1) + " evaluation";
  send_round(SplitPhase::kEval, e, serving_order(test_batches_));
  std::map<std::string, MetricsMsg> metrics;
  std::set<std::string> want = active_;
  want.insert(server_name_);
  auto acks = await_acks(want, "split_eval_done", deadline, [&](const Received& r) {
    auto* mm = std::get_if<MetricsMsg>(&r.message.body);
    if (mm && active_.count(r.peer)) metrics[r.peer] = *mm;
  });
  EpochEvaluation out;
  for (const auto& [c, mm] : metrics) {
    if (!active_.count(c)) continue;  // dropped before it acknowledged: the clients still there decide
    out.loss_sum += mm.loss_sum;
    out.correct += mm.correct;
    out.samples += mm.sample_count;
    out.per_client[c] = {
        {"samples", mm.sample_count},
        {"accuracy", mm.sample_count ? static_cast<double>(mm.correct) / static_cast<double>(mm.sample_count) : 0.0}};
  }
  std::tie(out.up, out.down) = link_bytes(acks);
  return out;
}

std::vector<int> SplitDriver::serving_order(const std::map<std::string, int64_t>& batches) const {
  std::vector<int64_t> counts(clients_.size(), 0);
  for (size_t i = 0; i < clients_.size(); ++i)
    if (active_.count(clients_[i]) && batches.count(clients_[i])) counts[i] = batches.at(clients_[i]);
  return round_robin(counts);
}

void SplitDriver::send_round(SplitPhase phase, int e, const std::vector<int>& order) {
  send(server_name_, command_message(SplitRoundCmd{phase, e, order}, session_->next_request_id()));
  for (const auto& c : std::set<std::string>(active_))  // a copy: a failed send drops the client
    send(c, command_message(SplitRoundCmd{phase, e, {}}, session_->next_request_id()));
}

std::pair<int64_t, int64_t> SplitDriver::link_bytes(const std::map<std::string, nlohmann::json>& acks) {
  int64_t up = 0, down = 0;
  for (const auto& [c, d] : acks) {
    if (!client_set_.count(c)) continue;
    const int64_t s = read_ack(c, [&] { return json_integer(d, "bytes_sent", 0); });
    const int64_t r = read_ack(c, [&] { return json_integer(d, "bytes_received", 0); });
    up += s - last_sent_[c];
    down += r - last_received_[c];
    last_sent_[c] = s;
    last_received_[c] = r;
  }
  return {up, down};
}

nlohmann::json SplitDriver::epoch_drops(const std::map<std::string, int64_t>& served) const {
  nlohmann::json out = nlohmann::json::array();
  for (nlohmann::json d : drops_) {
    const std::string c = d["client"];
    const auto it = served.find(c);
    const int64_t step = it == served.end() ? 0 : it->second;
    const int64_t batches = train_batches_.count(c) ? train_batches_.at(c)
                                                    : (registered_samples_.at(c) + cfg_.batch - 1) / cfg_.batch;
    d["step"] = step;
    d["missed_steps"] = std::max<int64_t>(0, batches - step);
    out.push_back(std::move(d));
  }
  return out;
}

nlohmann::json SplitDriver::finish() {
  phase_ = "finish";
  send(server_name_, command_message(FinishCmd{}, session_->next_request_id()));
  auto fin = await_acks({server_name_}, "finish", Clock::now() + std::chrono::seconds(30), nullptr);
  return read_ack(server_name_, [&] { return json_object(fin[server_name_], "received"); });
}

nlohmann::json SplitDriver::result(const nlohmann::json& rounds, const nlohmann::json& cut_messages,
                                   Clock::time_point t_start) {
  nlohmann::json out;
  out["mode"] = "split";
  out["labels"] = opts_.labels;
  out["splitfed"] = opts_.splitfed;
  out["encoding"] = encoding_name(encoding_);
  out["layout"] = layout_.to_json();
  out["clients"] = clients_.size();
  out["server"] = server_name_;
  out["model"] = spec_.name;
  out["model_path"] = cfg_.model_path;
  out["epochs"] = cfg_.epochs;
  out["batch"] = cfg_.batch;
  out["seed"] = cfg_.seed;
  out["optimizer"] = ocfg_.to_json();
  if (opts_.activation_noise > 0) {
    out["activation_noise"] = opts_.activation_noise;
    out["activation_clip"] = opts_.activation_clip;
  }
  out["steps"] = losses_.size();
  out["losses"] = losses_;
  out["rounds"] = rounds;
  out["test_accuracy"] = test_accuracy_;
  out["test_loss"] = test_loss_;
  int64_t test_samples = 0;  // every client's test shard, whether or not it was there at the end
  for (const auto& [c, n] : test_samples_by_) test_samples += n;
  out["test_samples"] = test_samples;
  // What a rejoining client starts from: SplitFed's averaged blocks, or (without
  // it) the initial weights of the run's seed (client-side weights never leave a client).
  out["rejoin_weights"] = opts_.splitfed ? "averaged" : "initial";
  out["samples_per_sec"] = train_seconds_ > 0 ? static_cast<double>(trained_samples_) / train_seconds_ : 0.0;
  out["wall_seconds"] = seconds_since(t_start);
  int64_t up = 0, down = 0;
  for (const auto& r : rounds) {
    up += r["cut_bytes_up"].get<int64_t>();
    down += r["cut_bytes_down"].get<int64_t>();
  }
  out["cut_bytes_up"] = up;
  out["cut_bytes_down"] = down;
  out["cut_layer_messages"] = cut_messages;
  out["refused_messages"] = session_->pool().refused_json();  // {reason: count}
  out["messages_from_clients"] = session_->message_kinds_json(clients_);
  out["devices"] = session_->devices_json(std::vector<std::string>(participants_.begin(), participants_.end()));
  for (auto& d : out["devices"]) {
    if (d["name"] == server_name_) {
      d["role"] = "server";
      d["layers"] = {layout_.server_begin(), layout_.server_end()};
    } else {
      d["role"] = "client";
      d["layers"] = {0, layout_.cut};
      if (layout_.has_tail()) d["tail_layers"] = {layout_.cut_back, layout_.num_layers};
    }
  }
  return out;
}

}  // namespace

nlohmann::json train_split(const TrainConfig& config, const SplitOptions& options) {
  return SplitDriver(config, options).run();
}

}  // namespace cleave
