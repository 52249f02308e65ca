// wire.cpp: see wire.h.
#include "core/runtime/common/wire.h"

#include <chrono>
#include <stdexcept>

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

transport::Message control(transport::ControlCommand command, const nlohmann::json& argument) {
  transport::ControlMsg c;
  c.command = command;
  c.argument_json = argument.dump();
  transport::Message m;
  m.body = c;
  return m;
}

nlohmann::json control_argument(const transport::ControlMsg& c) {
  if (c.argument_json.empty()) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(c.argument_json);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("control argument is not JSON: ") + e.what());
  }
}

double monotonic_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace cleave
