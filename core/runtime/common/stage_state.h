// stage_state.h: a pipeline stage's training state on the wire, so that a
// distributed `cleave train` can --save, --load and --init like a local one.
//
// One WeightsMsg carries it: `stage`, `round` = the optimizer steps taken, and one
// payload frame [params | optimizer buffer 0 | buffer 1 ...], every block the
// stage's parameter count long, buffers in optimizer_state_names() order. A
// frame of the parameters alone is weights only (--init, or the weights the
// coordinator gathers to evaluate): the optimizer state is left as it is.
//
// The stages' blocks, in stage order, concatenate to the whole model's blocks,
// so a distributed checkpoint is the same file as a local one (train_checkpoint.h)
// and either kind resumes the other.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/model_spec.h"
#include "core/pipeline/stage.h"
#include "core/train/train_checkpoint.h"
#include "core/train/train_config.h"
#include "transport/message.h"

namespace cleave {

struct StageState {
  int stage = 0;
  int64_t steps_taken = 0;
  std::vector<float> params;
  std::vector<std::vector<float>> buffers;  // empty: weights only
};

transport::Message stage_state_message(const StageState& state, uint64_t request_id);
// Reads a stage state message for a stage of `param_count` parameters whose
// optimizer keeps `buffer_count` buffers. Throws std::invalid_argument when the
// message is not one or its frame has another size.
StageState read_stage_state(const transport::Message& message, int64_t param_count, size_t buffer_count);

// The stage's parameters, and with `with_optimizer` its optimizer state too.
StageState capture_stage_state(Stage& stage, bool with_optimizer);
// Puts a state into the stage (its optimizer too when the state has buffers).
// Throws std::invalid_argument when it does not fit; the stage is unchanged then.
void restore_stage_state(Stage& stage, const StageState& state);

// Parameters per stage for stages split at `bounds` (layer indices, first 0,
// last the layer count): where each stage's blocks lie in the whole model's.
std::vector<int64_t> stage_param_counts(const ModelSpec& spec, const std::vector<int>& bounds);

// What a distributed run starts from: the checkpoint of --load (position, weights
// and optimizer state), the weights of --init, or nothing (every daemon
// initialises its layers from the seed: stages is empty).
struct StartingPoint {
  TrainPosition position;
  std::vector<StageState> stages;  // in stage order
};
// Reads cfg.load_path or cfg.init_path and cuts it into the stages at `bounds`,
// checking it against the model, the batch size and the optimizer first.
// Throws std::runtime_error naming the file and what does not match.
StartingPoint read_starting_point(const TrainConfig& cfg, const ModelSpec& spec, const OptimizerConfig& optimizer,
                                  const std::vector<int>& bounds);

// The whole model's checkpoint (train_checkpoint.h) from every stage's state,
// in stage order, with the optimizer's buffers.
TrainingState assemble_training_state(const TrainConfig& cfg, const ModelSpec& spec, const OptimizerConfig& optimizer,
                                      const TrainPosition& position, const std::vector<StageState>& stages);

}  // namespace cleave
