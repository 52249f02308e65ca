// wire.h: conversions between device tensors and transport messages, shared by
// the daemon and the coordinator.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"
#include "core/pipeline/schedule.h"
#include "device/tensor.h"
#include "transport/link.h"
#include "transport/message.h"

namespace cleave {

// A TensorMessage over `t`'s data: zero-copy (the buffer is kept alive by the
// message) when the device is host-accessible, else a host copy.
transport::TensorMessage to_message(const Tensor& t, transport::TensorKind kind, int64_t step, int mb);
// A new tensor on `device` holding the message's values.
Tensor from_message(Device& device, const transport::TensorMessage& m);

// The optimizer as it travels, and back (validated: throws std::invalid_argument
// naming the first bad setting).
transport::OptimizerSpec to_wire(const OptimizerConfig& config);
OptimizerConfig from_wire(const transport::OptimizerSpec& spec);
// The pipeline schedule as it travels (PipelineJob::schedule), and back
// (throws std::invalid_argument for a value no schedule has).
uint8_t schedule_to_wire(ScheduleKind kind);
ScheduleKind schedule_from_wire(uint8_t value);

// The model file an assignment or a profile request carries, parsed
// (throws std::runtime_error naming `what` when it is not a valid model).
ModelSpec parse_model_text(const std::string& json_text, const std::string& what);

// Microseconds on CLOCK_MONOTONIC: comparable between processes of one machine,
// so stage traces from several daemons line up on one timeline.
double monotonic_us();

}  // namespace cleave
