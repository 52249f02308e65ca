// spec_fields.cpp: strict JSON field reading for layer specs.
#include "core/nn/spec_fields.h"

#include <cmath>
#include <stdexcept>

namespace cleave::nn_detail {

using nlohmann::json;

namespace {

std::invalid_argument field_error(const std::string& name, const std::string& what) {
  return std::invalid_argument("field '" + name + "': " + what);
}

}  // namespace

SpecFields::SpecFields(const json& spec) : spec_(spec) {}

int64_t SpecFields::to_int(const std::string& name, const json& v, int64_t min_value) const {
  const std::string want = min_value > 0 ? "a positive integer" : "a non-negative integer";
  int64_t value = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(kMaxField))
        throw field_error(name, std::to_string(u) + " is too large (at most " + std::to_string(kMaxField) + ")");
      value = static_cast<int64_t>(u);
    } else {
      value = v.get<int64_t>();
    }
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > static_cast<double>(kMaxField))
      throw field_error(name, "expected " + want + ", got " + v.dump());
    value = static_cast<int64_t>(d);
  } else {
    throw field_error(name, "expected " + want + ", got " + v.dump());
  }
  if (value < min_value) throw field_error(name, "expected " + want + ", got " + std::to_string(value));
  if (value > kMaxField)
    throw field_error(name, std::to_string(value) + " is too large (at most " + std::to_string(kMaxField) + ")");
  return value;
}

int64_t SpecFields::integer(const std::string& name, int64_t min_value) {
  known_.insert(name);
  if (!spec_.contains(name)) throw field_error(name, "missing (required)");
  read_.insert(name);
  return to_int(name, spec_.at(name), min_value);
}

int64_t SpecFields::integer(const std::string& name, int64_t min_value, int64_t fallback) {
  known_.insert(name);
  if (!spec_.contains(name)) return fallback;
  return integer(name, min_value);
}

std::array<int64_t, 2> SpecFields::pair(const std::string& name, int64_t min_value) {
  known_.insert(name);
  if (!spec_.contains(name)) throw field_error(name, "missing (required)");
  read_.insert(name);
  const json& v = spec_.at(name);
  if (v.is_array()) {
    if (v.size() != 2)
      throw field_error(name, "expected an integer or [height, width], got an array of " +
                                  std::to_string(v.size()) + " values");
    return {to_int(name, v[0], min_value), to_int(name, v[1], min_value)};
  }
  const int64_t x = to_int(name, v, min_value);
  return {x, x};
}

std::array<int64_t, 2> SpecFields::pair(const std::string& name, int64_t min_value,
                                        std::array<int64_t, 2> fallback) {
  known_.insert(name);
  if (!spec_.contains(name)) return fallback;
  return pair(name, min_value);
}

bool SpecFields::boolean(const std::string& name, bool fallback) {
  known_.insert(name);
  if (!spec_.contains(name)) return fallback;
  read_.insert(name);
  const json& v = spec_.at(name);
  if (!v.is_boolean()) throw field_error(name, "expected true or false, got " + v.dump());
  return v.get<bool>();
}

double SpecFields::number(const std::string& name, double fallback, double lo, double hi, bool hi_inclusive) {
  known_.insert(name);
  if (!spec_.contains(name)) return fallback;
  read_.insert(name);
  const json& v = spec_.at(name);
  if (!v.is_number()) throw field_error(name, "expected a number, got " + v.dump());
  const double d = v.get<double>();
  const bool ok = std::isfinite(d) && d >= lo && (hi_inclusive ? d <= hi : d < hi);
  if (!ok) {
    throw field_error(name, "must be in [" + json(lo).dump() + ", " + json(hi).dump() + (hi_inclusive ? "]" : ")") +
                                ", got " + v.dump());
  }
  return d;
}

std::string SpecFields::choice(const std::string& name, const std::string& fallback,
                               std::initializer_list<const char*> options) {
  known_.insert(name);
  if (!spec_.contains(name)) return fallback;
  read_.insert(name);
  const json& v = spec_.at(name);
  std::string list;
  for (const char* o : options) {
    if (v.is_string() && v.get<std::string>() == o) return o;
    list += (list.empty() ? "\"" : ", \"") + std::string(o) + "\"";
  }
  throw field_error(name, "expected one of " + list + ", got " + v.dump());
}

void SpecFields::reject_unknown() const {
  for (const auto& [key, value] : spec_.items()) {
    if (!read_.count(key)) {
      std::string known;
      for (const auto& k : known_) known += known.empty() ? k : ", " + k;
      throw std::invalid_argument("unknown field '" + key + "' for layer type '" + spec_.at("type").get<std::string>() +
                                  "'" + (known.empty() ? " (it takes no fields)" : " (known fields: " + known + ")"));
    }
  }
}

void check_elements(const std::string& what, std::initializer_list<int64_t> factors) {
  long double p = 1;
  for (int64_t f : factors) p *= static_cast<long double>(f);
  if (p > static_cast<long double>(kMaxElements))
    throw std::invalid_argument(what + " is too large (more than 2^40 elements)");
}

std::string hw_str(int64_t h, int64_t w) {
  return h == w ? std::to_string(h) : std::to_string(h) + "x" + std::to_string(w);
}

Window2d make_window(const std::string& layer, const Shape& in, std::array<int64_t, 2> kernel,
                     std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
  if (in.size() != 3)
    throw std::invalid_argument(layer + " needs a per-sample input (channels, height, width), got " + shape_str(in));
  Window2d g;
  g.c = in[0];
  g.h = in[1];
  g.w = in[2];
  g.kh = kernel[0];
  g.kw = kernel[1];
  g.sh = stride[0];
  g.sw = stride[1];
  g.ph = padding[0];
  g.pw = padding[1];
  if (g.kh > g.h + 2 * g.ph || g.kw > g.w + 2 * g.pw)
    throw std::invalid_argument("field 'kernel': kernel " + hw_str(g.kh, g.kw) + " larger than padded input " +
                                std::to_string(g.h + 2 * g.ph) + "x" + std::to_string(g.w + 2 * g.pw));
  return g;
}

Shape with_batch(int64_t batch, const Shape& per_sample) {
  Shape s;
  s.reserve(per_sample.size() + 1);
  s.push_back(batch);
  s.insert(s.end(), per_sample.begin(), per_sample.end());
  return s;
}

void check_batch_shape(const char* what, const Tensor& x, const Shape& per_sample) {
  const Shape& s = x.shape();
  bool ok = x.defined() && s.size() == per_sample.size() + 1 && s[0] >= 1;
  for (size_t i = 0; ok && i < per_sample.size(); ++i) ok = s[i + 1] == per_sample[i];
  if (!ok) {
    throw std::invalid_argument(std::string(what) + ": expected (batch, ...) = " +
                                shape_str(with_batch(-1, per_sample)).replace(1, 2, "batch") + ", got " +
                                (x.defined() ? shape_str(s) : std::string("an undefined tensor")));
  }
}

}  // namespace cleave::nn_detail
