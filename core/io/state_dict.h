// state_dict.h: a model's parameter block as named tensors, with PyTorch's names.
//
// Keys are "<layer index>.<param>" ("0.weight", "0.bias", "7.weight", ...),
// exactly the keys of torch.nn.Sequential built from the same layers, with
// PyTorch's shapes: linear weight (out, in), conv2d weight (out, in, kh, kw),
// layernorm weight/bias (features). So write_safetensors(state_dict(...)) loads
// in PyTorch with model.load_state_dict(safetensors.torch.load_file(path)), and
// the reverse. Layer indices are global: a stage's keys match the whole model's.
#pragma once

#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "core/model/model_spec.h"

namespace cleave {

// One parameter tensor's place in a parameter block.
struct ParamSlot {
  std::string key;  // "<layer>.<name>"
  int layer = 0;    // global layer index
  Shape shape;      // PyTorch layout
  int64_t offset;   // element offset inside the block of layers [begin, end)
};

// The named parameters of layers [begin, end) of `spec` (end = -1: to the last layer),
// in block order (the order of Partition's block). Throws std::invalid_argument for a bad range.
std::vector<ParamSlot> param_slots(const ModelSpec& spec, int begin = 0, int end = -1);

// Named copies of the tensors in `params`, the block of layers [begin, end) (the whole
// model by default). Throws std::invalid_argument when params has the wrong size.
std::vector<NamedTensor> state_dict(const ModelSpec& spec, const std::vector<float>& params, int begin = 0,
                                    int end = -1);

// The parameter block of layers [begin, end) assembled from named tensors (e.g. read
// from a safetensors file). Keys of the model's layers outside [begin, end) are ignored,
// so a whole-model file loads into any stage. Throws std::invalid_argument listing every
// missing key, unexpected key and shape mismatch (naming the key and both shapes).
std::vector<float> load_state_dict(const ModelSpec& spec, const std::vector<NamedTensor>& tensors, int begin = 0,
                                   int end = -1);

}  // namespace cleave
