// fed_coordinator.cpp: the federated round driver; see fed_coordinator.h and
// docs/federated.md.
#include "core/runtime/coordinator/fed_coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "core/fed/strategy.h"
#include "core/model/partition.h"
#include "core/runtime/coordinator/peer_pool.h"
#include "core/runtime/common/wire.h"
#include "core/train/evaluate.h"
#include "core/train/train_checkpoint.h"
#include "core/util/rng.h"
#include "transport/endpoint.h"
#include "transport/keys.h"
#include "transport/log.h"

namespace cleave {

void FedOptions::validate() const {
  auto bad = [](const std::string& s) { throw std::invalid_argument(s); };
  if (clients < 1) bad("--clients must be at least 1");
  if (rounds < 1) bad("--rounds must be at least 1");
  if (local_epochs < 1) bad("--local-epochs must be at least 1");
  if (!(fraction > 0 && fraction <= 1)) bad("--fraction must be in (0, 1], got " + std::to_string(fraction));
  if (min_clients < 1) bad("--min-clients must be at least 1");
  if (min_clients > clients)
    bad("--min-clients " + std::to_string(min_clients) + " exceeds --clients " + std::to_string(clients));
  if (!(round_timeout_s > 0)) bad("--round-timeout must be positive");
  (void)parse_fed_strategy(strategy);
  if (!std::isfinite(mu) || mu < 0) bad("--mu must be finite and >= 0");
  if (!(trim_fraction >= 0 && trim_fraction < 0.5)) bad("the trim fraction must be in [0, 0.5)");
}

namespace {

using namespace transport;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// What one sampled client produced in the current round.
struct Reply {
  std::optional<ClientUpdate> update;
  std::optional<MetricsMsg> metrics;
  std::string failure;  // error reported or dropout
  bool resolved() const { return (update && metrics) || !failure.empty(); }
};

class FedDriver {
 public:
  FedDriver(const TrainConfig& cfg, const FedOptions& opts) : cfg_(cfg), opts_(opts) {}
  nlohmann::json run();

 private:
  std::optional<Received> receive(Millis timeout) { return pool_->receive(timeout); }
  PoolPeer& client(const std::string& name) { return pool_->at(name); }
  [[noreturn]] void fail(const std::string& text) { throw std::runtime_error(text); }
  void stop_all();
  EvalResult evaluate_global(Partition& whole, const std::vector<Dataset>& test_chunks);

  const TrainConfig& cfg_;
  const FedOptions& opts_;
  std::unique_ptr<ServerEndpoint> server_;
  std::unique_ptr<PeerPool> pool_;
  std::vector<std::string> clients_;            // sorted by name once all registered
  std::map<std::string, int> rounds_accepted_;  // rounds whose update was accepted, by client
  int current_round_ = -1;
};

EvalResult FedDriver::evaluate_global(Partition& whole, const std::vector<Dataset>& test_chunks) {
  // In slices, keeping the clients' heartbeats going in between.
  double loss = 0, correct = 0;
  int64_t n = 0;
  for (const Dataset& chunk : test_chunks) {
    EvalResult e = evaluate(whole, chunk, 256);
    loss += e.loss * static_cast<double>(e.samples);
    correct += e.accuracy * static_cast<double>(e.samples);
    n += e.samples;
    while (receive(Millis(0))) {
    }
  }
  EvalResult out;
  out.samples = n;
  out.loss = n ? loss / static_cast<double>(n) : 0;
  out.accuracy = n ? correct / static_cast<double>(n) : 0;
  return out;
}

void FedDriver::stop_all() {
  pool_->send_all(command_message(FinishCmd{}, pool_->next_request_id()));
  if (opts_.shutdown_clients) pool_->send_all(command_message(ShutdownCmd{}, pool_->next_request_id()));
}

nlohmann::json FedDriver::run() {
  const auto t_start = Clock::now();
  try {
    opts_.validate();
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  const FedStrategy strategy = parse_fed_strategy(opts_.strategy);
  ModelSpec spec = ModelSpec::load(cfg_.model_path);
  Dataset test = load_dataset(cfg_.dataset, cfg_.dataset_dir, /*train=*/false, cfg_.limit_test);
  if (numel(test.sample_shape) != numel(spec.input))
    fail(cfg_.model_path + ": model input " + shape_str(spec.input) + " does not match the " + test.name +
         " samples " + shape_str(test.sample_shape));
  std::vector<Dataset> test_chunks;
  for (int64_t lo = 0; lo < test.size(); lo += 1000) {
    std::vector<int64_t> idx;
    for (int64_t i = lo; i < std::min<int64_t>(test.size(), lo + 1000); ++i) idx.push_back(i);
    test_chunks.push_back(subset(test, idx));
  }
  if (!cfg_.load_path.empty() && !cfg_.init_path.empty())
    fail("--load and --init both say where training starts: give one of them");

  DeviceOptions dopts;
  dopts.threads = cfg_.threads;
  auto cpu = open_device("cpu", dopts);
  Partition whole(*cpu, spec, 0, spec.num_layers());
  whole.init(cfg_.seed);
  const size_t param_count = static_cast<size_t>(whole.param_count());
  // Where the rounds start: the seed's weights, --init's, or --load's after its rounds.
  int start_round = 0;
  if (!cfg_.load_path.empty()) {
    FedState st = load_fed_state(cfg_.load_path);
    check_saved_model(st.model, st.params.size(), spec, whole.param_count(), cfg_.load_path);
    if (st.rounds_done >= opts_.rounds)
      fail(cfg_.load_path + " already holds " + std::to_string(st.rounds_done) + " round(s) and --rounds " +
           std::to_string(opts_.rounds) + " counts every round, those included: ask for more");
    whole.params().from_host(st.params);
    start_round = static_cast<int>(st.rounds_done);
  } else if (!cfg_.init_path.empty()) {
    whole.params().from_host(load_init_weights(spec, cfg_.init_path));
  }
  auto global = std::make_shared<std::vector<float>>(whole.params().to_host());
  const nlohmann::json run_record = {{"strategy", fed_strategy_name(strategy)}, {"clients", opts_.clients},
                                     {"fraction", opts_.fraction}, {"local_epochs", opts_.local_epochs},
                                     {"batch", cfg_.batch}, {"optimizer", cfg_.optimizer.to_json()}};

  OptimizerConfig ocfg = cfg_.optimizer;
  ocfg.validate();

  ServerOptions so;
  so.bind = opts_.listen;
  so.insecure = opts_.insecure;
  so.label = "cleave fed";
  if (!opts_.insecure) {
    so.keys = load_secret_key(opts_.key_path);
    so.allow = AllowList::load(opts_.allow_path);
  }
  server_ = std::make_unique<ServerEndpoint>(so);
  pool_ = std::make_unique<PeerPool>(*server_, "cleave fed", opts_.peer_timeout_ms, opts_.interrupted);
  pool_->context = [this] { return " (round " + std::to_string(current_round_) + ")"; };
  if (opts_.on_listening) opts_.on_listening(server_->endpoint());
  if (cfg_.progress)
    std::fprintf(stderr, "cleave fed: listening on %s, waiting for %d client(s)\n", server_->endpoint().c_str(),
                 opts_.clients);

  // 1. Registration: federated clients only.
  std::set<std::string> warned;
  const auto t_reg = Clock::now();
  while (static_cast<int>(clients_.size()) < opts_.clients) {
    if (seconds_since(t_reg) * 1000 > opts_.register_timeout_ms) {
      std::string names;
      for (const auto& c : clients_) names += (names.empty() ? "" : ", ") + c;
      fail("only " + std::to_string(clients_.size()) + " of " + std::to_string(opts_.clients) +
           " federated clients registered within " + std::to_string(opts_.register_timeout_ms / 1000) + " s" +
           (names.empty() ? "" : " (" + names + ")") +
           ": start cleaved with --dataset and --shard i/N and its key on the allow-list");
    }
    auto got = receive(Millis(200));
    if (!got) continue;
    auto* r = std::get_if<RegisterMsg>(&got->message.body);
    if (!r || pool_->has(got->peer)) continue;
    nlohmann::json details = nlohmann::json::parse(r->details_json.empty() ? "{}" : r->details_json, nullptr, false);
    if (details.is_discarded() || !details.is_object() || !details.value("fed_client", false)) {
      if (warned.insert(got->peer).second)
        log(LogLevel::kWarning, "cleave fed: device " + got->peer +
                                    " registered without data (not a federated client): ignored");
      continue;
    }
    pool_->add(got->peer, *r, details);
    clients_.push_back(got->peer);
    if (cfg_.progress)
      std::fprintf(stderr, "cleave fed: client %s registered (%lld samples, shard %s, %s)\n", got->peer.c_str(),
                   static_cast<long long>(details.value("samples", static_cast<int64_t>(0))),
                   details.value("shard", std::string("?")).c_str(), details.value("partition", std::string("?")).c_str());
  }
  std::sort(clients_.begin(), clients_.end());

  pool_->set_monitoring(true);
  try {
    // 2. Set-up: the model once per client.
    const FedJob job{cfg_.batch, cfg_.seed, fed_strategy_name(strategy)};
    for (size_t i = 0; i < clients_.size(); ++i) {
      AssignMsg a;
      a.stage = 0;
      a.num_stages = 1;
      a.layer_begin = 0;
      a.layer_end = spec.num_layers();
      a.model_spec_json = spec.to_json().dump();
      a.optimizer = to_wire(ocfg);
      a.job = job;
      Message m;
      m.request_id = pool_->next_request_id();
      m.body = a;
      Status s = server_->send(clients_[i], m);
      if (!s) fail("cannot reach client " + clients_[i] + ": " + s.failure().message);
    }
    std::set<std::string> acked;
    const auto t_setup = Clock::now();
    while (acked.size() < clients_.size()) {
      if (seconds_since(t_setup) > 60) fail("clients did not acknowledge the federated set-up within 60 s");
      for (const auto& c : clients_)
        if (client(c).dead) fail("client " + c + " " + client(c).dead_reason + " during the federated set-up");
      auto got = receive(Millis(100));
      if (!got) continue;
      if (auto* e = std::get_if<ErrorMsg>(&got->message.body))
        fail("client " + got->peer + " refused the federated job: " + e->message);
      if (std::holds_alternative<AckMsg>(got->message.body)) acked.insert(got->peer);
    }

    // 3. Rounds.
    const double mu = strategy == FedStrategy::fedprox ? opts_.mu : 0.0;
    nlohmann::json rounds = nlohmann::json::array();
    EvalResult last_eval;
    for (int r = start_round; r < opts_.rounds; ++r) {
      current_round_ = r;
      const auto t_round = Clock::now();
      std::vector<std::string> live;
      for (const auto& c : clients_)
        if (!client(c).dead) live.push_back(c);
      if (static_cast<int>(live.size()) < opts_.min_clients)
        fail("round " + std::to_string(r + 1) + ": only " + std::to_string(live.size()) + " client(s) are alive, " +
             "--min-clients is " + std::to_string(opts_.min_clients));
      const int want = std::clamp(static_cast<int>(std::ceil(opts_.fraction * static_cast<double>(live.size()) - 1e-9)),
                                  opts_.min_clients, static_cast<int>(live.size()));
      std::vector<int64_t> perm = seeded_permutation(static_cast<int64_t>(live.size()), derive_seed(cfg_.seed, static_cast<uint64_t>(r), 0x5A3D));
      std::vector<std::string> sampled;
      for (int i = 0; i < want; ++i) sampled.push_back(live[static_cast<size_t>(perm[static_cast<size_t>(i)])]);
      std::sort(sampled.begin(), sampled.end());

      const EndpointStats before = server_->stats();
      std::map<std::string, Reply> replies;
      WeightsMsg wh;
      wh.stage = 0;
      wh.round = r;
      wh.sample_count = 0;
      wh.num_elements = static_cast<int64_t>(param_count);
      const uint64_t rid = pool_->next_request_id();  // the round's weights and command, and every reply
      const FedRoundCmd round_cmd{r, opts_.local_epochs, cfg_.batch, static_cast<float>(mu)};
      for (const auto& name : sampled) {
        Message wm = make_weights_message(wh, global->data(), global->size(), global);
        wm.request_id = rid;
        const Message cm = command_message(round_cmd, rid);
        Status s = server_->send(name, wm);
        if (s) s = server_->send(name, cm);
        replies[name];
        if (!s) {
          replies[name].failure = "unreachable: " + s.failure().message;
          pool_->mark_dead(name, "is unreachable");
        }
      }
      if (opts_.on_round_started) opts_.on_round_started(r, sampled);

      // Collect until every sampled client resolved or the round times out.
      auto all_resolved = [&] {
        for (auto& [name, rep] : replies) {
          if (rep.failure.empty() && client(name).dead && !rep.update)
            rep.failure = "dropped out (" + client(name).dead_reason + ")";
          if (rep.failure.empty() && client(name).dead && rep.update && !rep.metrics)
            rep.failure = "dropped out after its update";
          if (!rep.resolved()) return false;
        }
        return true;
      };
      bool timed_out = false;
      while (!all_resolved()) {
        if (seconds_since(t_round) > opts_.round_timeout_s) {
          timed_out = true;
          break;
        }
        auto got = receive(Millis(50));
        if (!got) continue;
        auto it = replies.find(got->peer);
        if (it == replies.end()) continue;  // not sampled this round: stale or unsolicited
        Reply& rep = it->second;
        if (auto* w = std::get_if<WeightsMsg>(&got->message.body)) {
          if (w->round != r) continue;
          ClientUpdate u;
          u.client = got->peer;
          u.params = weights_values(got->message);
          u.samples = w->sample_count;
          rep.update = std::move(u);
        } else if (auto* mm = std::get_if<MetricsMsg>(&got->message.body)) {
          if (mm->step == r) rep.metrics = *mm;
        } else if (auto* e = std::get_if<ErrorMsg>(&got->message.body)) {
          if (rep.failure.empty() && !rep.update) {
            rep.failure = "reported an error: " + e->message;
            log(LogLevel::kWarning, "cleave fed: round " + std::to_string(r + 1) + ": client " + got->peer + " " + rep.failure);
          }
        }
      }

      std::vector<ClientUpdate> updates;
      nlohmann::json dropped = nlohmann::json::array(), failed = nlohmann::json::array();
      double train_loss_sum = 0;
      int64_t train_samples = 0;
      for (auto& [name, rep] : replies) {
        if (rep.update) {
          updates.push_back(std::move(*rep.update));
          if (rep.metrics) {
            train_loss_sum += rep.metrics->loss_sum;
            train_samples += rep.metrics->sample_count;
          }
        } else if (!rep.failure.empty()) {
          (client(name).dead ? dropped : failed).push_back(name + ": " + rep.failure);
        } else {
          dropped.push_back(name + ": no update within --round-timeout " + std::to_string(opts_.round_timeout_s).substr(0, 6) + " s");
        }
      }
      std::vector<std::string> rejected;
      int acceptable = 0;
      for (const auto& u : updates) {
        std::string why = check_update(u, param_count);
        if (why.empty()) ++acceptable;
        else {
          rejected.push_back(u.client + ": " + why);
          log(LogLevel::kWarning, "cleave fed: round " + std::to_string(r + 1) + ": rejected the update of " + u.client + ": " + why);
        }
      }
      if (acceptable < opts_.min_clients)
        fail("round " + std::to_string(r + 1) + " of " + std::to_string(opts_.rounds) + ": only " +
             std::to_string(acceptable) + " acceptable update(s) arrived (" + std::to_string(updates.size()) +
             " received, " + std::to_string(rejected.size()) + " rejected, " +
             std::to_string(dropped.size() + failed.size()) + " missing, of " + std::to_string(sampled.size()) +
             " sampled" + (timed_out ? ", round timed out" : "") + "); --min-clients is " +
             std::to_string(opts_.min_clients));
      AggregateResult agg = aggregate(strategy, updates, param_count, opts_.trim_fraction);
      // A new block: ZeroMQ may still hold the old one (shared owner) for a client that dropped out.
      global = std::make_shared<std::vector<float>>(std::move(agg.params));
      for (const auto& name : agg.accepted) ++rounds_accepted_[name];
      const EndpointStats after = server_->stats();
      whole.params().from_host(*global);
      last_eval = evaluate_global(whole, test_chunks);
      const double train_loss = train_samples ? train_loss_sum / static_cast<double>(train_samples) : 0.0;
      nlohmann::json rj = {{"round", r + 1},
                           {"accuracy", last_eval.accuracy},
                           {"loss", last_eval.loss},
                           {"train_loss", train_loss},
                           {"participating", agg.accepted},
                           {"participants", agg.accepted.size()},
                           {"sampled", sampled},
                           {"rejected", rejected},
                           {"rejected_count", rejected.size()},
                           {"dropped", dropped},
                           {"failed", failed},
                           {"timed_out", timed_out},
                           {"bytes_down", after.bytes_sent - before.bytes_sent},
                           {"bytes_up", after.bytes_received - before.bytes_received},
                           {"seconds", seconds_since(t_round)}};
      rounds.push_back(rj);
      if (!cfg_.save_path.empty())  // after every round: a stopped run loses at most the round in progress
        save_fed_state(cfg_.save_path, FedState{spec.to_json(), run_record, r + 1, cfg_.seed, *global});
      if (cfg_.progress)
        std::fprintf(stderr, "cleave fed: round %d/%d: %zu of %zu client(s), local loss %.4f, test accuracy %.4f, %.1f s%s\n",
                     r + 1, opts_.rounds, agg.accepted.size(), sampled.size(), train_loss, last_eval.accuracy,
                     seconds_since(t_round), rejected.empty() ? "" : (", " + std::to_string(rejected.size()) + " rejected").c_str());
    }

    // 4. Finish: release the clients.
    pool_->set_monitoring(false);
    stop_all();

    nlohmann::json out;
    out["mode"] = "fed";
    out["strategy"] = fed_strategy_name(strategy);
    out["clients"] = opts_.clients;
    out["rounds"] = rounds;
    out["rounds_requested"] = opts_.rounds;
    out["start_round"] = start_round;
    out["local_epochs"] = opts_.local_epochs;
    out["fraction"] = opts_.fraction;
    out["min_clients"] = opts_.min_clients;
    if (strategy == FedStrategy::fedprox) out["mu"] = opts_.mu;
    if (strategy == FedStrategy::trimmed_mean) out["trim_fraction"] = opts_.trim_fraction;
    out["model"] = spec.name;
    out["model_path"] = cfg_.model_path;
    out["dataset"] = test.name;
    out["test_samples"] = test.size();
    out["batch"] = cfg_.batch;
    out["seed"] = cfg_.seed;
    out["optimizer"] = ocfg.to_json();
    out["parameters"] = whole.param_count();
    out["test_accuracy"] = last_eval.accuracy;
    out["test_loss"] = last_eval.loss;
    int64_t rejected_total = 0, down = 0, up = 0;
    for (const auto& rj : rounds) {
      rejected_total += rj["rejected_count"].get<int64_t>();
      down += rj["bytes_down"].get<int64_t>();
      up += rj["bytes_up"].get<int64_t>();
    }
    out["rejected_updates"] = rejected_total;
    out["bytes_down"] = down;
    out["bytes_up"] = up;
    out["wall_seconds"] = seconds_since(t_start);
    nlohmann::json devs = nlohmann::json::array(), kinds = nlohmann::json::object();
    for (const auto& name : clients_) {
      const PoolPeer& c = client(name);
      devs.push_back({{"name", c.name}, {"gflops", c.reg.compute_gflops}, {"details", c.details},
                      {"rounds_accepted", rounds_accepted_[name]}, {"dead", c.dead}});
      kinds[c.name] = pool_->message_kinds(name);
    }
    out["devices"] = devs;
    out["messages_from_clients"] = kinds;
    return out;
  } catch (...) {
    pool_->set_monitoring(false);
    stop_all();
    throw;
  }
}

}  // namespace

nlohmann::json train_federated(const TrainConfig& config, const FedOptions& options) {
  FedDriver driver(config, options);
  return driver.run();
}

}  // namespace cleave
