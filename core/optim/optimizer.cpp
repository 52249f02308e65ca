// optimizer.cpp: OptimizerConfig parsing/validation and the Optimizer driver.
#include "core/optim/optimizer.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace cleave {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  for (const auto& e : v)
    if (e == x) return true;
  return false;
}

std::string num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument("optimizer: " + what); }

float get_float(const nlohmann::json& j, const char* key) {
  const auto& v = j.at(key);
  if (!v.is_number()) invalid(std::string(key) + ": expected a number, got " + v.dump());
  return v.get<float>();
}

int64_t get_int(const nlohmann::json& j, const char* key) {
  const auto& v = j.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  invalid(std::string(key) + ": expected an integer, got " + v.dump());
}

}  // namespace

std::vector<std::string> optimizer_kinds() { return {"sgd", "adam", "adamw"}; }
std::vector<std::string> lr_schedules() { return {"constant", "step", "cosine"}; }

nlohmann::json OptimizerConfig::to_json() const {
  return {{"kind", kind},           {"lr", lr},
          {"momentum", momentum},   {"dampening", dampening},
          {"weight_decay", weight_decay}, {"beta1", beta1},
          {"beta2", beta2},         {"eps", eps},
          {"nesterov", nesterov},   {"schedule", schedule},
          {"step_size", step_size}, {"gamma", gamma},
          {"warmup_steps", warmup_steps}, {"total_steps", total_steps},
          {"min_lr", min_lr}};
}

OptimizerConfig OptimizerConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) invalid("expected a JSON object, got " + j.dump());
  static const std::vector<std::string> kKeys = {
      "kind", "lr", "momentum", "dampening", "weight_decay", "beta1", "beta2", "eps",
      "nesterov", "schedule", "step_size", "gamma", "warmup_steps", "total_steps", "min_lr"};
  for (const auto& [key, value] : j.items()) {
    if (!contains(kKeys, key)) invalid("unknown field '" + key + "' (known: " + join(kKeys) + ")");
  }
  OptimizerConfig c;
  auto str = [&](const char* key, std::string& out) {
    if (!j.contains(key)) return;
    if (!j.at(key).is_string()) invalid(std::string(key) + ": expected a string, got " + j.at(key).dump());
    out = j.at(key).get<std::string>();
  };
  auto flt = [&](const char* key, float& out) {
    if (j.contains(key)) out = get_float(j, key);
  };
  auto integer = [&](const char* key, int64_t& out) {
    if (j.contains(key)) out = get_int(j, key);
  };
  str("kind", c.kind);
  str("schedule", c.schedule);
  flt("lr", c.lr);
  flt("momentum", c.momentum);
  flt("dampening", c.dampening);
  flt("weight_decay", c.weight_decay);
  flt("beta1", c.beta1);
  flt("beta2", c.beta2);
  flt("eps", c.eps);
  flt("gamma", c.gamma);
  flt("min_lr", c.min_lr);
  integer("step_size", c.step_size);
  integer("warmup_steps", c.warmup_steps);
  integer("total_steps", c.total_steps);
  if (j.contains("nesterov")) {
    if (!j.at("nesterov").is_boolean()) invalid("nesterov: expected true or false, got " + j.at("nesterov").dump());
    c.nesterov = j.at("nesterov").get<bool>();
  }
  c.validate();
  return c;
}

void OptimizerConfig::validate() const {
  if (!contains(optimizer_kinds(), kind))
    invalid("unknown kind '" + kind + "' (valid: " + join(optimizer_kinds()) + ")");
  if (!contains(lr_schedules(), schedule))
    invalid("unknown schedule '" + schedule + "' (valid: " + join(lr_schedules()) + ")");
  if (!std::isfinite(lr) || lr <= 0) invalid("lr must be > 0 (got " + num(lr) + ")");
  if (!std::isfinite(weight_decay) || weight_decay < 0)
    invalid("weight_decay must be >= 0 (got " + num(weight_decay) + ")");
  if (kind == "sgd") {
    if (!(momentum >= 0 && momentum < 1)) invalid("momentum must be in [0, 1) (got " + num(momentum) + ")");
    if (!(dampening >= 0 && dampening <= 1)) invalid("dampening must be in [0, 1] (got " + num(dampening) + ")");
    if (nesterov && (momentum <= 0 || dampening != 0))
      invalid("nesterov needs momentum > 0 and dampening = 0 (got momentum " + num(momentum) + ", dampening " +
              num(dampening) + ")");
  } else {
    if (!(beta1 >= 0 && beta1 < 1)) invalid("beta1 must be in [0, 1) (got " + num(beta1) + ")");
    if (!(beta2 >= 0 && beta2 < 1)) invalid("beta2 must be in [0, 1) (got " + num(beta2) + ")");
    if (!std::isfinite(eps) || eps <= 0) invalid("eps must be > 0 (got " + num(eps) + ")");
  }
  if (warmup_steps < 0) invalid("warmup_steps must be >= 0 (got " + std::to_string(warmup_steps) + ")");
  if (schedule == "step") {
    if (step_size <= 0) invalid("step schedule: step_size must be > 0 (got " + std::to_string(step_size) + ")");
    if (!(gamma > 0 && gamma <= 1)) invalid("step schedule: gamma must be in (0, 1] (got " + num(gamma) + ")");
  }
  if (schedule == "cosine") {
    if (total_steps <= 0)
      invalid("cosine schedule needs total_steps > 0 (the number of optimizer steps of the run; got " +
              std::to_string(total_steps) + ")");
    if (warmup_steps >= total_steps)
      invalid("cosine schedule: warmup_steps (" + std::to_string(warmup_steps) + ") must be < total_steps (" +
              std::to_string(total_steps) + ")");
    if (!(min_lr >= 0 && min_lr <= lr))
      invalid("cosine schedule: min_lr must be in [0, lr] (got " + num(min_lr) + ", lr " + num(lr) + ")");
  }
}

Optimizer::Optimizer(Device& device, OptimizerConfig config, int64_t param_count)
    : device_(&device), config_(std::move(config)), param_count_(param_count) {
  config_.validate();
  if (param_count_ < 0) invalid("param_count must be >= 0 (got " + std::to_string(param_count_) + ")");
  const int buffers = optimizer_state_count(config_);
  if (param_count_ == 0) return;  // nothing to optimise: step() is a no-op count
  for (int i = 0; i < buffers; ++i) {
    Tensor t(*device_, {param_count_});
    device_->fill(t, 0.f);
    state_.push_back(std::move(t));
  }
}

float Optimizer::current_lr() const { return learning_rate(config_, steps_); }

void Optimizer::step(const Tensor& params, const Tensor& grads) {
  if (param_count_ > 0) {
    if (!params.defined() || !grads.defined()) invalid("step: params and grads must be allocated tensors");
    if (params.numel() != param_count_ || grads.numel() != param_count_)
      invalid("step: expected " + std::to_string(param_count_) + " parameters and gradients, got " +
              std::to_string(params.numel()) + " and " + std::to_string(grads.numel()));
    if (&params.device() != device_ || &grads.device() != device_)
      invalid("step: params and grads must live on the optimizer's device (" + device_->name() + ")");
    const float lr = current_lr();
    if (config_.kind == "sgd") {
      SgdStep s;
      s.lr = lr;
      s.momentum = config_.momentum;
      s.dampening = config_.dampening;
      s.weight_decay = config_.weight_decay;
      s.nesterov = config_.nesterov;
      s.first = steps_ == 0;
      device_->sgd_step(params, grads, state_.empty() ? Tensor() : state_[0], s);
    } else {
      AdamStep s;
      s.lr = lr;
      s.beta1 = config_.beta1;
      s.beta2 = config_.beta2;
      s.eps = config_.eps;
      s.weight_decay = config_.weight_decay;
      s.decoupled = config_.kind == "adamw";
      s.step = steps_ + 1;
      device_->adam_step(params, grads, state_[0], state_[1], s);
    }
  }
  ++steps_;
}

std::vector<Tensor> Optimizer::state() const { return state_; }

std::vector<std::string> Optimizer::state_names() const { return optimizer_state_names(config_); }

nlohmann::json Optimizer::state_meta() const { return optimizer_state_meta(config_, steps_, param_count_); }

void Optimizer::load_state(const nlohmann::json& meta, const std::vector<std::vector<float>>& blocks) {
  const int64_t steps = check_optimizer_state(config_, param_count_, meta, blocks);
  for (size_t i = 0; i < blocks.size(); ++i) state_[i].from_host(blocks[i]);
  steps_ = steps;
}

int optimizer_state_count(const std::string& kind, double momentum) {
  if (kind == "adam" || kind == "adamw") return 2;
  if (kind == "sgd") return momentum != 0 ? 1 : 0;
  throw std::invalid_argument("unknown optimizer '" + kind + "' (use sgd, adam or adamw)");
}

int optimizer_state_count(const OptimizerConfig& config) { return optimizer_state_count(config.kind, config.momentum); }

std::vector<std::string> optimizer_state_names(const OptimizerConfig& config) {
  switch (optimizer_state_count(config)) {
    case 0: return {};
    case 1: return {"momentum_buffer"};
    default: return {"exp_avg", "exp_avg_sq"};
  }
}

nlohmann::json optimizer_state_meta(const OptimizerConfig& config, int64_t steps_taken, int64_t param_count) {
  return {{"kind", config.kind},
          {"steps_taken", steps_taken},
          {"param_count", param_count},
          {"buffers", optimizer_state_names(config)},
          {"config", config.to_json()}};
}

int64_t check_optimizer_state(const OptimizerConfig& config, int64_t param_count, const nlohmann::json& meta,
                              const std::vector<std::vector<float>>& blocks) {
  const auto field = [&](const char* key) -> const nlohmann::json& {
    if (!meta.is_object() || !meta.contains(key))
      invalid("load_state: optimizer state has no '" + std::string(key) + "' field");
    return meta.at(key);
  };
  const auto& kind = field("kind");
  if (!kind.is_string() || kind.get<std::string>() != config.kind)
    invalid("load_state: the checkpoint holds " + kind.dump() + " optimizer state but this optimizer is '" +
            config.kind + "'");
  const auto& steps = field("steps_taken");
  if (!steps.is_number_integer() || steps.get<int64_t>() < 0)
    invalid("load_state: steps_taken must be an integer >= 0, got " + steps.dump());
  const auto& count = field("param_count");
  if (!count.is_number_integer() || count.get<int64_t>() != param_count)
    invalid("load_state: the checkpoint's optimizer state is for " + count.dump() +
            " parameters, this model has " + std::to_string(param_count));
  const auto& buffers = field("buffers");
  const std::vector<std::string> names = optimizer_state_names(config);
  if (!buffers.is_array() || buffers != nlohmann::json(names))
    invalid("load_state: the checkpoint's optimizer buffers are " + buffers.dump() + ", this optimizer needs " +
            nlohmann::json(names).dump() + " (was momentum changed?)");
  const size_t expected = param_count > 0 ? names.size() : 0;
  if (blocks.size() != expected)
    invalid("load_state: expected " + std::to_string(expected) + " state blocks, got " +
            std::to_string(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (static_cast<int64_t>(blocks[i].size()) != param_count)
      invalid("load_state: state block '" + names[i] + "' has " + std::to_string(blocks[i].size()) +
              " floats, expected " + std::to_string(param_count));
  }
  return steps.get<int64_t>();
}

}  // namespace cleave
