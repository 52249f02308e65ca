// wire.cpp: see wire.h.
#include "core/runtime/common/wire.h"

#include <chrono>
#include <stdexcept>

#include "core/io/untrusted_json.h"
#include "device/device.h"

namespace cleave {

transport::TensorMessage to_message(const Tensor& t, transport::TensorKind kind, int64_t step, int mb) {
  if (t.device().host_accessible()) {
    std::shared_ptr<const void> owner = t.buffer();
    return transport::TensorMessage::borrow(kind, step, mb, t.shape(), t.host_data(),
                                            static_cast<size_t>(t.numel()), owner);
  }
  return transport::TensorMessage::from_vector(kind, step, mb, t.shape(), t.to_host());
}

Tensor from_message(Device& device, const transport::TensorMessage& m) {
  Tensor t(device, m.shape);
  if (static_cast<size_t>(t.numel()) != m.count)
    throw std::runtime_error("tensor message holds " + std::to_string(m.count) + " values for shape " +
                             shape_str(m.shape));
  t.from_host(m.data);
  return t;
}

transport::OptimizerSpec to_wire(const OptimizerConfig& c) {
  transport::OptimizerSpec o;
  o.kind = c.kind;
  o.lr = c.lr;
  o.momentum = c.momentum;
  o.dampening = c.dampening;
  o.weight_decay = c.weight_decay;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.nesterov = c.nesterov;
  o.schedule = c.schedule;
  o.step_size = c.step_size;
  o.gamma = c.gamma;
  o.warmup_steps = c.warmup_steps;
  o.total_steps = c.total_steps;
  o.min_lr = c.min_lr;
  return o;
}

OptimizerConfig from_wire(const transport::OptimizerSpec& o) {
  OptimizerConfig c;
  c.kind = o.kind;
  c.lr = o.lr;
  c.momentum = o.momentum;
  c.dampening = o.dampening;
  c.weight_decay = o.weight_decay;
  c.beta1 = o.beta1;
  c.beta2 = o.beta2;
  c.eps = o.eps;
  c.nesterov = o.nesterov;
  c.schedule = o.schedule;
  c.step_size = o.step_size;
  c.gamma = o.gamma;
  c.warmup_steps = o.warmup_steps;
  c.total_steps = o.total_steps;
  c.min_lr = o.min_lr;
  c.validate();
  return c;
}

// The wire's Schedule enum (transport/schema/cleave.fbs): GPipe 0, OneFOneB 1, ZB1 2.
uint8_t schedule_to_wire(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe: return 0;
    case ScheduleKind::one_f_one_b: return 1;
    case ScheduleKind::zb1: return 2;
  }
  throw std::invalid_argument("schedule_to_wire: not a schedule");
}

ScheduleKind schedule_from_wire(uint8_t value) {
  switch (value) {
    case 0: return ScheduleKind::gpipe;
    case 1: return ScheduleKind::one_f_one_b;
    case 2: return ScheduleKind::zb1;
  }
  throw std::invalid_argument("unknown pipeline schedule " + std::to_string(value) +
                              " (this daemon knows 0 gpipe, 1 1f1b, 2 zb1)");
}

ModelSpec parse_model_text(const std::string& json_text, const std::string& what) {
  nlohmann::json j;
  try {
    j = parse_untrusted_json(json_text, kFileJsonLimits, what);  // a model file's limits, checked before parsing
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  return ModelSpec::parse(j, what);
}

double monotonic_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace cleave
