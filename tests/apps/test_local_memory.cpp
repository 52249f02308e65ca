// test_local_memory.cpp: `cleave train --local` estimates its memory with the
// one memory model (core/planner/memory_model.h) before it allocates anything,
// refuses a run that does not fit the machine with a message saying what it
// needs, what is free and what to do, and reports the estimate in its JSON.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>

#include "cli_util.h"
#include "core/model/model_spec.h"
#include "core/optim/optimizer.h"
#include "core/planner/memory_model.h"
#include "device/device.h"

using namespace cleave;
using namespace cleave::cli_test;

namespace {

// `rows` rows "label,x0..x{features-1}" with labels 0 and 1 (label = x0 > x1).
void write_csv(const std::string& path, int rows, int64_t features) {
  std::ofstream out(path);
  for (int i = 0; i < rows; ++i) {
    const float x0 = static_cast<float>((i * 37) % 17) / 17.f - 0.5f, x1 = static_cast<float>((i * 11) % 13) / 13.f - 0.5f;
    out << (x0 > x1 ? 1 : 0) << ',' << x0 << ',' << x1;
    for (int64_t f = 2; f < features; ++f) out << ",0.25";
    out << '\n';
  }
  REQUIRE(out.good());
}

}  // namespace

TEST_CASE("cleave train --local refuses a model that cannot fit, before allocating", "[cli][memory]") {
  TempDir dir;
  // 100,000 ReLU layers (the finding's model), each sample wide enough that the
  // activations they keep for backward are twice what this machine has free.
  const int64_t layers = 100000, batch = 64;
  const size_t free_bytes = open_device("cpu")->memory().free;
  const int64_t features =
      std::max<int64_t>(8, static_cast<int64_t>(2.0 * static_cast<double>(free_bytes) / (4.0 * batch * layers)) + 1);
  {
    std::ofstream m(dir.file("relu100k.json"));
    m << R"({"name": "relu100k", "input": [)" << features << R"(], "loss": "cross_entropy", "layers": [)";
    for (int64_t i = 0; i < layers; ++i) m << R"({"type": "relu"},)";
    m << R"({"type": "linear", "out_features": 2}]})";
    REQUIRE(m.good());
  }
  write_csv(dir.file("train.csv"), 64, features);
  write_csv(dir.file("test.csv"), 16, features);
  // Capped at 4 GiB of address space: a run that starts allocating its
  // activations fails on its own instead of taking the machine's memory.
  const RunResult r = run_shell("ulimit -v 4194304; '" + kCleave + "' train --local --backend cpu --model '" +
                                dir.file("relu100k.json") + "' --dataset '" + dir.file("train.csv") +
                                "' --batch 64 --json '" + dir.file("out.json") + "'");
  INFO(r.output);
  require_exit(r, kExitFailure,
               {"needs an estimated", "activations", "is free", "smaller --batch", "more --microbatches",
                "fewer layers", "cleaved daemons"});
  CHECK_FALSE(fs::exists(dir.file("out.json")));
}

TEST_CASE("cleave train --local reports its memory estimate and a small run still trains", "[cli][memory]") {
  TempDir dir;
  write_csv(dir.file("train.csv"), 128, 2);
  write_csv(dir.file("test.csv"), 32, 2);
  write_text(dir.file("m.json"), R"({"name": "sep", "input": [2], "loss": "cross_entropy",
    "layers": [{"type": "linear", "out_features": 16}, {"type": "relu"}, {"type": "linear", "out_features": 2}]})");
  const RunResult r = run_cleave("train --local --backend cpu --model '" + dir.file("m.json") + "' --dataset '" +
                                 dir.file("train.csv") + "' --batch 16 --microbatches 2 --epochs 2 --optimizer sgd " +
                                 "--lr 0.1 --json '" + dir.file("out.json") + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const nlohmann::json j = read_json(dir.file("out.json"));
  CHECK(j.at("steps") == 16);
  // The memory model's number for the whole model as one stage on the CPU.
  OptimizerConfig sgd;
  sgd.kind = "sgd";
  const StageMemory need = stage_memory(ModelSpec::load(dir.file("m.json")), 0, 3, sgd, 16, 2, 1, Backend::cpu);
  CHECK(j.at("estimated_memory_bytes").get<size_t>() == need.total());
  CHECK(need.total() > 0);
  CHECK(j.at("peak_memory_bytes").get<size_t>() > 0);
}
