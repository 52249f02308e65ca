// wire.h: conversions between device tensors and transport messages, shared by
// the daemon and the coordinator.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "device/tensor.h"
#include "transport/link.h"
#include "transport/message.h"

namespace cleave {

// A TensorMessage over `t`'s data: zero-copy (the buffer is kept alive by the
// message) when the device is host-accessible, else a host copy.
transport::TensorMessage to_message(const Tensor& t, transport::TensorKind kind, int64_t step, int mb);
// A new tensor on `device` holding the message's values.
Tensor from_message(Device& device, const transport::TensorMessage& m);

// A control message {"op": op, ...args}.
transport::Message control(transport::ControlCommand command, const nlohmann::json& argument);
// The control's argument JSON ({} when empty); throws std::runtime_error when it is not JSON.
nlohmann::json control_argument(const transport::ControlMsg& c);

// Microseconds on CLOCK_MONOTONIC: comparable between processes of one machine,
// so stage traces from several daemons line up on one timeline.
double monotonic_us();

}  // namespace cleave
