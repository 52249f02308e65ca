// spec_fields.h: strict reading of a layer's JSON fields, shape checks (internal to core/nn and core/model).
//
// Every layer constructor reads its fields through SpecFields, which checks the
// JSON type and range of each field and, at the end, rejects fields the layer
// does not know. Each error is a std::invalid_argument naming the field, so
// ModelSpec can prefix it with "FILE: layer I (TYPE): ".
#pragma once

#include <array>
#include <initializer_list>
#include <stdexcept>
#include <cstdint>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "device/device.h"

namespace cleave::nn_detail {

// Largest value accepted for any integer field (keeps products of sizes in int64).
inline constexpr int64_t kMaxField = int64_t{1} << 30;

// Largest element count accepted for a per-sample shape or a parameter tensor, so
// that products with the batch size stay far from int64 overflow.
inline constexpr int64_t kMaxElements = int64_t{1} << 40;

// Throws std::invalid_argument "WHAT: N elements is too large" when the product of
// `factors` exceeds kMaxElements (computed without overflow).
void check_elements(const std::string& what, std::initializer_list<int64_t> factors);
inline void check_elements(const std::string& what, const Shape& shape) {
  long double p = 1;
  for (int64_t f : shape) p *= static_cast<long double>(f);
  if (p > static_cast<long double>(kMaxElements))
    throw std::invalid_argument(what + " " + shape_str(shape) + " is too large (more than 2^40 elements)");
}

class SpecFields {
 public:
  // `spec` must be a JSON object with a string "type" (checked by make_layer).
  explicit SpecFields(const nlohmann::json& spec);

  // An integer field >= min_value; `fallback` when absent (throws when absent and required).
  int64_t integer(const std::string& name, int64_t min_value);
  int64_t integer(const std::string& name, int64_t min_value, int64_t fallback);
  // An integer or [a, b] pair of integers >= min_value ("kernel": 3 or [3, 5]).
  std::array<int64_t, 2> pair(const std::string& name, int64_t min_value);
  std::array<int64_t, 2> pair(const std::string& name, int64_t min_value, std::array<int64_t, 2> fallback);
  bool has(const std::string& name) const { return spec_.contains(name); }
  bool boolean(const std::string& name, bool fallback);
  // A finite number in [lo, hi) (hi_inclusive switches to [lo, hi]).
  double number(const std::string& name, double fallback, double lo, double hi, bool hi_inclusive);
  // A string field that must be one of `options`; `fallback` when absent.
  std::string choice(const std::string& name, const std::string& fallback, std::initializer_list<const char*> options);
  // Throws naming the first field that was never read.
  void reject_unknown() const;

 private:
  int64_t to_int(const std::string& name, const nlohmann::json& v, int64_t min_value) const;
  const nlohmann::json& spec_;
  std::set<std::string> read_{"type"};  // fields present and consumed
  std::set<std::string> known_;         // every field name asked for
};

// "3" for a square window, "3x5" otherwise.
std::string hw_str(int64_t h, int64_t w);
// Throws std::invalid_argument unless x is (batch, per_sample...) for some batch >= 1.
void check_batch_shape(const char* what, const Tensor& x, const Shape& per_sample);
// Window geometry (batch 0) of a conv / pooling layer over a per-sample input
// (channels, height, width); throws naming the field when the input has the wrong
// rank or the kernel is larger than the padded input.
Window2d make_window(const std::string& layer, const Shape& in, std::array<int64_t, 2> kernel,
                     std::array<int64_t, 2> stride, std::array<int64_t, 2> padding);
// (batch, per_sample...)
Shape with_batch(int64_t batch, const Shape& per_sample);

}  // namespace cleave::nn_detail
