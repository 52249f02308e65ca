// tensor.h: float32 tensors living in one device's memory.
//
// A Tensor is a (buffer, element offset, shape) triple. Buffers are owned by
// shared_ptr, so views (for example one layer's weights inside a partition's
// contiguous parameter block) keep their block alive. Tensors are always
// contiguous, row-major; the first dimension is the batch where there is one.
// Host code never dereferences device memory directly: it goes through
// Device::upload / download, or host_data() when the device is host-accessible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cleave {

class Device;
using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for the empty shape, a scalar).
int64_t numel(const Shape& shape);
// "(64, 1, 28, 28)"
std::string shape_str(const Shape& shape);
// The shape of `n` samples of shape `per_sample`: (n, per_sample...).
Shape batched(int64_t n, const Shape& per_sample);

// A block of device memory. `handle` is backend-specific: a host pointer for the
// CPU, a cl_mem for OpenCL, a device pointer for CUDA. Freed by the backend's
// deleter when the last Tensor referring to it goes away.
struct Buffer {
  Device* device = nullptr;
  void* handle = nullptr;
  size_t bytes = 0;
  std::function<void(Buffer&)> release;  // may be empty (non-owning)
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (release) release(*this);
  }
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates numel(shape) floats on `device` (contents undefined).
  Tensor(Device& device, Shape shape);
  // A view of `shape` starting `offset` elements into `base`'s buffer.
  // Throws std::out_of_range when the view does not fit.
  static Tensor view(const Tensor& base, int64_t offset, Shape shape);
  // A tensor over caller-owned host memory on a host-accessible device.
  static Tensor wrap_host(Device& device, float* data, Shape shape);

  bool defined() const { return buffer_ != nullptr; }
  Device& device() const { return *buffer_->device; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return cleave::numel(shape_); }
  size_t bytes() const { return static_cast<size_t>(numel()) * sizeof(float); }
  // Element offset of this tensor inside its buffer.
  int64_t offset() const { return offset_; }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  void* handle() const { return buffer_ ? buffer_->handle : nullptr; }

  // Same buffer, new shape with the same number of elements.
  Tensor reshaped(Shape shape) const;
  // Host pointer to element 0; only valid on host-accessible devices (throws otherwise).
  float* host_data() const;

  // Copies to / from host memory through the device (works on every backend).
  std::vector<float> to_host() const;
  void from_host(const float* src) const;
  void from_host(const std::vector<float>& src) const;

 private:
  std::shared_ptr<Buffer> buffer_;
  int64_t offset_ = 0;
  Shape shape_;
};

}  // namespace cleave
