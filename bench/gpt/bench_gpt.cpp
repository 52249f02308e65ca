// bench_gpt: a byte-level GPT (models/gpt-tiny.json) trained by cleave next to
// PyTorch (bench/gpt/torch_gpt.py: the same model, optimizer and schedule).
//
// Two parts, one table each, both in the JSON:
//   throughput  tokens/s of training steps (batch B of context-T windows of a
//               text, forward + loss + backward + optimizer step):
//                 local Nt    cleave train --local with N CPU threads
//                 torch Nt    PyTorch with torch.set_num_threads(N), same batch
//                 pipe pS     S local cleaved daemons (1 thread each, CURVE
//                             encryption, loopback), 1F1B, M micro-batches
//               Local and PyTorch repetitions alternate (fair on a busy
//               machine); each row is the median of --reps repetitions.
//   quality     --quality-steps steps of batch 32 (default 2000) on the text,
//               AdamW lr 1e-3 (weight decay 0.01), constant schedule, the same
//               initialisation scheme; cleave's and PyTorch's validation loss
//               (nats per byte) on the same validation windows, and their ratio.
//
// The text defaults to Debian's fortunes (/usr/share/games/fortunes, every
// regular file but the .dat indexes, sorted, concatenated into a temporary
// file). PyTorch is the python of --python, else $CLEAVE_TORCH_PYTHON, else
// python3; without torch the PyTorch rows say so and the rest still runs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/common/bench_args.h"
#include "apps/common/processes.h"
#include "bench/common/local_daemons.h"
#include "bench/common/python_script.h"
#include "core/data/dataset.h"
#include "core/io/json_file.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/train/local_trainer.h"
#include "device/cpu/process_env.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Options {
  std::string model = std::string(CLEAVE_SOURCE_DIR) + "/models/gpt-tiny.json";
  std::string text;  // "" = fortunes
  std::string fortunes_dir = cleave::kFortunesDir;
  std::vector<int> threads{1, 2};
  std::vector<int> stages{2, 3};
  int64_t batch = 32;
  int64_t steps = 30;           // timed steps per throughput repetition
  int64_t pipeline_steps = 20;  // steps per pipeline run
  int microbatches = 4;
  int reps = 3;
  int64_t quality_steps = 2000;
  int64_t quality_batch = 32;
  int quality_threads = 2;
  int64_t limit_test = 1024;
  float lr = 1e-3f;
  uint64_t seed = 1;
  bool torch = true, throughput = true, pipeline = true, quality = true;
  std::string python;
  std::string torch_script = std::string(CLEAVE_SOURCE_DIR) + "/bench/gpt/torch_gpt.py";
  std::string cleaved = std::string(CLEAVE_BUILD_DIR) + "/apps/cleaved/cleaved";
  std::string json_path = "bench-gpt.json";
};

using cleave::bench::load_average;

using cleave::bench::median;

using cleave::bench::shell_quote;

// torch_gpt.py through the python with torch.
class Torch : public cleave::bench::TorchPython {
 public:
  explicit Torch(const Options& o) : TorchPython(o.python, o.torch), o_(o) {}

  // One JSON answer of torch_gpt.py COMMAND ARGS; throws when it fails.
  json run(const std::string& command, const std::string& args) const {
    return TorchPython::run(o_.torch_script, command + " --model " + shell_quote(o_.model) + " " + args);
  }

 private:
  const Options& o_;
};

cleave::TrainConfig base_config(const Options& o, const std::string& text) {
  cleave::TrainConfig cfg;
  cfg.model_path = o.model;
  cfg.text_path = text;
  cfg.batch = o.batch;
  cfg.seed = o.seed;
  cfg.limit_test = 32;
  cfg.optimizer.kind = "adamw";
  cfg.optimizer.lr = o.lr;
  cfg.optimizer.weight_decay = 0.01f;
  cfg.progress = false;
  return cfg;
}

int64_t context_of(const std::string& model) {
  std::ifstream in(model);
  return json::parse(in).at("input").at(0).get<int64_t>();
}

struct Row {
  std::string name;
  int threads;
  std::vector<double> tokens_per_sec;
  std::string note;
};

// The median of the first row named `prefix`... with `threads` threads (0 if none).
double row_median(const std::vector<Row>& rows, const std::string& prefix, int threads) {
  for (const Row& r : rows)
    if (r.name.rfind(prefix, 0) == 0 && r.threads == threads && !r.tokens_per_sec.empty())
      return median(r.tokens_per_sec);
  return 0;
}

std::string ratio_str(double a, double b) {
  if (a <= 0 || b <= 0) return "-";
  char s[32];
  std::snprintf(s, sizeof s, "%.2fx", a / b);
  return s;
}

// Local rows next to PyTorch at the same threads; every row next to local 1t.
void print_rows(const std::vector<Row>& rows) {
  std::printf("\n%-12s %8s %12s %10s %10s %6s %s\n", "config", "threads", "tokens/s", "vs torch", "vs local1t", "reps",
              "");
  const double local1 = row_median(rows, "local", 1);
  for (const Row& r : rows) {
    const double m = median(r.tokens_per_sec);
    const bool local = r.name.rfind("local", 0) == 0;
    const std::string vs_torch = local ? ratio_str(m, row_median(rows, "torch", r.threads)) : "-";
    std::printf("%-12s %8d %12.0f %10s %10s %6zu %s\n", r.name.c_str(), r.threads, m, vs_torch.c_str(),
                ratio_str(m, local1).c_str(), r.tokens_per_sec.size(), r.note.c_str());
  }
}

// tokens/s of cleave train --local at `threads`, and PyTorch's, alternating.
void local_and_torch(const Options& o, const std::string& text, const Torch& torch, int threads, int64_t t,
                     std::vector<Row>& rows) {
  Row local{"local " + std::to_string(threads) + "t", threads, {}, ""};
  Row pt{"torch " + std::to_string(threads) + "t", threads, {}, torch.available() ? "" : torch.missing()};
  local.note = "cleave train --local";
  for (int r = 0; r < o.reps; ++r) {
    cleave::TrainConfig cfg = base_config(o, text);
    cfg.threads = threads;
    cfg.max_steps = o.steps;
    const json res = cleave::train_local(cfg);
    local.tokens_per_sec.push_back(res.at("samples_per_sec").get<double>() * static_cast<double>(t));
    if (torch.available()) {
      const json j = torch.run("throughput", "--batch " + std::to_string(o.batch) + " --threads " +
                                                 std::to_string(threads) + " --steps " + std::to_string(o.steps) +
                                                 " --reps 1 --warmup 3 --seed " + std::to_string(o.seed));
      pt.tokens_per_sec.push_back(j.at("median_tokens_per_sec").get<double>());
    }
    std::fprintf(stderr, "bench_gpt: %d thread(s), repetition %d of %d done (load %.2f)\n", threads, r + 1, o.reps,
                 load_average());
  }
  rows.push_back(local);
  rows.push_back(pt);
}

// tokens/s of a pipeline over `stages` local daemons.
Row pipeline_row(const Options& o, const std::string& text, int stages, int64_t t) {
  Row row{"pipe p" + std::to_string(stages), 1, {},
          std::to_string(stages) + " daemons x 1 thread, 1f1b, " + std::to_string(o.microbatches) + " micro-batches"};
  std::vector<std::string> names;
  for (int i = 1; i <= stages; ++i) names.push_back("dev" + std::to_string(i));
  for (int r = 0; r < o.reps; ++r) {
    cleave::bench::LocalDaemons daemons(names, o.cleaved);
    cleave::TrainConfig cfg = base_config(o, text);
    cfg.max_steps = o.pipeline_steps;
    cfg.microbatches = o.microbatches;
    cleave::ClusterOptions cl;
    cl.devices = stages;
    cl.key_path = daemons.coordinator_key();
    cl.allow_path = daemons.allow();
    cl.listen = "tcp://127.0.0.1:*";
    cl.schedule = "1f1b";
    cl.planner = "balance";
    cl.shutdown_daemons = true;
    cl.register_timeout_ms = 60000;
    cl.peer_timeout_ms = 30000;
    cl.on_listening = [&](const std::string& endpoint) {
      for (const auto& n : names) daemons.start(n, endpoint);
    };
    const json res = cleave::train_pipeline(cfg, cl);
    row.tokens_per_sec.push_back(res.at("samples_per_sec").get<double>() * static_cast<double>(t));
  }
  return row;
}

json rows_json(const std::vector<Row>& rows) {
  json out = json::array();
  for (const Row& r : rows)
    out.push_back({{"config", r.name}, {"threads", r.threads}, {"tokens_per_sec", r.tokens_per_sec},
                   {"median_tokens_per_sec", median(r.tokens_per_sec)}, {"note", r.note}});
  return out;
}

// Validation loss after quality_steps steps: cleave, then PyTorch.
json quality(const Options& o, const std::string& text, const Torch& torch) {
  cleave::TrainConfig cfg = base_config(o, text);
  cfg.batch = o.quality_batch;
  cfg.threads = o.quality_threads;
  cfg.limit_test = o.limit_test;
  cfg.max_steps = o.quality_steps;
  cfg.epochs = 1000;  // --max-steps ends the run
  const json c = cleave::train_local(cfg);
  json out = {{"steps", o.quality_steps}, {"batch", o.quality_batch}, {"threads", o.quality_threads},
              {"validation_windows", c.at("test_samples")}, {"cleave_val_loss", c.at("val_loss")},
              {"cleave_seconds", c.at("wall_seconds")}, {"cleave_losses_tail", json::array()}};
  const auto& losses = c.at("losses");
  for (size_t i = losses.size() >= 10 ? losses.size() - 10 : 0; i < losses.size(); ++i)
    out["cleave_losses_tail"].push_back(losses[i]);
  std::printf("\nquality: %lld steps of batch %lld, AdamW lr %g, %lld validation windows\n",
              static_cast<long long>(o.quality_steps), static_cast<long long>(o.quality_batch), o.lr,
              static_cast<long long>(c.at("test_samples").get<int64_t>()));
  std::printf("  cleave  val_loss %.4f nats/byte (%.3f bits/byte), %.0f s\n", c.at("val_loss").get<double>(),
              c.at("val_bits_per_byte").get<double>(), c.at("wall_seconds").get<double>());
  if (!torch.available()) {
    std::printf("  torch   -- %s\n", torch.missing().c_str());
    out["torch"] = torch.missing();
    return out;
  }
  const json t = torch.run("train", "--text " + shell_quote(text) + " --steps " + std::to_string(o.quality_steps) +
                                        " --batch " + std::to_string(o.quality_batch) + " --threads " +
                                        std::to_string(o.quality_threads) + " --limit-test " +
                                        std::to_string(o.limit_test) + " --optimizer adamw --lr " +
                                        std::to_string(o.lr) + " --seed " + std::to_string(o.seed));
  const double cl = c.at("val_loss").get<double>(), tl = t.at("val_loss").get<double>();
  out["torch_val_loss"] = tl;
  out["torch_seconds"] = t.at("seconds");
  out["ratio"] = cl / tl;
  out["within_5_percent"] = std::fabs(cl / tl - 1.0) <= 0.05;
  std::printf("  torch   val_loss %.4f nats/byte (%.3f bits/byte), %.0f s\n", tl, tl / std::log(2.0),
              t.at("seconds").get<double>());
  std::printf("  cleave / torch = %.4f (%s 5%%)\n", cl / tl, std::fabs(cl / tl - 1.0) <= 0.05 ? "within" : "NOT within");
  return out;
}

std::vector<int> int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // the table as it comes, also into a log file
  Options o;
  CLI::App app{"bench_gpt: gpt-tiny training tokens/s and validation loss, cleave next to PyTorch"};
  std::string threads = "1,2", stages = "2,3";
  bool no_torch = false, no_throughput = false, no_pipeline = false, no_quality = false;
  app.add_option("--model", o.model, "GPT model file")->capture_default_str();
  app.add_option("--text", o.text, "Text to train on (default: the fortunes, concatenated)");
  app.add_option("--threads-list", threads, "Thread counts of the local and PyTorch rows")->capture_default_str();
  app.add_option("--stages", stages, "Pipeline stage counts (daemons)")->capture_default_str();
  app.add_option("--batch", o.batch, "Throughput batch")->capture_default_str();
  app.add_option("--steps", o.steps, "Throughput steps per repetition")->capture_default_str();
  app.add_option("--pipeline-steps", o.pipeline_steps, "Steps per pipeline run")->capture_default_str();
  app.add_option("--microbatches", o.microbatches, "Pipeline micro-batches")->capture_default_str();
  app.add_option("--reps", o.reps, "Repetitions (median reported)")->capture_default_str();
  app.add_option("--quality-steps", o.quality_steps, "Steps of the learning-quality run")->capture_default_str();
  app.add_option("--quality-batch", o.quality_batch, "Batch of the learning-quality run")->capture_default_str();
  app.add_option("--quality-threads", o.quality_threads, "Threads of the learning-quality run")->capture_default_str();
  app.add_option("--limit-test", o.limit_test, "Validation windows of the quality run")->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed")->capture_default_str();
  app.add_option("--python", o.python, "Python with torch (default $CLEAVE_TORCH_PYTHON, else python3)");
  app.add_option("--torch-script", o.torch_script, "torch_gpt.py")->capture_default_str();
  app.add_option("--cleaved", o.cleaved, "cleaved binary for the pipeline rows")->capture_default_str();
  app.add_option("--json", o.json_path, "Where to write the results")->capture_default_str();
  app.add_flag("--no-torch", no_torch, "Skip PyTorch");
  app.add_flag("--no-throughput", no_throughput, "Skip the local and PyTorch tokens/s rows");
  app.add_flag("--no-pipeline", no_pipeline, "Skip the pipeline rows");
  app.add_flag("--no-quality", no_quality, "Skip the learning-quality comparison");
  CLI11_PARSE(app, argc, argv);
  o.threads = int_list(threads);
  o.stages = int_list(stages);
  o.torch = !no_torch;
  o.throughput = !no_throughput;
  o.pipeline = !no_pipeline;
  o.quality = !no_quality;
  o.python = cleave::bench::torch_python(o.python);
  try {
    std::string text = o.text;
    const std::string tmp = (fs::temp_directory_path() / ("bench-gpt-fortunes-" + std::to_string(getpid()) + ".txt"));
    if (text.empty()) text = cleave::write_fortunes_text(o.fortunes_dir, tmp);
    const Torch torch(o);
    const int64_t t = context_of(o.model);
    std::printf("bench_gpt: %s, text %s (%lld bytes), batch %lld, load %.2f, torch %s\n", o.model.c_str(),
                text.c_str(), static_cast<long long>(fs::file_size(text)), static_cast<long long>(o.batch),
                load_average(), torch.available() ? torch.version().c_str() : torch.missing().c_str());
    json out = {{"model", o.model},        {"text", text},       {"batch", o.batch},
                {"context", t},            {"steps", o.steps},   {"reps", o.reps},
                {"load_before", load_average()}, {"torch", torch.available() ? torch.version() : torch.missing()}};
    std::vector<Row> rows;
    if (o.throughput)
      for (int th : o.threads) local_and_torch(o, text, torch, th, t, rows);
    if (o.pipeline)
      for (int s : o.stages) rows.push_back(pipeline_row(o, text, s, t));
    if (!rows.empty()) print_rows(rows);
    out["throughput"] = rows_json(rows);
    if (o.quality) out["quality"] = quality(o, text, torch);
    out["load_after"] = load_average();
    std::printf("\nload average %.2f\n", load_average());
    cleave::write_json_file(o.json_path, out);
    std::printf("wrote %s\n", o.json_path.c_str());
    if (o.text.empty()) fs::remove(tmp);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
