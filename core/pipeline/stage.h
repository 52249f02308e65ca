// stage.h: one pipeline stage — a partition, its optimizer, and the executor
// that runs a schedule's actions for one batch.
//
// Where activations come from and go to is behind StageIO, so the same executor
// runs every stage in one process (tests: queues between threads) or one stage
// per cleaved daemon (tensors over encrypted links). The last stage computes the
// loss, scaled by 1 / batch size, so that the micro-batch gradients add up to
// exactly the gradient one-process training computes for the whole batch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/model/partition.h"
#include "core/optim/optimizer.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/trace.h"

namespace cleave {

// Data movement for one stage. Receives block until the tensor arrives (or
// throw on failure / timeout, with a message naming the peer).
class StageIO {
 public:
  virtual ~StageIO() = default;
  // Stage input of micro-batch mb: samples (first stage) or the previous stage's output.
  virtual Tensor receive_input(int64_t step, int mb) = 0;
  // Targets of mb (last stage only): class indices (rows) or regression targets.
  virtual Tensor receive_targets(int64_t step, int mb) = 0;
  virtual void send_output(int64_t step, int mb, const Tensor& y) = 0;
  // Gradient of this stage's output for mb, from the next stage.
  virtual Tensor receive_output_grad(int64_t step, int mb) = 0;
  virtual void send_input_grad(int64_t step, int mb, const Tensor& dx) = 0;
};

struct StepMetrics {
  double loss_sum = 0;   // summed over the batch's samples (last stage only)
  int64_t correct = 0;   // cross-entropy only
  int64_t samples = 0;
};

class Stage {
 public:
  // Layers [begin, end) of `spec` as stage `index` of `count`.
  Stage(Device& device, const ModelSpec& spec, int begin, int end, int index, int count,
        const OptimizerConfig& optimizer);

  Partition& partition() { return partition_; }
  Optimizer& optimizer() { return optimizer_; }
  int index() const { return index_; }
  int count() const { return count_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == count_ - 1; }

  // Runs `actions` for one batch of `batch_size` samples. `seed` is the run's
  // seed (dropout masks use derive_seed(seed, step, mb), as local training does).
  // Returns the loss metrics on the last stage (zeros elsewhere).
  StepMetrics run(const std::vector<Action>& actions, StageIO& io, int64_t step, int64_t batch_size,
                  uint64_t seed, StageTracer* tracer = nullptr);

 private:
  Partition partition_;
  Optimizer optimizer_;
  int index_, count_;
};

}  // namespace cleave
