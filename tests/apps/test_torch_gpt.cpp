// test_torch_gpt.cpp: a GPT trained by cleave, exported by `cleave export`,
// loaded strictly by PyTorch (bench/gpt/torch_gpt.py builds the same model)
// gives cleave's validation loss on the same validation windows to 1e-4
// relative; with untied and with tied ("tied_to") vocabulary projections. And,
// without PyTorch, that a tied model's export holds the shared table once.
//
// PyTorch is found through $CLEAVE_TORCH_PYTHON (a python with torch and
// numpy, e.g. a venv's bin/python), else `python3`; where neither imports
// torch the test is reported as skipped, saying so.
#include <cmath>
#include <cstdlib>

#include "apps/cli_util.h"
#include "core/io/safetensors.h"
#include "skip.h"
#include "text_corpus.h"

using namespace cleave;
using namespace cleave::cli_test;

namespace {

const std::string kScript = CLEAVE_SOURCE_DIR "/bench/gpt/torch_gpt.py";

std::string torch_python() {
  const char* p = std::getenv("CLEAVE_TORCH_PYTHON");
  return p && *p ? p : "python3";
}

// "" when `python` imports torch and numpy, else why not.
std::string torch_missing(const std::string& python) {
  const RunResult r = run_shell("'" + python + "' -c 'import torch, numpy'");
  if (r.code == 0) return "";
  return "PyTorch is not importable by '" + python + "' (set CLEAVE_TORCH_PYTHON to a python with torch and numpy): " +
         r.output.substr(0, 300);
}

// gpt-micro, with its projection tied to the embedding when `tied`.
std::string write_model(TempDir& dir, bool tied) {
  nlohmann::json doc = read_json(CLEAVE_SOURCE_DIR "/tests/fixtures/gpt-micro.json");
  if (tied) {
    doc["name"] = "gpt-micro-tied";
    doc["layers"].back()["tied_to"] = 0;
  }
  const std::string path = dir.file(tied ? "gpt-tied.json" : "gpt.json");
  write_text(path, doc.dump(2));
  return path;
}

// Trains `model` for 2 epochs of `steps_per_epoch` steps with --save and exports
// it to gpt.safetensors in `dir`; returns the training JSON.
nlohmann::json train_and_export(TempDir& dir, const std::string& model, const std::string& text,
                                int steps_per_epoch) {
  const std::string ck = dir.file("gpt.ckpt"), st = dir.file("gpt.safetensors"), js = dir.file("train.json");
  const RunResult train = run_cleave("train --local --model '" + model + "' --text '" + text +
                                     "' --epochs 2 --batch 16 --limit-train " + std::to_string(16 * steps_per_epoch) +
                                     " --limit-test 100 --optimizer adamw --lr 3e-3 --threads 1 --seed 3 --no-progress"
                                     " --save '" + ck + "' --json '" + js + "'");
  INFO(train.output);
  REQUIRE(train.code == 0);
  const RunResult exp = run_cleave("export --checkpoint '" + ck + "' --out '" + st + "'");
  INFO(exp.output);
  REQUIRE(exp.code == 0);
  return read_json(js);
}

// cleave's val_loss after training `model` for 40 steps, and PyTorch's on the exported weights.
std::pair<double, double> both_losses(TempDir& dir, const std::string& model, const std::string& python) {
  const std::string text = dir.file("corpus.txt");
  test::write_generated_text(text, 24000);
  const nlohmann::json c = train_and_export(dir, model, text, 20);
  const std::string st = dir.file("gpt.safetensors");
  const RunResult torch = run_shell("'" + python + "' '" + kScript + "' eval --model '" + model + "' --weights '" +
                                    st + "' --text '" + text + "' --limit-test 100 --threads 1");
  INFO(torch.output);
  REQUIRE(torch.code == 0);
  const nlohmann::json t = nlohmann::json::parse(torch.output.substr(torch.output.rfind("\n{") + 1));
  CHECK(t.at("windows") == 100);
  CHECK(c.at("val_losses").size() == 2);
  return {c.at("val_loss").get<double>(), t.at("val_loss").get<double>()};
}

}  // namespace

TEST_CASE("cleave export writes a tied GPT's shared table once", "[cli][gpt][tying]") {
  TempDir dir;
  const std::string text = dir.file("corpus.txt");
  test::write_generated_text(text, 12000);
  const nlohmann::json untied = train_and_export(dir, write_model(dir, false), text, 2);
  const size_t untied_tensors = read_safetensors(dir.file("gpt.safetensors")).size();
  const nlohmann::json tied = train_and_export(dir, write_model(dir, true), text, 2);
  const std::vector<NamedTensor> tensors = read_safetensors(dir.file("gpt.safetensors"));
  int64_t values = 0;
  bool table = false, bias = false, weight = false;
  for (const auto& t : tensors) {
    values += numel(t.shape);
    table = table || (t.name == "0.weight" && t.shape == Shape{256, 32});
    bias = bias || t.name == "5.bias";
    weight = weight || t.name == "5.weight";
  }
  CHECK(table);
  CHECK(bias);
  CHECK_FALSE(weight);
  CHECK(tensors.size() + 1 == untied_tensors);
  CHECK(values == tied.at("parameters").get<int64_t>());
  CHECK(untied.at("parameters").get<int64_t>() - values == 256 * 32);
}

TEST_CASE("PyTorch reproduces cleave's validation loss from its export", "[cli][gpt][torch]") {
  const std::string python = torch_python();
  const std::string missing = torch_missing(python);
  if (!missing.empty()) CLEAVE_SKIP(missing);
  TempDir dir;
  for (bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied") << " projection");
    const auto [cleave_loss, torch_loss] = both_losses(dir, write_model(dir, tied), python);
    INFO("cleave " << cleave_loss << ", PyTorch " << torch_loss);
    CHECK(cleave_loss < std::log(256.0) - 1.0);  // trained, not the initial ~5.5 nats
    CHECK(std::fabs(cleave_loss - torch_loss) <= 1e-4 * std::fabs(cleave_loss));
  }
}
