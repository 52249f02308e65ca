// tensor.cpp: shape helpers and the Tensor handle (allocation, views, host copies).
#include "device/tensor.h"

#include <stdexcept>

#include "device/device.h"

namespace cleave {

Shape batched(int64_t n, const Shape& per_sample) {
  Shape s = per_sample;
  s.insert(s.begin(), n);
  return s;
}

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += ")";
  return s;
}

Tensor::Tensor(Device& device, Shape shape) : shape_(std::move(shape)) {
  buffer_ = device.allocate(static_cast<size_t>(cleave::numel(shape_)) * sizeof(float));
}

Tensor Tensor::view(const Tensor& base, int64_t offset, Shape shape) {
  // `offset` counts from base's first element; the view must lie inside base.
  if (!base.defined()) throw std::out_of_range("Tensor::view of an undefined tensor");
  const int64_t n = cleave::numel(shape);
  const int64_t extent = base.numel();
  if (offset < 0 || offset > extent || n > extent - offset)
    throw std::out_of_range("Tensor::view: " + shape_str(shape) + " at element offset " + std::to_string(offset) +
                            " does not fit in a tensor of " + std::to_string(extent) + " elements " +
                            shape_str(base.shape_));
  Tensor t;
  t.buffer_ = base.buffer_;
  t.offset_ = base.offset_ + offset;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::wrap_host(Device& device, float* data, Shape shape) {
  if (!device.host_accessible())
    throw std::logic_error("Tensor::wrap_host: device '" + device.name() + "' is not host-accessible");
  if (data == nullptr && cleave::numel(shape) > 0)
    throw std::invalid_argument("Tensor::wrap_host: null data for shape " + shape_str(shape));
  auto buf = std::make_shared<Buffer>();
  buf->device = &device;
  buf->handle = data;
  buf->bytes = static_cast<size_t>(cleave::numel(shape)) * sizeof(float);
  Tensor t;
  t.buffer_ = std::move(buf);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  if (cleave::numel(shape) != numel())
    throw std::invalid_argument("Tensor::reshaped: cannot reshape " + shape_str(shape_) + " (" +
                                std::to_string(numel()) + " elements) to " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

float* Tensor::host_data() const {
  if (!defined()) throw std::logic_error("Tensor::host_data on an undefined tensor");
  if (!device().host_accessible())
    throw std::logic_error("Tensor::host_data: device '" + device().name() +
                           "' is not host-accessible; use to_host()/from_host()");
  return static_cast<float*>(buffer_->handle) + offset_;
}

std::vector<float> Tensor::to_host() const {
  if (!defined()) throw std::logic_error("Tensor::to_host on an undefined tensor");
  std::vector<float> out(static_cast<size_t>(numel()));
  device().download(*this, out.data());
  return out;
}

void Tensor::from_host(const float* src) const {
  if (!defined()) throw std::logic_error("Tensor::from_host on an undefined tensor");
  device().upload(*this, src);
}

void Tensor::from_host(const std::vector<float>& src) const {
  if (static_cast<int64_t>(src.size()) != numel())
    throw std::invalid_argument("Tensor::from_host: " + std::to_string(src.size()) +
                                " values for a tensor of shape " + shape_str(shape_));
  from_host(src.data());
}

}  // namespace cleave
