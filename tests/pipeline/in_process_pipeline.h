// in_process_pipeline.h: every stage of a pipeline in one process, one thread
// per stage, for tests. Tensors cross between stages as host copies, as they do
// between daemons: the sender downloads what it sends (and may free it right
// after), the receiver uploads it onto its own device. So each stage may live on
// a device of its own and the tensors it holds are the ones a daemon would hold.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/pipeline/schedule.h"
#include "core/pipeline/stage.h"
#include "core/pipeline/trace.h"
#include "core/train/train_config.h"

namespace cleave::testing {

// A tensor in transit: its shape (with the batch dimension) and its values.
struct HostTensor {
  Shape shape;
  std::vector<float> values;
};

inline HostTensor to_host_tensor(const Tensor& t) { return {t.shape(), t.to_host()}; }

inline Tensor to_device(Device& device, const HostTensor& h) {
  Tensor t(device, h.shape);
  t.from_host(h.values);
  return t;
}

// A blocking queue of host tensors keyed by (step, micro-batch). take() throws
// once fail() was called, so that one stage's error ends every stage's wait.
class Mailbox {
 public:
  void put(int64_t step, int mb, HostTensor t) {
    std::lock_guard<std::mutex> lock(mu_);
    items_[{step, mb}] = std::move(t);
    cv_.notify_all();
  }
  HostTensor take(int64_t step, int mb) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return failed_ || items_.count({step, mb}) > 0; });
    if (failed_) throw std::runtime_error("another stage of the pipeline failed");
    HostTensor t = std::move(items_[{step, mb}]);
    items_.erase({step, mb});
    return t;
  }
  void fail() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int64_t, int>, HostTensor> items_;
  bool failed_ = false;
};

// The links of a p-stage pipeline plus its data source.
struct Wires {
  std::vector<Mailbox> acts, grads;  // acts[s]: into stage s; grads[s]: into stage s from s + 1
  Mailbox inputs, targets;           // into the first / the last stage
  explicit Wires(int p) : acts(p), grads(p) {}
  void fail() {
    for (auto& m : acts) m.fail();
    for (auto& m : grads) m.fail();
    inputs.fail();
    targets.fail();
  }
};

// Stage `s` of `p`: receives onto `device` (its stage's device), sends host copies.
class QueueIO : public StageIO {
 public:
  QueueIO(Wires& w, int s, Device& device) : w_(w), s_(s), device_(device) {}
  Tensor receive_input(int64_t step, int mb) override {
    return to_device(device_, s_ == 0 ? w_.inputs.take(step, mb) : w_.acts[s_].take(step, mb));
  }
  Tensor receive_targets(int64_t step, int mb) override { return to_device(device_, w_.targets.take(step, mb)); }
  void send_output(int64_t step, int mb, const Tensor& y) override { w_.acts[s_ + 1].put(step, mb, to_host_tensor(y)); }
  Tensor receive_output_grad(int64_t step, int mb) override { return to_device(device_, w_.grads[s_].take(step, mb)); }
  void send_input_grad(int64_t step, int mb, const Tensor& dx) override {
    w_.grads[s_ - 1].put(step, mb, to_host_tensor(dx));
  }

 private:
  Wires& w_;
  int s_;
  Device& device_;
};

// Splits one batch into `microbatches` (train_config.h's offsets) and puts each
// micro-batch's samples and targets where the first and last stage read them.
// x holds batch samples of `sample` shape, y batch targets of `target` shape
// ({} for class indices).
inline void feed_batch(Wires& w, int64_t step, int microbatches, int64_t batch, const std::vector<float>& x,
                       const Shape& sample, const std::vector<float>& y, const Shape& target = {}) {
  const int64_t xn = numel(sample), yn = numel(target);
  for (int mb = 0; mb < microbatches; ++mb) {
    const int64_t lo = microbatch_offset(batch, microbatches, mb), hi = microbatch_offset(batch, microbatches, mb + 1);
    Shape xs = {hi - lo}, ys = {hi - lo};
    xs.insert(xs.end(), sample.begin(), sample.end());
    ys.insert(ys.end(), target.begin(), target.end());
    w.inputs.put(step, mb, {xs, std::vector<float>(x.begin() + lo * xn, x.begin() + hi * xn)});
    w.targets.put(step, mb, {ys, std::vector<float>(y.begin() + lo * yn, y.begin() + hi * yn)});
  }
}

// Runs batch `step` (already fed into `w`) through every stage, each on its own
// thread with its schedule's actions; returns each stage's metrics. Rethrows
// the first stage error after every thread has stopped. `tracer` records stage
// `traced_stage` when given.
inline std::vector<StepMetrics> run_pipeline_step(const std::vector<Stage*>& stages, Wires& w, ScheduleKind kind,
                                                  int microbatches, int64_t step, int64_t batch, uint64_t seed,
                                                  StageTracer* tracer = nullptr, int traced_stage = -1) {
  const int p = static_cast<int>(stages.size());
  std::vector<StepMetrics> metrics(p);
  std::mutex mu;
  std::exception_ptr first_error;  // the cause; the other stages then fail waiting
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s)
    threads.emplace_back([&, s] {
      try {
        QueueIO io(w, s, stages[s]->partition().device());
        metrics[s] = stages[s]->run(make_schedule(kind, s, p, microbatches), io, step, batch, seed,
                                    s == traced_stage ? tracer : nullptr);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first_error) first_error = std::current_exception();
        }
        w.fail();
      }
    });
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
  return metrics;
}

}  // namespace cleave::testing
