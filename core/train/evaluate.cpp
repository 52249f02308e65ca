// evaluate.cpp: see evaluate.h.
#include "core/train/evaluate.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/nn/loss.h"

namespace cleave {

EvalResult evaluate(Partition& model, const Dataset& data, int64_t batch, const std::function<void()>& between) {
  if (batch <= 0) throw std::invalid_argument("evaluation batch must be positive, got " + std::to_string(batch));
  EvalResult r;
  Device& dev = model.device();
  const Shape in = model.input_shape();
  const int64_t in_floats = numel(in);
  const Shape out = model.output_shape();
  const Shape target = target_shape(model.spec().loss, out);  // per sample
  const int64_t target_floats = numel(target);
  if (data.size() > 0 && data.target_numel() != target_floats)
    throw std::invalid_argument("evaluate: dataset '" + data.name + "' has " + std::to_string(data.target_numel()) +
                                " target value(s) per sample, the model's loss takes " + std::to_string(target_floats));
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < data.size(); start += batch) {
    const int64_t n = std::min(batch, data.size() - start);
    Shape xs = in;
    xs.insert(xs.begin(), n);
    Tensor x(dev, xs);
    Tensor t(dev, batched(n, target));
    if (data.text) {  // windows made from the bytes
      std::vector<float> hx(static_cast<size_t>(n * in_floats)), hy(static_cast<size_t>(n * target_floats));
      for (int64_t k = 0; k < n; ++k) data.copy_sample(start + k, hx.data() + k * in_floats, hy.data() + k * target_floats);
      x.from_host(hx.data());
      t.from_host(hy.data());
    } else {
      x.from_host(data.x.data() + start * in_floats);
      t.from_host(data.y.data() + start * target_floats);
    }
    Tensor y = model.forward(x, /*microbatch=*/-1, /*training=*/false);
    Tensor dy(dev, y.shape());
    LossResult lr = compute_loss(dev, model.spec().loss, y, t, dy, 1.0f);
    loss_sum += lr.loss_sum;
    correct += lr.correct;
    if (between) between();
  }
  r.samples = data.size();
  if (r.samples > 0) {
    r.loss = loss_sum / static_cast<double>(r.samples);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(r.samples);
  }
  return r;
}

}  // namespace cleave
