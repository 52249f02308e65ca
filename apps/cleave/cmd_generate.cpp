// cmd_generate.cpp: `cleave generate` — text sampled from a trained byte-level
// language model's checkpoint (core/train/generate.h), written to stdout.
#include <cmath>
#include <cstdio>
#include <memory>

#include "apps/cleave/commands.h"
#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/train/generate.h"
#include "core/train/train_checkpoint.h"
#include "device/device.h"

namespace cleave {

namespace {

struct GenerateFlags {
  std::string checkpoint;
  std::string prompt;
  int64_t tokens = 0;
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  int threads = 1;
};

void run_generate(const GenerateFlags& f) {
  if (f.prompt.empty()) throw UsageError("--prompt is empty: give at least one byte for the model to continue");
  if (f.tokens < 0) throw UsageError("--tokens must be >= 0, got " + std::to_string(f.tokens));
  if (!(f.temperature >= 0) || !std::isfinite(f.temperature))
    throw UsageError("--temperature must be a finite number >= 0 (0: greedy), got " + std::to_string(f.temperature));
  if (f.top_k < 0) throw UsageError("--top-k must be >= 0 (0: all 256 bytes, 1: greedy), got " +
                                    std::to_string(f.top_k));
  if (f.threads < 0) throw UsageError("--threads must be >= 0 (0: all cores), got " + std::to_string(f.threads));
  CheckpointLanguageModel lm;
  try {
    lm = load_language_model(f.checkpoint, f.threads);
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());
  }
  TextGenerator& generator = *lm.generator;
  if (static_cast<int64_t>(f.prompt.size()) > generator.context())
    std::fprintf(stderr, "cleave generate: the prompt has %zu bytes, the model's context %lld: it sees the last %lld\n",
                 f.prompt.size(), static_cast<long long>(generator.context()),
                 static_cast<long long>(generator.context()));
  std::fwrite(f.prompt.data(), 1, f.prompt.size(), stdout);
  SamplingOptions sampling;
  sampling.temperature = f.temperature;
  sampling.top_k = f.top_k;
  generator.generate(f.prompt, f.tokens, sampling, f.seed, [](char c) { std::fputc(c, stdout); });
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace

void add_generate_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("generate", "Print text sampled from a byte-level language model's checkpoint");
  auto f = std::make_shared<GenerateFlags>();
  cmd->add_option("--checkpoint", f->checkpoint, "Checkpoint of a model trained with --text (cleave train --save)")
      ->required();
  cmd->add_option("--prompt", f->prompt, "Text to continue (at least one byte; only its last context bytes count)")
      ->required();
  cmd->add_option("--tokens", f->tokens, "Bytes to generate after the prompt")->required();
  cmd->add_option("--temperature", f->temperature, "Divides the logits; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "Sample among the K most likely bytes; 0 = all, 1 = greedy")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of the sampling: the same seed gives the same text")->capture_default_str();
  cmd->add_option("--threads", f->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->callback([f]() { run_generate(*f); });
}

}  // namespace cleave
