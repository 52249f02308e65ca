// fed_coordinator.cpp: the federated round driver; see fed_coordinator.h and
// docs/federated.md.
#include "core/runtime/coordinator/fed_coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "core/fed/accountant.h"
#include "core/fed/client_details.h"
#include "core/fed/strategy.h"
#include "core/io/untrusted_json.h"
#include "core/model/partition.h"
#include "core/runtime/common/secagg_round.h"
#include "core/runtime/coordinator/fed_secagg.h"
#include "core/runtime/coordinator/session.h"
#include "core/runtime/common/wire.h"
#include "core/train/evaluate.h"
#include "core/train/train_data.h"
#include "core/train/checkpoint_dir.h"
#include "core/train/train_checkpoint.h"
#include "core/util/rng.h"
#include "core/util/seconds.h"
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
  if (max_client_samples < 0 || max_client_samples > (int64_t{1} << 50))
    bad("--max-client-samples must be in [0, 2^50] (0: no cap beyond the registered count)");
  if (!std::isfinite(max_update_norm) || max_update_norm < 0) bad("--max-update-norm must be finite and >= 0 (0: off)");
  if (krum_f < 0) bad("--krum-f must be >= 0");
  if (krum_m < 0) bad("--krum-m must be >= 0 (0: the sampled clients less --krum-f)");
  // Known before any client registers: what a round samples when every client lives.
  const FedStrategy s = parse_fed_strategy(strategy);
  const int per_round = sampled_per_round(fraction, clients, min_clients);
  if (secure_aggregation) validate_secure_aggregation(s, per_round);
  if (const std::string why = strategy_refusal(s, aggregate_options(*this, nullptr), per_round); !why.empty())
    bad(why + " (clients sampled per round with --clients " + std::to_string(clients) + " and --fraction " +
        std::to_string(fraction).substr(0, 4) + ")");
  dp.validate();
  if (!dp.enabled()) return;
  if (const std::string why = dp_strategy_refusal(s); !why.empty()) bad(why);
  if (dp.target_epsilon > 0) {
    const double q = static_cast<double>(per_round) / clients;
    if (const PrivacySpent first = RdpAccountant().spent_after(q, dp.noise_multiplier, dp.delta);
        first.epsilon > dp.target_epsilon)
      bad("--dp-target-epsilon " + std::to_string(dp.target_epsilon) + " is below what the first round alone spends (" +
          "epsilon " + std::to_string(first.epsilon) + " at sampling rate " + std::to_string(q) +
          ", --dp-noise-multiplier " + std::to_string(dp.noise_multiplier) + ", --dp-delta " +
          std::to_string(dp.delta) + "): raise the noise, lower --fraction or accept a larger epsilon");
  }
}

void FedOptions::validate_secure_aggregation(FedStrategy s, int per_round) const {
  auto bad = [](const std::string& text) { throw std::invalid_argument(text); };
  if (s != FedStrategy::fedavg && s != FedStrategy::fedprox)
    bad("--secure-aggregation works with --strategy fedavg and fedprox only: " + std::string(fed_strategy_name(s)) +
        " must see each client's update, and secure aggregation shows the coordinator only their sum");
  if (insecure)
    bad("--secure-aggregation binds each client's round keys to its CURVE identity: run without --insecure");
  if (per_round < 2) bad("--secure-aggregation needs at least 2 clients per round (--clients, --fraction)");
  if (secagg_threshold != 0 && (secagg_threshold < 2 || secagg_threshold > per_round))
    bad("--secagg-threshold " + std::to_string(secagg_threshold) + " must be in [2, " + std::to_string(per_round) +
        "], the clients sampled per round");
  if (!std::isfinite(secagg_range) || secagg_range <= 0) bad("--secagg-range must be finite and > 0");
  if (secagg_bits < 1 || secagg_bits > 40) bad("--secagg-bits must be in [1, 40]");
}

int secagg_threshold(const FedOptions& o, int sampled) {
  return o.secagg_threshold > 0 ? o.secagg_threshold : std::max(2, sampled / 2 + 1);
}

AggregateOptions aggregate_options(const FedOptions& o, const std::vector<float>* global) {
  AggregateOptions a;
  a.trim_fraction = o.trim_fraction;
  a.max_update_norm = o.max_update_norm;
  a.global = global;
  a.krum_f = o.krum_f;
  a.krum_m = o.krum_m;
  return a;
}

int sampled_per_round(double fraction, int live, int min_clients) {
  return std::clamp(static_cast<int>(std::ceil(fraction * static_cast<double>(live) - 1e-9)), min_clients, live);
}

namespace {

using namespace transport;
using Clock = std::chrono::steady_clock;

// What one sampled client produced in the current round.
struct Reply {
  std::optional<ClientUpdate> update;
  std::optional<MetricsMsg> metrics;
  std::string failure;  // error reported or dropout
  bool resolved() const { return (update && metrics) || !failure.empty(); }
};

// A round's replies sorted out: the updates that arrived (and how many of
// them are acceptable), who dropped out or failed, and the clients' own loss.
struct RoundUpdates {
  std::vector<ClientUpdate> updates;  // the acceptable ones
  std::vector<std::string> rejected;  // "client: reason"
  int acceptable = 0;
  nlohmann::json dropped = nlohmann::json::array(), failed = nlohmann::json::array();
  double train_loss_sum = 0;
  int64_t train_samples = 0;
};

class FedDriver {
 public:
  FedDriver(const TrainConfig& cfg, const FedOptions& opts) : cfg_(cfg), opts_(opts) {}
  nlohmann::json run();

 private:
  [[noreturn]] void fail(const std::string& text) { throw std::runtime_error(text); }
  PoolPeer& client(const std::string& name) { return session_->pool().at(name); }
  std::optional<Received> receive(Millis timeout) { return session_->pool().receive(timeout); }

  // Set-up, before anyone is contacted: options, model, test set, starting weights.
  void load_model_and_test_set();
  void load_start_weights();
  void listen();
  void register_clients();
  // A registration's client details, or nothing for a daemon that is not a
  // client or whose details are refused (logged and counted once per daemon).
  std::optional<FedClientDetails> client_details(const Registration& got);
  void refuse(const std::string& reason) { session_->pool().count_refused(reason); }
  void set_up_clients();  // the model once per client, until each acknowledged
  // Sends the model to `names` and waits until each acknowledged: "" then,
  // else why not (one refused, died or stayed silent for 60 s).
  std::string assign_model(const std::vector<std::string>& names);
  // Rejoining: a dead client of the roster that registers again (its daemon
  // came back) is noted by the pool's observer, then between rounds gets the
  // model again and is live (sampled) from the next round on.
  void note_returning(const Received& got);
  nlohmann::json rejoin_returning(int r);
  bool rejoin(int r, const std::string& name, const RegisterMsg& reg);
  // One round: sample, send the global block, collect, aggregate, evaluate.
  // Returns the round's entry of the result JSON.
  // Returns the round's entry of the result JSON, or nothing when
  // --dp-target-epsilon stops the run before it.
  std::optional<nlohmann::json> run_round(int r);
  std::vector<std::string> sample_clients(int r);
  // DP: the sampling rate of a round that samples `sampled` of the live clients.
  double sampling_rate(size_t sampled) const { return static_cast<double>(sampled) / live_; }
  // DP: false (logged, stopped_reason set) when the round would exceed --dp-target-epsilon.
  bool privacy_allows(int r, size_t sampled);
  // DP: charges the round to the accountant and records its epsilon (and the
  // accountant, for --save) ; Krum: the clients it selected.
  void record_round(nlohmann::json& rj, const AggregateResult& agg, size_t sampled);
  void resume_accountant(const FedState& st);
  // --resume: the newest checkpoint of the directory that loads (the skipped ones logged, and in resumed_).
  FedState newest_checkpoint();
  // --load, --resume: the state's checks, then its weights and round (start_path_ names it).
  void resume_from(const FedState& st);
  void refuse_foreign_checkpoints() const;
  // The global weights after `rounds_done` rounds to --save and the checkpoint directory.
  void save_round(int rounds_done);
  std::map<std::string, Reply> send_round(int r, const std::vector<std::string>& sampled,
                                          const std::optional<SecAggSetup>& secagg);
  // What a round produced, whichever way its updates arrived.
  struct RoundOutcome {
    AggregateResult agg;
    std::vector<std::string> rejected;
    nlohmann::json dropped = nlohmann::json::array(), failed = nlohmann::json::array();
    bool timed_out = false;
    double train_loss = 0;
    nlohmann::json secagg;  // secure rounds: the audit (fed_secagg.h)
  };
  RoundOutcome plain_round(int r, const std::vector<std::string>& sampled, Clock::time_point t_round);
  RoundOutcome secure_round(int r, const std::vector<std::string>& sampled, Clock::time_point t_round);
  SecAggSetup secagg_setup(const std::vector<std::string>& sampled) const;
  std::string sample_refusal(const std::string& client, int64_t samples) const;
  int64_t update_weight_bound(const std::string& client) const;
  // Collects until every sampled client resolved; false when the round timed out first.
  bool collect_replies(int r, std::map<std::string, Reply>& replies, Clock::time_point t_round);
  RoundUpdates sort_replies(int r, std::map<std::string, Reply>& replies);
  EvalResult evaluate_global();
  nlohmann::json result(const nlohmann::json& rounds, Clock::time_point t_start);
  void privacy_json(nlohmann::json& out) const;

  const TrainConfig& cfg_;
  const FedOptions& opts_;
  FedStrategy strategy_ = FedStrategy::fedavg;
  OptimizerConfig ocfg_;
  ModelSpec spec_;
  Dataset test_;
  std::vector<Dataset> test_chunks_;  // the test set in slices, see evaluate_global
  std::unique_ptr<Device> cpu_;
  std::unique_ptr<Partition> whole_;  // the global model, for evaluation
  size_t param_count_ = 0;
  int start_round_ = 0;
  std::string start_path_;                      // the checkpoint the run resumed from (--load, --resume)
  std::unique_ptr<CheckpointDir> checkpoints_;  // --checkpoint-dir (null without)
  nlohmann::json resumed_;                      // --resume: {from, rounds_done, skipped}
  std::map<std::string, RegisterMsg> returning_;  // dead clients that registered again, until they rejoin
  std::shared_ptr<std::vector<float>> global_;  // the global parameter block
  nlohmann::json run_record_;                   // the settings saved with every checkpoint
  std::unique_ptr<Session> session_;
  AllowList allow_;                              // secure aggregation: each client's CURVE key by name
  std::vector<std::string> clients_;            // sorted by name once all registered
  std::map<std::string, int> rounds_accepted_;  // rounds whose update was accepted, by client
  std::map<std::string, int64_t> registered_samples_;  // each client's shard size, as it registered
  std::set<std::string> warned_;                    // daemons whose registration was logged as not taken
  int current_round_ = -1;
  EvalResult last_eval_;
  int live_ = 0;                        // live clients when the current round sampled
  RdpAccountant accountant_;            // DP: the privacy spent so far (with --load, the saved rounds too)
  std::unique_ptr<NoiseSource> noise_;  // DP: the Gaussian noise (seeded by the OS, not by --seed)
  std::string stopped_reason_ = "completed";
};

nlohmann::json FedDriver::run() {
  const auto t_start = Clock::now();
  load_model_and_test_set();
  load_start_weights();
  listen();
  register_clients();
  return session_->run_job(clients_, opts_.shutdown_clients, [&] {
    set_up_clients();
    nlohmann::json rounds = nlohmann::json::array();
    for (int r = start_round_; r < opts_.rounds; ++r) {
      std::optional<nlohmann::json> rj = run_round(r);
      if (!rj) break;
      rounds.push_back(std::move(*rj));
    }
    if (rounds.empty()) last_eval_ = evaluate_global();  // stopped before the first round: the starting model
    return result(rounds, t_start);
  });
}

void FedDriver::load_model_and_test_set() {
  try {
    opts_.validate();
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  strategy_ = parse_fed_strategy(opts_.strategy);
  if (opts_.dp.enabled()) noise_ = std::make_unique<NoiseSource>();
  spec_ = ModelSpec::load(cfg_.model_path);
  if (language_model_mismatch(spec_).empty())
    fail(cfg_.model_path + " is a byte-level language model: cleave fed cannot train one yet (its clients hold "
         "class-labelled --dataset samples); train it with cleave train --text FILE");
  test_ = load_dataset(cfg_.dataset, cfg_.dataset_dir, /*train=*/false, cfg_.limit_test);
  if (numel(test_.sample_shape) != numel(spec_.input))
    fail(cfg_.model_path + ": model input " + shape_str(spec_.input) + " does not match the " + test_.name +
         " samples " + shape_str(test_.sample_shape));
  for (int64_t lo = 0; lo < test_.size(); lo += 1000) {
    std::vector<int64_t> idx;
    for (int64_t i = lo; i < std::min<int64_t>(test_.size(), lo + 1000); ++i) idx.push_back(i);
    test_chunks_.push_back(subset(test_, idx));
  }
}

// Where the rounds start: the seed's weights, --init's, or --load's or
// --resume's after their rounds.
void FedDriver::load_start_weights() {
  if (!cfg_.load_path.empty() && !cfg_.init_path.empty())
    fail("--load and --init both say where training starts: give one of them");
  if (opts_.resume && (!cfg_.load_path.empty() || !cfg_.init_path.empty()))
    fail("--resume continues from the newest checkpoint in its directory: give no --load or --init with it");
  if (opts_.resume && opts_.checkpoint_dir.empty()) fail("--resume needs the checkpoint directory to resume from");
  DeviceOptions dopts;
  dopts.threads = cfg_.threads;
  cpu_ = open_device("cpu", dopts);
  whole_ = std::make_unique<Partition>(*cpu_, spec_, 0, spec_.num_layers());
  whole_->init(cfg_.seed);
  param_count_ = static_cast<size_t>(whole_->param_count());
  if (!opts_.checkpoint_dir.empty()) checkpoints_ = std::make_unique<CheckpointDir>(opts_.checkpoint_dir);
  if (opts_.resume) {
    resume_from(newest_checkpoint());
  } else if (!cfg_.load_path.empty()) {
    start_path_ = cfg_.load_path;
    resume_from(load_fed_state(cfg_.load_path));
  } else if (!cfg_.init_path.empty()) {
    whole_->params().from_host(load_init_weights(spec_, cfg_.init_path));
  }
  if (checkpoints_ && !opts_.resume) refuse_foreign_checkpoints();
  global_ = std::make_shared<std::vector<float>>(whole_->params().to_host());
  run_record_ = {{"strategy", fed_strategy_name(strategy_)}, {"clients", opts_.clients},
                 {"fraction", opts_.fraction}, {"local_epochs", opts_.local_epochs},
                 {"batch", cfg_.batch}, {"optimizer", cfg_.optimizer.to_json()}};
  ocfg_ = cfg_.optimizer;
  ocfg_.validate();
}

FedState FedDriver::newest_checkpoint() {
  std::vector<std::string> skipped;
  std::string from;
  std::optional<FedState> st = checkpoints_->newest<FedState>(
      [&](const std::string& path) {
        FedState loaded = load_fed_state(path);
        from = path;
        return loaded;
      },
      skipped);
  for (const auto& why : skipped)
    log(LogLevel::kWarning, "cleave fed: --resume skipped the checkpoint " + why + "; it uses the one before it");
  if (!st) {
    std::string why;
    for (const auto& w : skipped) why += (why.empty() ? " (" : "; ") + w;
    fail("--resume " + opts_.checkpoint_dir + ": no valid checkpoint there" +
         (skipped.empty() ? std::string(" (no step-*.ckpt: the run stopped before its first round ended)") : why + ")") +
         ": start the run again without --resume (the same flags and --checkpoint-dir " + opts_.checkpoint_dir + ")");
  }
  start_path_ = from;
  resumed_ = {{"from", from}, {"rounds_done", st->rounds_done}, {"skipped", skipped}};
  log(LogLevel::kInfo, "cleave fed: resuming from " + from + " after round " + std::to_string(st->rounds_done));
  return std::move(*st);
}

void FedDriver::resume_from(const FedState& st) {
  check_saved_model(st.model, st.params.size(), spec_, whole_->param_count(), start_path_);
  if (st.rounds_done >= opts_.rounds)
    fail(start_path_ + " already holds " + std::to_string(st.rounds_done) + " round(s) and --rounds " +
         std::to_string(opts_.rounds) + " counts every round, those included: ask for more");
  whole_->params().from_host(st.params);
  start_round_ = static_cast<int>(st.rounds_done);
  resume_accountant(st);
}

// A fresh run's checkpoints would sort below those already there, and the
// newest two kept would be the other run's: refuse rather than mix them.
void FedDriver::refuse_foreign_checkpoints() const { checkpoints_->refuse_foreign(start_round_, "cleave fed --resume"); }

void FedDriver::save_round(int rounds_done) {
  const FedState st{spec_.to_json(), run_record_, rounds_done, cfg_.seed, *global_};
  if (!cfg_.save_path.empty()) save_fed_state(cfg_.save_path, st);
  if (checkpoints_) checkpoints_->save(rounds_done, [&](const std::string& path) { save_fed_state(path, st); });
}

// The privacy the loaded rounds spent: a checkpoint of DP rounds carries its accountant.
void FedDriver::resume_accountant(const FedState& st) {
  if (!opts_.dp.enabled() || st.rounds_done == 0) return;
  const nlohmann::json* saved = st.run.contains("dp_rdp") ? &st.run["dp_rdp"] : nullptr;
  if (!saved)
    fail(start_path_ + " holds " + std::to_string(st.rounds_done) + " round(s) trained without --dp-clip: their "
         "privacy loss is unbounded, so no epsilon can be reported for a run that resumes them; start from --init instead");
  if (saved->is_string()) {  // rounds without noise: nothing finite to resume
    accountant_ = RdpAccountant(std::vector<double>(accountant_.orders().size(), std::numeric_limits<double>::infinity()));
    return;
  }
  try {
    accountant_ = RdpAccountant(saved->get<std::vector<double>>());
  } catch (const std::exception& e) {
    fail(start_path_ + ": " + e.what());
  }
}

void FedDriver::listen() {
  // Nothing a peer sends this job may be larger than its biggest state block or batch tensor.
  session_ = std::make_unique<Session>(session_options(
      "cleave fed", opts_, job_payload_cap(spec_, cfg_.optimizer.kind, cfg_.optimizer.momentum, cfg_.batch)));
  if (opts_.secure_aggregation) allow_ = AllowList::load(opts_.allow_path);
  // Rounds count from 1 in logs and JSON alike (0 on the wire).
  session_->pool().context = [this] { return " (round " + std::to_string(current_round_ + 1) + ")"; };
  // Every message passes the pool's observer, also those the secure rounds read: a returning client is noted there.
  session_->pool().observer = [this, metrics = session_->pool().observer](const Received* got) {
    if (got) note_returning(*got);
    if (metrics) metrics(got);
  };
  if (checkpoints_)
    log(LogLevel::kInfo, "cleave fed: checkpoints in " + checkpoints_->dir() +
                             " (resume with: cleave fed --resume " + checkpoints_->dir() + ")");
  if (cfg_.progress)
    std::fprintf(stderr, "cleave fed: listening on %s, waiting for %d client(s)\n",
                 session_->server().endpoint().c_str(), opts_.clients);
}

// Federated clients only: a daemon without data is ignored (once warned about).
void FedDriver::register_clients() {
  session_->register_until(
      opts_.register_timeout_ms, [&] { return static_cast<int>(clients_.size()) >= opts_.clients; },
      [&](const Registration& got) {
        const std::optional<FedClientDetails> d = client_details(got);
        if (!d) return;
        session_->pool().add(got.peer, got.reg, got.details);
        clients_.push_back(got.peer);
        registered_samples_[got.peer] = d->samples;
        if (cfg_.progress)
          std::fprintf(stderr, "cleave fed: client %s registered (%lld samples, shard %s, %s)\n", got.peer.c_str(),
                       static_cast<long long>(d->samples), d->shard.c_str(), d->partition.c_str());
      },
      [&](const std::string& names) {
        const std::string refused = session_->refused_registrations();
        return "only " + std::to_string(clients_.size()) + " of " + std::to_string(opts_.clients) +
               " federated clients registered within " + seconds_text(opts_.register_timeout_ms) +
               (names.empty() ? "" : " (" + names + ")") + refused +
               ": start cleaved with --dataset and --shard i/N and its key on the allow-list";
      });
  std::sort(clients_.begin(), clients_.end());
}

std::optional<FedClientDetails> FedDriver::client_details(const Registration& got) {
  FedClientDetails d;
  try {
    d = read_fed_client_details(got.details, got.details_error);
  } catch (const std::invalid_argument& e) {
    session_->refuse_registration("client", got.peer, e.what());
    return std::nullopt;
  }
  if (!d.fed_client || !d.fed_jobs) {
    if (warned_.insert(got.peer).second)
      log(LogLevel::kWarning, "cleave fed: device " + got.peer +
                                  (d.fed_client ? " joined as a split-learning client only (not a federated client): "
                                                  "ignored"
                                                : " registered without data (not a federated client): ignored"));
    return std::nullopt;
  }
  return d;
}

void FedDriver::set_up_clients() {
  if (const std::string why = assign_model(clients_); !why.empty()) fail(why);
}

std::string FedDriver::assign_model(const std::vector<std::string>& names) {
  const FedJob job{cfg_.batch, cfg_.seed, fed_strategy_name(strategy_)};
  for (const auto& name : names) {
    AssignMsg a;
    a.stage = 0;
    a.num_stages = 1;
    a.layer_begin = 0;
    a.layer_end = spec_.num_layers();
    a.model_spec_json = spec_.to_json().dump();
    a.optimizer = to_wire(ocfg_);
    a.job = job;
    Status s = session_->server().send(name, Message{session_->next_request_id(), a, {}});
    if (!s) return "cannot reach client " + name + ": " + s.failure().message;
  }
  const std::set<std::string> waiting(names.begin(), names.end());
  std::set<std::string> acked;
  const auto t_setup = Clock::now();
  while (acked.size() < names.size()) {
    if (seconds_since(t_setup) > 60) return "clients did not acknowledge the federated set-up within 60 s";
    for (const auto& c : names)
      if (client(c).dead) return "client " + c + " " + client(c).dead_reason + " during the federated set-up";
    auto got = receive(Millis(100));
    if (!got || !waiting.count(got->peer)) continue;
    if (auto* e = std::get_if<ErrorMsg>(&got->message.body))
      return "client " + got->peer + " refused the federated job: " + e->message;
    if (std::holds_alternative<AckMsg>(got->message.body)) acked.insert(got->peer);
  }
  return "";
}

// Called by the pool with everything it receives, whichever loop reads it.
void FedDriver::note_returning(const Received& got) {
  const auto* reg = std::get_if<RegisterMsg>(&got.message.body);
  if (!reg || !registered_samples_.count(got.peer) || !client(got.peer).dead) return;
  returning_.insert_or_assign(got.peer, *reg);  // it registers every second: the latest wins
}

// The clients that came back since the last round, set up again; the round's "rejoined".
nlohmann::json FedDriver::rejoin_returning(int r) {
  nlohmann::json out = nlohmann::json::array();
  std::map<std::string, RegisterMsg> back;
  back.swap(returning_);
  for (const auto& [name, reg] : back)
    if (client(name).dead && rejoin(r, name, reg)) out.push_back(name);
  return out;
}

bool FedDriver::rejoin(int r, const std::string& name, const RegisterMsg& reg) {
  const Registration registration = parse_registration(name, reg);
  const std::optional<FedClientDetails> d = client_details(registration);
  if (!d) return false;
  // The roster keeps its place (and audit); the daemon is a new process with a new registration.
  const std::string was = client(name).dead_reason;
  session_->pool().revive(name, reg, registration.details);
  registered_samples_[name] = d->samples;
  if (const std::string why = assign_model({name}); !why.empty()) {
    session_->pool().mark_dead(name, "could not rejoin: " + why);
    return false;
  }
  log(LogLevel::kInfo, "cleave fed: client " + name + " (" + was + " before) registered again and rejoins from round " +
                           std::to_string(r + 1) + " (" + std::to_string(d->samples) + " samples)");
  return true;
}

std::optional<nlohmann::json> FedDriver::run_round(int r) {
  current_round_ = r;
  nlohmann::json rejoined = rejoin_returning(r);
  const auto t_round = Clock::now();
  const std::vector<std::string> sampled = sample_clients(r);
  if (!privacy_allows(r, sampled.size())) return std::nullopt;
  const EndpointStats before = session_->server().stats();
  RoundOutcome o = opts_.secure_aggregation ? secure_round(r, sampled, t_round) : plain_round(r, sampled, t_round);
  const AggregateResult& agg = o.agg;
  if (!agg.clipped.empty())
    log(LogLevel::kInfo, "cleave fed: round " + std::to_string(r + 1) + ": " + std::to_string(agg.clipped.size()) +
                             " update(s) clipped to --max-update-norm " + std::to_string(opts_.max_update_norm));
  // A new block: ZeroMQ may still hold the old one (shared owner) for a client that dropped out.
  global_ = std::make_shared<std::vector<float>>(std::move(o.agg.params));
  for (const auto& name : agg.accepted) ++rounds_accepted_[name];
  const EndpointStats after = session_->server().stats();
  whole_->params().from_host(*global_);
  last_eval_ = evaluate_global();
  nlohmann::json rj = {{"round", r + 1},
                       {"accuracy", last_eval_.accuracy},
                       {"loss", last_eval_.loss},
                       {"train_loss", o.train_loss},
                       {"participating", agg.accepted},
                       {"participants", agg.accepted.size()},
                       {"sampled", sampled},
                       {"rejected", o.rejected},
                       {"rejected_count", o.rejected.size()},
                       {"clipped", agg.clipped},
                       {"clipped_count", agg.clipped.size()},
                       {"dropped", o.dropped},
                       {"failed", o.failed},
                       {"timed_out", o.timed_out},
                       {"bytes_down", after.bytes_sent - before.bytes_sent},
                       {"bytes_up", after.bytes_received - before.bytes_received},
                       {"seconds", seconds_since(t_round)}};
  if (!o.secagg.is_null()) rj["secagg"] = std::move(o.secagg);
  record_round(rj, agg, sampled.size());
  rj["rejoined"] = std::move(rejoined);
  save_round(r + 1);  // after every round: a stopped run loses at most the round in progress
  if (cfg_.progress)
    std::fprintf(stderr, "cleave fed: round %d/%d: %zu of %zu client(s), local loss %.4f, test accuracy %.4f, %.1f s%s\n",
                 r + 1, opts_.rounds, agg.accepted.size(), sampled.size(), o.train_loss, last_eval_.accuracy,
                 seconds_since(t_round),
                 o.rejected.empty() ? "" : (", " + std::to_string(o.rejected.size()) + " rejected").c_str());
  return rj;
}

// Every sampled client's weights in the clear, aggregated by the strategy.
FedDriver::RoundOutcome FedDriver::plain_round(int r, const std::vector<std::string>& sampled,
                                               Clock::time_point t_round) {
  std::map<std::string, Reply> replies = send_round(r, sampled, std::nullopt);
  if (opts_.on_round_started) opts_.on_round_started(r, sampled);
  const bool timed_out = !collect_replies(r, replies, t_round);
  RoundUpdates got = sort_replies(r, replies);
  const std::string round_of = "round " + std::to_string(r + 1) + " of " + std::to_string(opts_.rounds);
  if (got.acceptable < opts_.min_clients)
    fail(round_of + ": only " + std::to_string(got.acceptable) + " acceptable update(s) arrived (" +
         std::to_string(got.updates.size() + got.rejected.size()) + " received, " + std::to_string(got.rejected.size()) + " rejected, " +
         std::to_string(got.dropped.size() + got.failed.size()) + " missing, of " + std::to_string(sampled.size()) +
         " sampled" + (timed_out ? ", round timed out" : "") + "); --min-clients is " +
         std::to_string(opts_.min_clients));
  AggregateOptions aopts = aggregate_options(opts_, global_.get());
  if (const std::string why = strategy_refusal(strategy_, aopts, got.acceptable); !why.empty())
    fail(round_of + ": " + why + " (the others dropped out or were rejected)");
  if (opts_.dp.enabled()) {
    aopts.dp = &opts_.dp;
    aopts.dp_denominator = static_cast<int>(sampled.size());  // fixed: a missing client adds nothing
    aopts.dp_noise = noise_.get();
  }
  RoundOutcome o;
  o.agg = aggregate(strategy_, got.updates, param_count_, aopts);
  o.rejected = got.rejected;
  o.dropped = got.dropped;
  o.failed = got.failed;
  o.timed_out = timed_out;
  o.train_loss = got.train_samples ? got.train_loss_sum / static_cast<double>(got.train_samples) : 0.0;
  return o;
}

// What a secure round of `sampled` tells its clients (fed_secagg.h). With DP
// the clients clip to the DP clip and add their share of the noise, weight 1
// each; without, they weigh their update by its samples (FedAvg).
SecAggSetup FedDriver::secagg_setup(const std::vector<std::string>& sampled) const {
  SecAggSetup s;
  s.threshold = secagg_threshold(opts_, static_cast<int>(sampled.size()));
  for (const auto& name : sampled) {
    const std::optional<std::string> key = allow_.key_of(name);
    if (!key) throw std::runtime_error("client " + name + " is no longer on the allow-list");
    s.clients.push_back(PeerInfo{"", *key, name});
  }
  s.range = static_cast<float>(opts_.secagg_range);
  s.frac_bits = opts_.secagg_bits;
  s.clip = static_cast<float>(opts_.dp.enabled() ? opts_.dp.clip : opts_.max_update_norm);
  if (opts_.dp.enabled() && opts_.max_update_norm > 0) s.clip = static_cast<float>(std::min(opts_.dp.clip, opts_.max_update_norm));
  s.noise_stddev = opts_.dp.enabled() ? static_cast<float>(noise_share_stddev(opts_.dp, s.threshold)) : 0.0f;
  s.weight_by_samples = !opts_.dp.enabled();
  return s;
}

// "" when `client` may weigh its update with `samples`, else why not.
std::string FedDriver::sample_refusal(const std::string& client, int64_t samples) const {
  const int64_t bound = update_weight_bound(client);
  if (samples >= 0 && samples <= bound) return "";
  return "a sample count of " + std::to_string(samples) + " exceeds the " + std::to_string(bound) +
         " this client may weigh (--local-epochs x its registered samples, --max-client-samples)";
}

int64_t FedDriver::update_weight_bound(const std::string& client) const {
  int64_t bound = opts_.local_epochs * registered_samples_.at(client);
  if (opts_.max_client_samples > 0) bound = std::min(bound, opts_.local_epochs * opts_.max_client_samples);
  return bound;
}

// Only the sum of the sampled clients' updates reaches the coordinator.
FedDriver::RoundOutcome FedDriver::secure_round(int r, const std::vector<std::string>& sampled,
                                                Clock::time_point t_round) {
  const std::string round_of = "round " + std::to_string(r + 1) + " of " + std::to_string(opts_.rounds);
  const SecAggSetup setup = secagg_setup(sampled);
  double max_weight = 0;
  for (const auto& name : sampled) max_weight += setup.weight_by_samples ? static_cast<double>(update_weight_bound(name)) : 1.0;
  if (const std::string why = secagg::overflow_refusal(setup.range, setup.frac_bits, max_weight); !why.empty())
    fail(round_of + ": " + why);
  std::map<std::string, Reply> replies = send_round(r, sampled, setup);
  if (opts_.on_round_started) opts_.on_round_started(r, sampled);
  SecureRoundIo io{*session_, r, sampled, setup, param_count_, session_->next_request_id(),
                   t_round + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.round_timeout_s)),
                   [this](const std::string& c, int64_t n) { return sample_refusal(c, n); }, opts_.on_secagg_delivery,
                   opts_.on_secagg_unmask};
  SecureRoundResult sr;
  try {
    sr = run_secure_round(io);
  } catch (const std::runtime_error& e) {
    fail(round_of + ": " + e.what());
  }
  if (static_cast<int>(sr.survivors.size()) < opts_.min_clients)
    fail(round_of + ": only " + std::to_string(sr.survivors.size()) + " masked update(s) counted; --min-clients is " +
         std::to_string(opts_.min_clients) + "; the previous global model is kept");
  RoundOutcome o;
  // DP: the fixed denominator of DP-FedAvg (dp.h); FedAvg: the survivors' samples.
  const double denominator = opts_.dp.enabled() ? static_cast<double>(sampled.size()) : sr.total_weight;
  o.agg.params.resize(param_count_);
  for (size_t i = 0; i < param_count_; ++i)
    o.agg.params[i] = static_cast<float>(static_cast<double>((*global_)[i]) + sr.weighted_sum[i] / denominator);
  o.agg.accepted = sr.survivors;
  for (auto& d : sr.dropped) o.dropped.push_back(d);
  double loss_sum = 0;
  int64_t loss_samples = 0;
  for (const auto& [name, mm] : sr.metrics)
    if (std::isfinite(mm.loss_sum) && mm.sample_count <= update_weight_bound(name)) {
      loss_sum += mm.loss_sum;
      loss_samples += mm.sample_count;
    }
  o.train_loss = loss_samples ? loss_sum / static_cast<double>(loss_samples) : 0.0;
  o.secagg = std::move(sr.audit);
  return o;
}

bool FedDriver::privacy_allows(int r, size_t sampled) {
  if (!opts_.dp.enabled() || !(opts_.dp.target_epsilon > 0)) return true;
  const PrivacySpent next = accountant_.spent_after(sampling_rate(sampled), opts_.dp.noise_multiplier, opts_.dp.delta);
  if (next.epsilon <= opts_.dp.target_epsilon) return true;
  stopped_reason_ = "dp_target_epsilon";
  log(LogLevel::kWarning, "cleave fed: stopping before round " + std::to_string(r + 1) + " of " +
                              std::to_string(opts_.rounds) + ": it would bring epsilon to " +
                              std::to_string(next.epsilon) + ", above --dp-target-epsilon " +
                              std::to_string(opts_.dp.target_epsilon) + " (delta " + std::to_string(opts_.dp.delta) +
                              "); the global model of round " + std::to_string(r) + " is the result");
  return false;
}

void FedDriver::record_round(nlohmann::json& rj, const AggregateResult& agg, size_t sampled) {
  if (strategy_ == FedStrategy::krum || strategy_ == FedStrategy::multi_krum) rj["krum_selected"] = agg.selected;
  if (!opts_.dp.enabled()) return;
  accountant_.compose(sampling_rate(sampled), opts_.dp.noise_multiplier);
  const PrivacySpent spent = accountant_.spent(opts_.dp.delta);
  // JSON has no infinity: an unbounded epsilon (no noise) is null.
  rj["epsilon"] = std::isfinite(spent.epsilon) ? nlohmann::json(spent.epsilon) : nlohmann::json();
  rj["sampling_rate"] = sampling_rate(sampled);
  rj["dp_clipped"] = agg.dp_clipped;
  rj["dp_clipped_count"] = agg.dp_clipped.size();
  bool finite = true;
  for (double v : accountant_.rdp()) finite = finite && std::isfinite(v);
  run_record_["dp_rdp"] = finite ? nlohmann::json(accountant_.rdp()) : nlohmann::json("infinite");
  if (cfg_.progress)
    std::fprintf(stderr, "cleave fed: round %d: epsilon %.4f (delta %g, sampling rate %.3f, noise multiplier %g)\n",
                 current_round_ + 1, spent.epsilon, opts_.dp.delta, sampling_rate(sampled),
                 opts_.dp.noise_multiplier);
}

// A seeded share of the live clients (at least K), sorted by name.
std::vector<std::string> FedDriver::sample_clients(int r) {
  std::vector<std::string> live;
  for (const auto& c : clients_)
    if (!client(c).dead) live.push_back(c);
  if (static_cast<int>(live.size()) < opts_.min_clients)
    fail("round " + std::to_string(r + 1) + ": only " + std::to_string(live.size()) + " client(s) are alive, " +
         "--min-clients is " + std::to_string(opts_.min_clients));
  live_ = static_cast<int>(live.size());
  const int want = sampled_per_round(opts_.fraction, live_, opts_.min_clients);
  std::vector<int64_t> perm = seeded_permutation(static_cast<int64_t>(live.size()),
                                                 derive_seed(cfg_.seed, static_cast<uint64_t>(r), 0x5A3D));
  std::vector<std::string> sampled;
  for (int i = 0; i < want; ++i) sampled.push_back(live[static_cast<size_t>(perm[static_cast<size_t>(i)])]);
  std::sort(sampled.begin(), sampled.end());
  return sampled;
}

// The global block and the round command to each sampled client; an
// unreachable one is resolved (and dead) at once.
std::map<std::string, Reply> FedDriver::send_round(int r, const std::vector<std::string>& sampled,
                                                   const std::optional<SecAggSetup>& secagg) {
  std::map<std::string, Reply> replies;
  WeightsMsg wh;
  wh.stage = 0;
  wh.round = r;
  wh.sample_count = 0;
  wh.num_elements = static_cast<int64_t>(param_count_);
  const uint64_t rid = session_->next_request_id();  // the round's weights and command, and every reply
  const double mu = strategy_ == FedStrategy::fedprox ? opts_.mu : 0.0;
  const FedRoundCmd round_cmd{r, opts_.local_epochs, cfg_.batch, static_cast<float>(mu), secagg};
  for (const auto& name : sampled) {
    Message wm = make_weights_message(wh, global_->data(), global_->size(), global_);
    wm.request_id = rid;
    const Message cm = command_message(round_cmd, rid);
    Status s = session_->server().send(name, wm);
    if (s) s = session_->server().send(name, cm);
    replies[name];
    if (!s) {
      replies[name].failure = "unreachable: " + s.failure().message;
      session_->pool().mark_dead(name, "is unreachable");
    }
  }
  return replies;
}

bool FedDriver::collect_replies(int r, std::map<std::string, Reply>& replies, Clock::time_point t_round) {
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
  while (!all_resolved()) {
    if (seconds_since(t_round) > opts_.round_timeout_s) return false;
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
  return true;
}

// Updates are untrusted: a sample count beyond what the client registered (or
// the cap) would weigh FedAvg at will. A refused update leaves its client
// (and its metrics) out of this round.
RoundUpdates FedDriver::sort_replies(int r, std::map<std::string, Reply>& replies) {
  RoundUpdates out;
  for (auto& [name, rep] : replies) {
    if (!rep.update) {
      if (!rep.failure.empty())
        (client(name).dead ? out.dropped : out.failed).push_back(name + ": " + rep.failure);
      else
        out.dropped.push_back(name + ": no update within --round-timeout " +
                              std::to_string(opts_.round_timeout_s).substr(0, 6) + " s");
      continue;
    }
    const int64_t epochs = opts_.local_epochs;
    const UpdateBounds bounds{param_count_, epochs * registered_samples_.at(name),
                              opts_.max_client_samples > 0 ? epochs * opts_.max_client_samples : -1};
    if (const auto why = refuse_update(*rep.update, bounds)) {
      refuse(why->reason);
      out.rejected.push_back(name + ": " + why->message);
      log(LogLevel::kWarning, "cleave fed: round " + std::to_string(r + 1) + ": rejected the update of " + name + ": " +
                                  why->message + " (" + why->reason + ")");
      continue;
    }
    // The local loss counts as far as the update does.
    if (rep.metrics && std::isfinite(rep.metrics->loss_sum) && rep.metrics->sample_count <= rep.update->samples) {
      out.train_loss_sum += rep.metrics->loss_sum;
      out.train_samples += rep.metrics->sample_count;
    }
    out.updates.push_back(std::move(*rep.update));
  }
  out.acceptable = static_cast<int>(out.updates.size());
  return out;
}

EvalResult FedDriver::evaluate_global() {
  // In slices, keeping the clients' heartbeats going in between.
  double loss = 0, correct = 0;
  int64_t n = 0;
  for (const Dataset& chunk : test_chunks_) {
    EvalResult e = evaluate(*whole_, chunk, 256);
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

void FedDriver::privacy_json(nlohmann::json& out) const {
  const PrivacySpent spent = accountant_.spent(opts_.dp.delta);
  out["epsilon"] = std::isfinite(spent.epsilon) ? nlohmann::json(spent.epsilon) : nlohmann::json();
  out["epsilon_order"] = spent.order;
  out["dp_delta"] = opts_.dp.delta;
  out["dp_noise_multiplier"] = opts_.dp.noise_multiplier;
  out["dp_clip"] = opts_.dp.clip;
  if (opts_.dp.target_epsilon > 0) out["dp_target_epsilon"] = opts_.dp.target_epsilon;
  out["dp_accountant"] = "RDP of the Poisson-sampled Gaussian mechanism, dp-accounting's orders and conversion";
  int64_t clipped = 0;
  for (const auto& rj : out["rounds"]) clipped += rj["dp_clipped_count"].get<int64_t>();
  out["dp_clipped_updates"] = clipped;
}

nlohmann::json FedDriver::result(const nlohmann::json& rounds, Clock::time_point t_start) {
  nlohmann::json out;
  out["mode"] = "fed";
  out["strategy"] = fed_strategy_name(strategy_);
  out["clients"] = opts_.clients;
  out["rounds"] = rounds;
  out["rounds_requested"] = opts_.rounds;
  out["start_round"] = start_round_;
  if (checkpoints_) out["checkpoint_dir"] = checkpoints_->dir();
  if (!resumed_.is_null()) out["resumed"] = resumed_;
  out["local_epochs"] = opts_.local_epochs;
  out["fraction"] = opts_.fraction;
  out["min_clients"] = opts_.min_clients;
  if (strategy_ == FedStrategy::fedprox) out["mu"] = opts_.mu;
  if (strategy_ == FedStrategy::trimmed_mean) out["trim_fraction"] = opts_.trim_fraction;
  if (opts_.max_client_samples > 0) out["max_client_samples"] = opts_.max_client_samples;
  if (opts_.max_update_norm > 0) out["max_update_norm"] = opts_.max_update_norm;
  if (strategy_ == FedStrategy::krum || strategy_ == FedStrategy::multi_krum) out["krum_f"] = opts_.krum_f;
  if (strategy_ == FedStrategy::multi_krum && opts_.krum_m > 0) out["krum_m"] = opts_.krum_m;
  out["stopped_reason"] = stopped_reason_;  // "completed" or "dp_target_epsilon"
  if (opts_.dp.enabled()) privacy_json(out);
  out["model"] = spec_.name;
  out["model_path"] = cfg_.model_path;
  out["dataset"] = test_.name;
  out["test_samples"] = test_.size();
  out["batch"] = cfg_.batch;
  out["seed"] = cfg_.seed;
  out["optimizer"] = ocfg_.to_json();
  out["parameters"] = whole_->param_count();
  out["test_accuracy"] = last_eval_.accuracy;
  out["test_loss"] = last_eval_.loss;
  int64_t rejected_total = 0, clipped_total = 0, down = 0, up = 0;
  for (const auto& rj : rounds) {
    rejected_total += rj["rejected_count"].get<int64_t>();
    clipped_total += rj["clipped_count"].get<int64_t>();
    down += rj["bytes_down"].get<int64_t>();
    up += rj["bytes_up"].get<int64_t>();
  }
  out["rejected_updates"] = rejected_total;
  out["clipped_updates"] = clipped_total;
  out["refused_messages"] = session_->pool().refused_json();  // {reason: count}; {} when nothing was refused
  out["bytes_down"] = down;
  out["bytes_up"] = up;
  out["wall_seconds"] = seconds_since(t_start);
  out["messages_from_clients"] = session_->message_kinds_json(clients_);
  out["devices"] = session_->devices_json(clients_);
  for (auto& d : out["devices"]) {
    const std::string name = d["name"].get<std::string>();
    d["rounds_accepted"] = rounds_accepted_[name];
    d["dead"] = client(name).dead;
  }
  return out;
}

}  // namespace

// A temporary checkpoint directory goes once it holds nothing to resume: after
// the run succeeds, or when it fails before its first round's checkpoint.
nlohmann::json train_federated(const TrainConfig& config, const FedOptions& options) {
  const bool temporary = options.checkpoint_dir_temporary;
  nlohmann::json result;
  try {
    result = FedDriver(config, options).run();
  } catch (...) {
    if (temporary) remove_temporary_checkpoint_dir(options.checkpoint_dir, /*unless_resumable=*/true);
    throw;
  }
  if (temporary) remove_temporary_checkpoint_dir(options.checkpoint_dir, /*unless_resumable=*/false);
  return result;
}

}  // namespace cleave
