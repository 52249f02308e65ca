// safetensors.h: read and write the safetensors format (Hugging Face), so
// weights move between cleave and PyTorch (safetensors.torch.save_file /
// load_file).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// padded with spaces so that 8 + N is a multiple of 8, then the data section;
// offsets are relative to the start of the data section, values little endian,
// row-major. cleave writes F32 only; it reads F32, F16, BF16 and F64 (converted to
// float32, F64 with rounding). Names are free-form; state_dict.h uses PyTorch's.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "device/tensor.h"

namespace cleave {

struct NamedTensor {
  std::string name;
  Shape shape;              // PyTorch layout, e.g. (out, in) for a linear weight
  std::vector<float> data;  // numel(shape) values, row-major
};

// Writes `tensors` in the given order (data section in the same order) plus the
// optional string `metadata`, atomically like save_checkpoint. Throws
// std::invalid_argument for an empty, duplicate or "__metadata__" name, a negative
// dimension or data.size() != numel(shape); std::runtime_error "PATH: ..." on I/O errors.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads every tensor, in data-offset order, converted to float32. Throws
// std::runtime_error "PATH: ..." naming the problem for a header that does not fit the
// file, malformed JSON, an unsupported dtype, a shape that does not match its byte
// range, or offsets that are out of range or overlap.
std::vector<NamedTensor> read_safetensors(const std::string& path);

// The "__metadata__" map of a safetensors file (empty when absent); same checks.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

}  // namespace cleave
