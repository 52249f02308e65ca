// split_coordinator.cpp: the split-learning driver; see split_coordinator.h
// and docs/split.md.
#include "core/runtime/coordinator/split_coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "core/fed/strategy.h"
#include "core/model/model_spec.h"
#include "core/runtime/coordinator/peer_pool.h"
#include "core/runtime/common/split_layout.h"
#include "core/runtime/common/wire.h"
#include "core/train/progress.h"
#include "transport/codec.h"
#include "transport/endpoint.h"
#include "transport/keys.h"
#include "transport/log.h"

namespace cleave {

void SplitOptions::validate() const {
  auto bad = [](const std::string& s) { throw std::invalid_argument(s); };
  if (clients < 1) bad("--clients must be at least 1");
  if (labels != "server" && labels != "client") bad("--labels must be server or client, got '" + labels + "'");
  if (cut_back >= 0 && labels != "client") bad("--cut-back applies to --labels client (U-shaped) only");
  (void)transport::parse_encoding(encoding);
  if (eval_batch < 1) bad("--eval-batch must be positive");
  if (!(epoch_timeout_s > 0)) bad("--epoch-timeout must be positive");
}

namespace {

using namespace transport;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Round-robin over the clients' batch counts: the server's serving order.
std::vector<int> round_robin(const std::vector<int64_t>& counts) {
  std::vector<int> order;
  const int64_t most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  for (int64_t b = 0; b < most; ++b)
    for (size_t c = 0; c < counts.size(); ++c)
      if (b < counts[c]) order.push_back(static_cast<int>(c));
  return order;
}

class SplitDriver {
 public:
  SplitDriver(const TrainConfig& cfg, const SplitOptions& opts) : cfg_(cfg), opts_(opts) {}
  nlohmann::json run();

 private:
  [[noreturn]] void fail(const std::string& text) { throw std::runtime_error(text); }
  void send(const std::string& peer, Message m) {
    Status s = server_->send(peer, m);
    if (!s) fail("cannot reach " + peer + ": " + s.failure().message);
  }
  // Serves the participants' messages until `done()`, handing each to
  // `on_message`. Fails on an error, a dead participant or the deadline (the
  // message names what `waiting_for()` says is still missing).
  void await(const std::function<bool()>& done, const std::function<std::string()>& waiting_for,
             Clock::time_point deadline, const std::function<void(const Received&)>& on_message);
  // Waits until every peer in `want` acknowledged `op`; hands other messages
  // (metrics, weights) to `on_message`. Returns the acks' details by peer.
  std::map<std::string, nlohmann::json> await_acks(const std::set<std::string>& want, const std::string& op,
                                                   Clock::time_point deadline,
                                                   const std::function<void(const Received&)>& on_message);
  void register_daemons();
  void stop_all();

  const TrainConfig& cfg_;
  const SplitOptions& opts_;
  std::unique_ptr<ServerEndpoint> server_;
  std::unique_ptr<PeerPool> pool_;
  std::vector<std::string> clients_;  // sorted by name: the client index
  std::string server_name_;
  std::set<std::string> participants_;
  std::string phase_ = "registration";
};

std::map<std::string, nlohmann::json> SplitDriver::await_acks(const std::set<std::string>& want, const std::string& op,
                                                              Clock::time_point deadline,
                                                              const std::function<void(const Received&)>& on_message) {
  std::map<std::string, nlohmann::json> got;
  await([&] { return got.size() == want.size(); },
        [&] {
          std::string missing;
          for (const auto& w : want)
            if (!got.count(w)) missing += (missing.empty() ? "" : ", ") + w;
          return missing;
        },
        deadline,
        [&](const Received& r) {
          if (auto* a = std::get_if<AckMsg>(&r.message.body)) {
            auto detail = nlohmann::json::parse(a->detail.empty() ? "{}" : a->detail, nullptr, false);
            if (!detail.is_discarded() && detail.is_object() && detail.value("op", std::string()) == op &&
                want.count(r.peer))
              got[r.peer] = detail;
          } else if (on_message) {
            on_message(r);
          }
        });
  return got;
}

void SplitDriver::await(const std::function<bool()>& done, const std::function<std::string()>& waiting_for,
                        Clock::time_point deadline, const std::function<void(const Received&)>& on_message) {
  while (!done()) {
    for (const auto& name : participants_)
      if (pool_->at(name).dead) fail(name + " " + pool_->at(name).dead_reason + " during " + phase_);
    if (Clock::now() > deadline)
      fail(phase_ + " did not finish in time: still waiting for " + waiting_for() + " (--epoch-timeout " +
           std::to_string(static_cast<int>(opts_.epoch_timeout_s)) + " s)");
    auto r = pool_->receive(Millis(50));
    if (!r || !participants_.count(r->peer)) continue;
    if (auto* e = std::get_if<ErrorMsg>(&r->message.body)) fail(r->peer + " failed during " + phase_ + ": " + e->message);
    on_message(*r);
  }
}

void SplitDriver::register_daemons() {
  std::set<std::string> warned;
  std::vector<std::string> data_less;
  const auto t0 = Clock::now();
  auto have_server = [&] {
    if (!opts_.server.empty()) return pool_->has(opts_.server);
    return !data_less.empty();
  };
  while (static_cast<int>(clients_.size()) < opts_.clients || !have_server()) {
    if (seconds_since(t0) * 1000 > opts_.register_timeout_ms) {
      std::string names;
      for (const auto& p : pool_->peers()) names += (names.empty() ? "" : ", ") + p.name;
      fail("split learning needs " + std::to_string(opts_.clients) + " client(s) with data and one server; within " +
           std::to_string(opts_.register_timeout_ms / 1000) + " s " + std::to_string(clients_.size()) +
           " client(s) and " + (have_server() ? "a" : "no") + " server registered" +
           (names.empty() ? "" : " (" + names + ")") +
           ": start clients with cleaved --dataset ... --shard i/N, a server with plain cleaved" +
           (opts_.server.empty() ? "" : " named " + opts_.server) + ", all keys on the allow-list");
    }
    auto got = pool_->receive(Millis(200));
    if (!got) continue;
    auto* r = std::get_if<RegisterMsg>(&got->message.body);
    if (!r || pool_->has(got->peer)) continue;
    nlohmann::json details = nlohmann::json::parse(r->details_json.empty() ? "{}" : r->details_json, nullptr, false);
    if (details.is_discarded() || !details.is_object()) details = nlohmann::json::object();
    const bool has_data = details.value("fed_client", false);
    const bool named_server = !opts_.server.empty() && got->peer == opts_.server;
    if (named_server || (!has_data && opts_.server.empty() && data_less.empty())) {
      pool_->add(got->peer, *r, details);
      data_less.push_back(got->peer);
      if (cfg_.progress) std::fprintf(stderr, "cleave split: server %s registered\n", got->peer.c_str());
    } else if (has_data && static_cast<int>(clients_.size()) < opts_.clients) {
      pool_->add(got->peer, *r, details);
      clients_.push_back(got->peer);
      if (cfg_.progress)
        std::fprintf(stderr, "cleave split: client %s registered (%lld samples, shard %s)\n", got->peer.c_str(),
                     static_cast<long long>(details.value("samples", static_cast<int64_t>(0))),
                     details.value("shard", std::string("?")).c_str());
    } else if (warned.insert(got->peer).second) {
      log(LogLevel::kInfo, "cleave split: " + got->peer + " registered but is not needed (" +
                               (has_data ? "enough clients" : "the server is chosen") + "): left idle");
    }
  }
  server_name_ = opts_.server.empty() ? data_less.front() : opts_.server;
  std::sort(clients_.begin(), clients_.end());
  participants_ = std::set<std::string>(clients_.begin(), clients_.end());
  participants_.insert(server_name_);
}

void SplitDriver::stop_all() {
  for (const auto& name : participants_) {
    if (pool_->at(name).dead) continue;
    (void)server_->send(name, command_message(FinishCmd{}, pool_->next_request_id()));
    if (opts_.shutdown_daemons) (void)server_->send(name, command_message(ShutdownCmd{}, pool_->next_request_id()));
  }
}

nlohmann::json SplitDriver::run() {
  const auto t_start = Clock::now();
  try {
    opts_.validate();
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  if (!cfg_.save_path.empty() || !cfg_.load_path.empty() || !cfg_.init_path.empty())
    fail("--save, --load and --init are not supported by cleave split in this version: the client-side weights "
         "never leave the clients");
  const ModelSpec spec = ModelSpec::load(cfg_.model_path);
  SplitLayout layout;
  try {
    layout = make_split_layout(spec, opts_.cut, opts_.cut_back, opts_.labels == "client");
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  const Encoding encoding = parse_encoding(opts_.encoding);
  OptimizerConfig ocfg = cfg_.optimizer;
  ocfg.validate();

  ServerOptions so;
  so.bind = opts_.listen;
  so.insecure = opts_.insecure;
  so.label = "cleave split";
  if (!opts_.insecure) {
    so.keys = load_secret_key(opts_.key_path);
    so.allow = AllowList::load(opts_.allow_path);
  }
  server_ = std::make_unique<ServerEndpoint>(so);
  pool_ = std::make_unique<PeerPool>(*server_, "cleave split", opts_.peer_timeout_ms, opts_.interrupted);
  pool_->context = [this] { return " (" + phase_ + ")"; };
  if (opts_.on_listening) opts_.on_listening(server_->endpoint());
  if (cfg_.progress)
    std::fprintf(stderr, "cleave split: listening on %s, waiting for %d client(s) and a server\n",
                 server_->endpoint().c_str(), opts_.clients);

  register_daemons();
  pool_->set_monitoring(true);
  try {
    // 1. The server part.
    phase_ = "set-up";
    const int num_stages = layout.has_tail() ? 3 : 2;
    std::vector<int64_t> samples;
    int64_t server_steps = 0;
    for (const auto& c : clients_) {
      samples.push_back(pool_->at(c).details.value("samples", static_cast<int64_t>(0)));
      server_steps += (samples.back() + cfg_.batch - 1) / cfg_.batch;
    }
    SplitJob common;
    common.labels_on_client = opts_.labels == "client";
    common.seed = cfg_.seed;
    common.batch = cfg_.batch;
    common.eval_batch = opts_.eval_batch;
    common.epochs = cfg_.epochs;
    {
      OptimizerConfig server_opt = ocfg;
      if (server_opt.total_steps == 0) server_opt.total_steps = server_steps * cfg_.epochs;
      SplitJob job = common;
      job.role = SplitRole::kServer;
      for (const auto& c : clients_) job.clients.push_back(PeerInfo{"", pool_->at(c).reg.public_key, c});
      AssignMsg a;
      a.stage = 1;
      a.num_stages = num_stages;
      a.layer_begin = layout.server_begin();
      a.layer_end = layout.server_end();
      a.model_spec_json = spec.to_json().dump();
      a.optimizer = to_wire(server_opt);
      a.job = job;
      a.link_encoding = encoding;
      Message m;
      m.request_id = pool_->next_request_id();
      m.body = a;
      send(server_name_, m);
    }
    auto server_ack = await_acks({server_name_}, "split_setup", Clock::now() + std::chrono::seconds(60), nullptr);
    const nlohmann::json endpoints = server_ack[server_name_].value("endpoints", nlohmann::json::object());
    for (size_t i = 0; i < clients_.size(); ++i) {
      SplitJob job = common;
      job.role = SplitRole::kClient;
      job.client_index = static_cast<int32_t>(i);
      job.limit_test = cfg_.limit_test;
      if (layout.has_tail()) job.cut_back = layout.cut_back;
      AssignMsg a;
      a.stage = 0;
      a.num_stages = num_stages;
      a.layer_begin = 0;
      a.layer_end = layout.cut;
      a.model_spec_json = spec.to_json().dump();
      a.optimizer = to_wire(ocfg);
      a.job = job;
      a.link_encoding = encoding;
      a.next = PeerInfo{endpoints.value(clients_[i], std::string()), pool_->at(server_name_).reg.public_key, server_name_};
      if (a.next->endpoint.empty()) fail("the server gave no endpoint for client " + clients_[i]);
      Message m;
      m.request_id = pool_->next_request_id();
      m.body = a;
      send(clients_[i], m);
    }
    auto client_acks = await_acks(std::set<std::string>(clients_.begin(), clients_.end()), "split_setup",
                                  Clock::now() + std::chrono::seconds(120), nullptr);
    std::vector<int64_t> train_batches, test_batches;
    int64_t test_samples = 0;
    for (const auto& c : clients_) {
      train_batches.push_back(client_acks[c].value("batches_per_epoch", static_cast<int64_t>(0)));
      test_batches.push_back(client_acks[c].value("test_batches", static_cast<int64_t>(0)));
      test_samples += client_acks[c].value("test_samples", static_cast<int64_t>(0));
    }
    const std::vector<int> train_order = round_robin(train_batches), test_order = round_robin(test_batches);
    if (cfg_.progress)
      std::fprintf(stderr, "cleave split: %zu client(s), server %s; client layers 0..%d%s, server layers %d..%d, "
                   "labels on the %s, %s cut-layer link%s\n", clients_.size(), server_name_.c_str(), layout.cut - 1,
                   layout.has_tail() ? (" and " + std::to_string(layout.cut_back) + ".." + std::to_string(spec.num_layers() - 1)).c_str() : "",
                   layout.server_begin(), layout.server_end() - 1, opts_.labels.c_str(), encoding_name(encoding),
                   opts_.splitfed ? ", SplitFed averaging" : "");

    // 2. Epochs.
    nlohmann::json losses = nlohmann::json::array(), rounds = nlohmann::json::array();
    std::map<std::string, int64_t> last_sent, last_received;  // cumulative link bytes by client
    double train_seconds = 0, test_accuracy = 0, test_loss = 0;
    int64_t trained_samples = 0;
    ProgressBar bar(cfg_.progress, "epoch");
    const std::set<std::string> everyone = participants_;
    const std::set<std::string> client_set(clients_.begin(), clients_.end());
    auto link_bytes = [&](const std::map<std::string, nlohmann::json>& acks, int64_t& up, int64_t& down) {
      up = down = 0;
      for (const auto& c : clients_) {
        const auto& d = acks.at(c);
        const int64_t s = d.value("bytes_sent", static_cast<int64_t>(0)), r = d.value("bytes_received", static_cast<int64_t>(0));
        up += s - last_sent[c];
        down += r - last_received[c];
        last_sent[c] = s;
        last_received[c] = r;
      }
    };
    for (int e = 0; e < cfg_.epochs; ++e) {
      const auto t_round = Clock::now();
      const auto deadline = t_round + std::chrono::milliseconds(static_cast<int64_t>(opts_.epoch_timeout_s * 1000));
      phase_ = "epoch " + std::to_string(e + 1) + " training";
      bar.begin(e + 1, cfg_.epochs, static_cast<int64_t>(train_order.size()));
      send(server_name_, command_message(SplitRoundCmd{SplitPhase::kTrain, e, train_order}, pool_->next_request_id()));
      for (const auto& c : clients_)
        send(c, command_message(SplitRoundCmd{SplitPhase::kTrain, e, {}}, pool_->next_request_id()));
      double loss_sum = 0;
      int64_t loss_samples = 0, steps = 0;
      const std::string metrics_from = layout.labels_on_client ? "" : server_name_;
      auto acks = await_acks(everyone, "split_round_done", deadline, [&](const Received& r) {
        auto* mm = std::get_if<MetricsMsg>(&r.message.body);
        if (!mm || mm->sample_count <= 0) return;
        if (!metrics_from.empty() ? r.peer != metrics_from : !client_set.count(r.peer)) return;
        losses.push_back(mm->loss_sum / static_cast<double>(mm->sample_count));
        loss_sum += mm->loss_sum;
        loss_samples += mm->sample_count;
        ++steps;
        const double t = seconds_since(t_round);
        bar.update(steps, losses.back().get<double>(), t > 0 ? static_cast<double>(loss_samples) / t : 0.0);
      });
      const double round_train_seconds = seconds_since(t_round);
      train_seconds += round_train_seconds;
      trained_samples += loss_samples;
      int64_t cut_up = 0, cut_down = 0;
      link_bytes(acks, cut_up, cut_down);

      // SplitFed: average the client-side blocks (FedAvg, weighted by samples).
      int64_t weights_bytes = 0;
      if (opts_.splitfed) {
        phase_ = "epoch " + std::to_string(e + 1) + " averaging";
        const EndpointStats before = server_->stats();
        std::map<int, std::vector<ClientUpdate>> blocks;
        const Message ck = command_message(CheckpointCmd{StateKind::kParams}, pool_->next_request_id());
        for (const auto& c : clients_) send(c, ck);
        const size_t want_blocks = clients_.size() * (layout.has_tail() ? 2 : 1);
        size_t have = 0;
        await([&] { return have == want_blocks; },
              [&] { return std::to_string(want_blocks - have) + " client block(s)"; }, deadline,
              [&](const Received& r) {
                auto* w = std::get_if<WeightsMsg>(&r.message.body);
                if (!w || !client_set.count(r.peer)) return;
                blocks[w->stage].push_back({r.peer, weights_values(r.message), w->sample_count});
                ++have;
              });
        for (auto& [stage, list] : blocks) {
          const size_t size = list.front().params.size();
          for (const auto& u : list)
            if (std::string why = check_update(u, size); !why.empty())
              fail("SplitFed: the block of " + u.client + " is unusable: " + why);
          AggregateResult agg = aggregate(FedStrategy::fedavg, list, size);
          auto values = std::make_shared<std::vector<float>>(std::move(agg.params));
          WeightsMsg w;
          w.stage = stage;
          w.round = e;
          w.sample_count = 0;
          w.num_elements = static_cast<int64_t>(values->size());
          for (const auto& c : clients_) send(c, make_weights_message(w, values->data(), values->size(), values));
        }
        for (const auto& c : clients_)
          send(c, command_message(SplitRoundCmd{SplitPhase::kAverage, e, {}}, pool_->next_request_id()));
        (void)await_acks(client_set, "split_weights_done", deadline, nullptr);
        const EndpointStats after = server_->stats();
        weights_bytes = static_cast<int64_t>(after.bytes_sent - before.bytes_sent + after.bytes_received - before.bytes_received);
      }

      // Evaluation: every client on its shard of the test split.
      phase_ = "epoch " + std::to_string(e + 1) + " evaluation";
      send(server_name_, command_message(SplitRoundCmd{SplitPhase::kEval, e, test_order}, pool_->next_request_id()));
      for (const auto& c : clients_)
        send(c, command_message(SplitRoundCmd{SplitPhase::kEval, e, {}}, pool_->next_request_id()));
      double eval_loss = 0;
      int64_t eval_correct = 0, eval_samples = 0;
      nlohmann::json per_client = nlohmann::json::object();
      auto eacks = await_acks(everyone, "split_eval_done", deadline, [&](const Received& r) {
        auto* mm = std::get_if<MetricsMsg>(&r.message.body);
        if (!mm || !client_set.count(r.peer)) return;
        eval_loss += mm->loss_sum;
        eval_correct += mm->correct;
        eval_samples += mm->sample_count;
        per_client[r.peer] = {{"samples", mm->sample_count},
                              {"accuracy", mm->sample_count ? static_cast<double>(mm->correct) / static_cast<double>(mm->sample_count) : 0.0}};
      });
      int64_t eval_up = 0, eval_down = 0;
      link_bytes(eacks, eval_up, eval_down);
      test_accuracy = eval_samples ? static_cast<double>(eval_correct) / static_cast<double>(eval_samples) : 0.0;
      test_loss = eval_samples ? eval_loss / static_cast<double>(eval_samples) : 0.0;
      const double train_loss = loss_samples ? loss_sum / static_cast<double>(loss_samples) : 0.0;
      rounds.push_back({{"round", e + 1},
                        {"accuracy", test_accuracy},
                        {"loss", test_loss},
                        {"train_loss", train_loss},
                        {"steps", steps},
                        {"test_samples", eval_samples},
                        {"per_client", per_client},
                        {"cut_bytes_up", cut_up},
                        {"cut_bytes_down", cut_down},
                        {"eval_bytes_up", eval_up},
                        {"eval_bytes_down", eval_down},
                        {"weights_bytes", weights_bytes},
                        {"train_seconds", round_train_seconds},
                        {"seconds", seconds_since(t_round)}});
      char summary[96];
      std::snprintf(summary, sizeof summary, "train loss %.4f, test acc %.4f", train_loss, test_accuracy);
      bar.end(summary);
    }

    // 3. Finish: the server's record of what each client sent it.
    phase_ = "finish";
    nlohmann::json cut_messages = nlohmann::json::object();
    {
      send(server_name_, command_message(FinishCmd{}, pool_->next_request_id()));
      auto fin = await_acks({server_name_}, "finish", Clock::now() + std::chrono::seconds(30), nullptr);
      cut_messages = fin[server_name_].value("received", nlohmann::json::object());
    }
    stop_all();

    nlohmann::json out;
    out["mode"] = "split";
    out["labels"] = opts_.labels;
    out["splitfed"] = opts_.splitfed;
    out["encoding"] = encoding_name(encoding);
    out["layout"] = layout.to_json();
    out["clients"] = clients_.size();
    out["server"] = server_name_;
    out["model"] = spec.name;
    out["model_path"] = cfg_.model_path;
    out["epochs"] = cfg_.epochs;
    out["batch"] = cfg_.batch;
    out["seed"] = cfg_.seed;
    out["optimizer"] = ocfg.to_json();
    out["steps"] = losses.size();
    out["losses"] = losses;
    out["rounds"] = rounds;
    out["test_accuracy"] = test_accuracy;
    out["test_loss"] = test_loss;
    out["test_samples"] = test_samples;
    out["samples_per_sec"] = train_seconds > 0 ? static_cast<double>(trained_samples) / train_seconds : 0.0;
    out["wall_seconds"] = seconds_since(t_start);
    int64_t up = 0, down = 0;
    for (const auto& r : rounds) {
      up += r["cut_bytes_up"].get<int64_t>();
      down += r["cut_bytes_down"].get<int64_t>();
    }
    out["cut_bytes_up"] = up;
    out["cut_bytes_down"] = down;
    nlohmann::json devs = nlohmann::json::array(), kinds = nlohmann::json::object();
    for (const auto& name : participants_) {
      const PoolPeer& p = pool_->at(name);
      const bool is_server = name == server_name_;
      nlohmann::json d = {{"name", name}, {"role", is_server ? "server" : "client"}, {"gflops", p.reg.compute_gflops},
                          {"details", p.details}};
      if (is_server) d["layers"] = {layout.server_begin(), layout.server_end()};
      else {
        d["layers"] = {0, layout.cut};
        if (layout.has_tail()) d["tail_layers"] = {layout.cut_back, layout.num_layers};
        kinds[name] = pool_->message_kinds(name);
      }
      devs.push_back(d);
    }
    out["devices"] = devs;
    out["messages_from_clients"] = kinds;
    out["cut_layer_messages"] = cut_messages;
    return out;
  } catch (...) {
    stop_all();
    throw;
  }
}

}  // namespace

nlohmann::json train_split(const TrainConfig& config, const SplitOptions& options) {
  SplitDriver driver(config, options);
  return driver.run();
}

}  // namespace cleave
