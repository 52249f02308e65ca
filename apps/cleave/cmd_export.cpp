// cmd_export.cpp: `cleave export` — a checkpoint's weights as safetensors in
// PyTorch nn.Sequential naming and layout.
#include <cstdio>
#include <memory>

#include "apps/cleave/commands.h"
#include "core/io/safetensors.h"
#include "core/io/state_dict.h"
#include "core/model/model_spec.h"
#include "core/train/train_checkpoint.h"

namespace cleave {

void add_export_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("export", "Write a checkpoint's weights as safetensors (PyTorch layout)");
  auto ckpt = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("--checkpoint", *ckpt, "Checkpoint written by `cleave train --save` or `cleave fed --save`")->required();
  cmd->add_option("--out", *out, "Output .safetensors file")->required();
  cmd->callback([ckpt, out]() {
    CheckpointWeights st = load_checkpoint_weights(*ckpt);
    ModelSpec spec = ModelSpec::parse(st.model, *ckpt);
    auto tensors = state_dict(spec, st.params);
    write_safetensors(*out, tensors, {{"format", "pt"}, {"model", spec.name}});
    std::printf("wrote %s: %zu tensors, %zu parameters\n", out->c_str(), tensors.size(), st.params.size());
  });
}

}  // namespace cleave
