// stage.cpp: the schedule executor; see stage.h.
#include "core/pipeline/stage.h"

#include <stdexcept>

#include "core/nn/loss.h"
#include "core/util/rng.h"

namespace cleave {

Stage::Stage(Device& device, const ModelSpec& spec, int begin, int end, int index, int count,
             const OptimizerConfig& optimizer)
    : partition_(device, spec, begin, end),
      optimizer_(device, optimizer, partition_.param_count()),
      index_(index),
      count_(count) {
  partition_.zero_grad();
}

StepMetrics Stage::run(const std::vector<Action>& actions, StageIO& io, int64_t step, int64_t batch_size,
                       uint64_t seed, StageTracer* tracer) {
  Device& dev = partition_.device();
  StepMetrics metrics;
  std::map<int, Tensor> inputs, outputs, grads_in, grads_out;
  const float grad_scale = 1.0f / static_cast<float>(batch_size);
  auto timed = [&](const char* name, int mb, auto&& fn) {
    const double t0 = tracer ? tracer->now_us() : 0;
    fn();
    if (tracer) tracer->add(name, step, mb, t0, tracer->now_us());
  };
  for (const Action& a : actions) {
    const int mb = a.microbatch;
    switch (a.kind) {
      case ActionKind::receive_activation:
        timed("receive", mb, [&] { inputs[mb] = io.receive_input(step, mb); });
        break;
      case ActionKind::forward:
        timed("forward", mb, [&] {
          Tensor y = partition_.forward(inputs.at(mb), mb, /*training=*/true, derive_seed(seed, step, mb));
          inputs.erase(mb);
          if (is_last()) {
            Tensor targets = io.receive_targets(step, mb);
            Tensor dy(dev, y.shape());
            LossResult r = compute_loss(dev, partition_.spec().loss, y, targets, dy, grad_scale);
            metrics.loss_sum += r.loss_sum;
            metrics.correct += r.correct;
            metrics.samples += y.dim(0);
            grads_in[mb] = dy;
          } else {
            outputs[mb] = y;
          }
        });
        break;
      case ActionKind::send_activation:
        timed("send", mb, [&] {
          io.send_output(step, mb, outputs.at(mb));
          outputs.erase(mb);
        });
        break;
      case ActionKind::receive_gradient:
        if (!is_last()) timed("receive", mb, [&] { grads_in[mb] = io.receive_output_grad(step, mb); });
        break;
      case ActionKind::backward:
      case ActionKind::backward_input: {
        const bool whole = a.kind == ActionKind::backward;
        timed(whole ? "backward" : "B", mb, [&] {
          const Tensor& dy = grads_in.at(mb);
          Tensor dx = whole ? partition_.backward(dy, mb, /*need_dx=*/!is_first())
                            : partition_.backward_input(dy, mb, /*need_dx=*/!is_first());
          grads_in.erase(mb);
          if (!is_first()) grads_out[mb] = dx;
        });
        break;
      }
      case ActionKind::backward_weight:
        timed("W", mb, [&] { partition_.backward_weight(mb); });
        break;
      case ActionKind::send_gradient:
        timed("send", mb, [&] {
          io.send_input_grad(step, mb, grads_out.at(mb));
          grads_out.erase(mb);
        });
        break;
      case ActionKind::optimizer_step:
        timed("optimizer", -1, [&] {
          optimizer_.step(partition_.params(), partition_.grads());
          partition_.zero_grad();
        });
        break;
    }
  }
  if (partition_.in_flight() != 0)
    throw std::logic_error("schedule left " + std::to_string(partition_.in_flight()) + " micro-batches in flight");
  return metrics;
}

}  // namespace cleave
