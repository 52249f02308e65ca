// loss.cpp: cross-entropy and MSE through the device's loss ops; per-row values are
// summed on the host in double precision. Labels are checked on the host before
// any device op sees them.
#include "core/nn/loss.h"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace cleave {

namespace {

// A sequence output (rows, positions, classes) under cross-entropy is scored at
// every position: positions > 1, and the device ops see rows * positions rows.
struct Dims {
  int64_t rows, cols;
  int64_t positions = 1;
};

Dims check_shapes(LossKind kind, const Tensor& output, const Tensor& targets, const Tensor* doutput) {
  const char* name = kind == LossKind::cross_entropy ? "cross_entropy" : "mse";
  if (!output.defined() || output.rank() < 1 || output.dim(0) < 1 || output.numel() < 1)
    throw std::invalid_argument(std::string(name) + ": output must be (rows, ...) with rows >= 1, got " +
                                (output.defined() ? shape_str(output.shape()) : std::string("an undefined tensor")));
  const int64_t rows = output.dim(0);
  Dims dims{rows, output.numel() / rows};
  if (!targets.defined()) throw std::invalid_argument(std::string(name) + ": targets are undefined");
  if (kind == LossKind::cross_entropy && output.rank() == 3) {
    dims = Dims{rows, output.dim(2), output.dim(1)};
    if (targets.rank() != 2 || targets.dim(0) != rows || targets.dim(1) != dims.positions)
      throw std::invalid_argument("cross_entropy: targets must be (" + std::to_string(rows) + ", " +
                                  std::to_string(dims.positions) + ") class indices for output " +
                                  shape_str(output.shape()) + ", got " + shape_str(targets.shape()));
  } else if (kind == LossKind::cross_entropy) {
    if (targets.rank() < 1 || targets.dim(0) != rows || targets.numel() != rows)
      throw std::invalid_argument("cross_entropy: targets must be (" + std::to_string(rows) +
                                  ") class indices for output " + shape_str(output.shape()) + ", got " +
                                  shape_str(targets.shape()));
  } else if (targets.shape() != output.shape()) {
    throw std::invalid_argument("mse: targets " + shape_str(targets.shape()) + " must have the output's shape " +
                                shape_str(output.shape()));
  }
  if (doutput && (!doutput->defined() || doutput->shape() != output.shape()))
    throw std::invalid_argument(std::string(name) + ": doutput must have the output's shape " +
                                shape_str(output.shape()) + ", got " +
                                (doutput->defined() ? shape_str(doutput->shape()) : std::string("an undefined tensor")));
  return dims;
}

// Every label must be an integer in [0, classes).
void check_labels(const Tensor& targets, int64_t classes) {
  const std::vector<float> labels = targets.to_host();
  for (size_t r = 0; r < labels.size(); ++r) {
    const float v = labels[r];
    if (!std::isfinite(v) || std::floor(v) != v || v < 0 || v >= static_cast<float>(classes)) {
      std::ostringstream msg;
      msg << "cross_entropy: label " << v << " at row " << r << " is not a class index in [0, " << classes << ")";
      throw std::invalid_argument(msg.str());
    }
  }
}

double host_sum(const Tensor& t) {
  double s = 0;
  for (float v : t.to_host()) s += v;
  return s;
}

LossResult run(Device& device, LossKind kind, const Tensor& output, const Tensor& targets, const Tensor& doutput,
               float grad_scale, Dims dims) {
  LossResult result;
  // A sample's loss is the mean over its positions (one position unless a sequence).
  const int64_t rows = dims.rows * dims.positions;
  const double per_position = 1.0 / static_cast<double>(dims.positions);
  Tensor per_row(device, {rows});  // (rows)
  if (kind == LossKind::cross_entropy) {
    check_labels(targets, dims.cols);
    device.softmax_xent(output, targets, per_row, doutput, rows, dims.cols,
                        static_cast<float>(grad_scale * per_position));
    Tensor correct(device, {rows});  // (rows) 1 where argmax == label
    device.argmax_match(output, targets, correct, rows, dims.cols);
    // correct positions / positions: a count of samples' worth, so correct / samples is an accuracy
    result.correct = static_cast<int64_t>(std::llround(host_sum(correct) * per_position));
  } else {
    device.mse(output, targets, per_row, doutput, rows, dims.cols, grad_scale);
  }
  result.loss_sum = host_sum(per_row) * per_position;
  return result;
}

}  // namespace

LossResult compute_loss(Device& device, LossKind kind, const Tensor& output, const Tensor& targets,
                        const Tensor& doutput, float grad_scale) {
  const Dims dims = check_shapes(kind, output, targets, &doutput);
  return run(device, kind, output, targets, doutput, grad_scale, dims);
}

Shape target_shape(LossKind kind, const Shape& output) {
  if (kind == LossKind::mse) return output;
  return output.size() == 2 ? Shape{output[0]} : Shape{};
}

LossResult evaluate_loss(Device& device, LossKind kind, const Tensor& output, const Tensor& targets) {
  const Dims dims = check_shapes(kind, output, targets, nullptr);
  Tensor scratch(device, output.shape());  // gradient written by the device op, then dropped
  return run(device, kind, output, targets, scratch, 0.0f, dims);
}

}  // namespace cleave
