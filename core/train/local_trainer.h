// local_trainer.h: training in one process (`cleave train --local`).
//
// The reference every distributed mode is compared against: same batches (seeded
// loader), same initialisation (Partition::init), same loss scaling (mean over
// the batch, so micro-batches add up exactly), same optimizer. Each step is
// one train_step (train_step.h).
#pragma once

#include <nlohmann/json.hpp>

#include "core/train/train_config.h"

namespace cleave {

// Runs the whole job described by `config` and returns the result JSON:
// mode, model, epochs, steps, losses (one per step), test_accuracy, test_loss,
// samples_per_sec, wall_seconds, plus backend/device/optimizer details,
// estimated_memory_bytes (the memory model's estimate, core/planner/
// memory_model.h, of the whole model as one stage on the chosen device) and
// peak_memory_bytes (what the device held at most; 0 where it cannot tell).
// Throws std::runtime_error with a clear message for bad input (missing files,
// bad model, checkpoint mismatch), and OutOfMemory, before allocating anything,
// when the estimate exceeds the device's free memory.
nlohmann::json train_local(const TrainConfig& config);

}  // namespace cleave
