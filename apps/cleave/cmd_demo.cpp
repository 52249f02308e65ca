// cmd_demo.cpp: `cleave demo` — the whole system on one machine: keys, N local
// cleaved daemons, an encrypted pipeline training the CNN on Fashion-MNIST,
// or with `--model gpt` gpt-tiny on a text (Debian's fortunes by default),
// ending with a sample generated from the trained model. Everything it starts
// is stopped at the end, also on Ctrl-C.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "apps/cleave/commands.h"
#include "apps/common/processes.h"
#include "apps/cleave/train_flags.h"
#include "apps/flag_checks.h"
#include "core/data/dataset.h"
#include "core/runtime/coordinator/pipeline.h"
#include "core/train/generate.h"
#include "transport/keys.h"

namespace cleave {

namespace {

struct DemoOptions {
  int devices = 3;
  int epochs = 3;
  int threads = 1;
  int microbatches = 4;
  int64_t batch = 64;
  std::string model = "models/cnn.json";
  std::string schedule = "1f1b";
  std::string planner = "balance";
  std::string json_path, trace_path, dataset_dir, keep, text;
  int64_t limit_train = -1, limit_test = -1, max_steps = -1;
  uint64_t seed = 1;
};

bool is_gpt(const DemoOptions& o) { return o.model == "gpt"; }

// models/gpt-tiny.json here (a checkout), or installed beside the executable (share/cleave/models).
std::string gpt_tiny() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (const fs::path& p : {fs::path("models/gpt-tiny.json"), exe.parent_path() / "../share/cleave/models/gpt-tiny.json"})
    if (fs::exists(p, ec)) return p.lexically_normal().string();
  throw CliError("--model gpt: models/gpt-tiny.json is not here nor installed: run the demo from a cleave checkout");
}

// The run the demo trains: the CNN on Fashion-MNIST, or gpt-tiny on a text
// (the fortunes, written into `dir`) for 200 steps, saved to dir/gpt.ckpt.
TrainConfig demo_config(const DemoOptions& o, const std::string& dir) {
  TrainConfig cfg;
  cfg.model_path = is_gpt(o) ? gpt_tiny() : o.model;
  cfg.dataset_dir = o.dataset_dir;
  cfg.epochs = o.epochs;
  cfg.batch = o.batch;
  cfg.seed = o.seed;
  cfg.microbatches = o.microbatches;
  cfg.limit_train = o.limit_train;
  cfg.limit_test = o.limit_test;
  cfg.max_steps = o.max_steps;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.lr = 1e-3f;
  if (is_gpt(o)) {
    cfg.text_path = o.text.empty() ? write_fortunes_text(kFortunesDir, dir + "/fortunes.txt") : o.text;
    if (cfg.max_steps < 0) cfg.max_steps = 200;
    if (cfg.limit_test < 0) cfg.limit_test = 256;  // validation windows
    cfg.save_path = dir + "/gpt.ckpt";
  } else if (!o.text.empty()) {
    throw UsageError("--text goes with --model gpt");
  }
  return cfg;
}

// The trained GPT's validation loss and a sample from its checkpoint.
void print_gpt_sample(const nlohmann::json& result, const std::string& checkpoint) {
  std::printf("cleave demo: validation loss %.4f nats/byte (%.3f bits/byte) after %lld steps, %.1f s in all\n",
              result["val_loss"].get<double>(), result["val_bits_per_byte"].get<double>(),
              static_cast<long long>(result["steps"].get<int64_t>()), result["wall_seconds"].get<double>());
  CheckpointLanguageModel lm = load_language_model(checkpoint, 1);
  SamplingOptions sampling;
  sampling.temperature = 0.8;
  sampling.top_k = 40;
  const std::string prompt = "Q: ";
  std::printf("cleave demo: a sample (cleave generate --prompt '%s' --tokens 200 --temperature 0.8 --top-k 40):\n%s",
              prompt.c_str(), prompt.c_str());
  lm.generator->generate(prompt, 200, sampling, 1, [](char c) { std::fputc(c, stdout); });
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

void add_demo_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("demo", "Start N local encrypted daemons and train the CNN on Fashion-MNIST as a pipeline");
  auto o = std::make_shared<DemoOptions>();
  cmd->add_option("--devices", o->devices, "Daemons (pipeline stages) to start")->capture_default_str()
      ->check(flag_checks::within(1, 16));
  cmd->add_option("--epochs", o->epochs, "Passes over Fashion-MNIST")->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--model", o->model, "Model JSON, or `gpt`: gpt-tiny on --text (default: Debian's fortunes), "
                                       "200 steps, then a generated sample")->capture_default_str();
  cmd->add_option("--text", o->text, "With --model gpt: the text to train on (default: the fortunes)");
  cmd->add_option("--max-steps", o->max_steps, "Stop after this many steps (--model gpt: 200)")
      ->check(flag_checks::positive());
  cmd->add_option("--schedule", o->schedule, "gpipe | 1f1b | zb1")->capture_default_str()
      ->check(schedule_check());
  cmd->add_option("--planner", o->planner, "balance (one stage per daemon) | auto (profile and plan)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "balance"}));
  cmd->add_option("--microbatches", o->microbatches, "Micro-batches per batch")->capture_default_str()
      ->check(flag_checks::positive());
  cmd->add_option("--batch", o->batch, "Batch size")->capture_default_str()->check(flag_checks::positive());
  cmd->add_option("--threads", o->threads, "CPU threads per daemon (0 = all cores)")->capture_default_str()
      ->check(flag_checks::non_negative());
  cmd->add_option("--seed", o->seed, "Seed")->capture_default_str();
  cmd->add_option("--limit-train", o->limit_train, "Train on the first N samples only")->check(flag_checks::positive());
  cmd->add_option("--limit-test", o->limit_test, "Test on the first N samples only")->check(flag_checks::positive());
  cmd->add_option("--dataset-dir", o->dataset_dir, "Where Fashion-MNIST lives");
  cmd->add_option("--json", o->json_path, "Write the run's results as JSON to this file");
  cmd->add_option("--trace", o->trace_path, "Write a Chrome trace of the stages here");
  cmd->add_option("--keep-keys", o->keep, "Write the demo's keys and daemon logs to this directory and keep them");
  cmd->callback([o]() {
    namespace fs = std::filesystem;
    install_interrupt_handler();
    std::string dir = o->keep;
    bool temporary = dir.empty();
    if (temporary) {
      char tmpl[] = "/tmp/cleave-demo-XXXXXX";
      if (!mkdtemp(tmpl)) throw CliError("cannot create a temporary directory under /tmp");
      dir = tmpl;
    }
    fs::create_directories(fs::path(dir) / "allow");
    std::vector<pid_t> daemons;
    auto cleanup = [&]() {
      for (pid_t pid : daemons) terminate(pid);
      daemons.clear();
      if (temporary) {
        std::error_code ec;
        fs::remove_all(dir, ec);
      }
    };
    try {
      const std::string cleaved = find_cleaved();
      transport::write_keypair(dir, "coordinator", transport::generate_keypair(), true);
      for (int i = 1; i <= o->devices; ++i) {
        const std::string name = "dev" + std::to_string(i);
        auto files = transport::write_keypair(dir, name, transport::generate_keypair(), true);
        fs::copy_file(files.public_, fs::path(dir) / "allow" / (name + ".pub"), fs::copy_options::overwrite_existing);
      }
      const TrainConfig cfg = demo_config(*o, dir);
      std::printf("cleave demo: %d encrypted daemons, %s, %s schedule, %d micro-batches, %s\n", o->devices,
                  cfg.model_path.c_str(), o->schedule.c_str(), o->microbatches,
                  cfg.max_steps > 0 ? (std::to_string(cfg.max_steps) + " steps").c_str()
                                    : (std::to_string(o->epochs) + " epoch(s)").c_str());
      std::fflush(stdout);
      ClusterOptions cl;
      cl.devices = o->devices;
      cl.key_path = dir + "/coordinator.key";
      cl.allow_path = dir + "/allow";
      cl.listen = "tcp://127.0.0.1:*";
      cl.schedule = o->schedule;
      cl.planner = o->planner;
      cl.trace_path = o->trace_path;
      cl.shutdown_daemons = true;
      cl.register_timeout_ms = 60000;
      cl.interrupted = interrupted;
      cl.on_listening = [&](const std::string& endpoint) {
        for (int i = 1; i <= o->devices; ++i) {
          const std::string name = "dev" + std::to_string(i);
          daemons.push_back(spawn({cleaved, "--coordinator", endpoint, "--key", dir + "/" + name + ".key",
                                   "--coordinator-key", dir + "/coordinator.pub", "--name", name, "--backend", "cpu",
                                   "--threads", std::to_string(o->threads), "--max-jobs", "1"},
                                  dir + "/" + name + ".log"));
        }
      };
      nlohmann::json result = train_pipeline(cfg, cl);
      result["mode"] = "demo";
      write_result_json(o->json_path, result);
      const int stages = static_cast<int>(result["plan"].size());
      if (is_gpt(*o)) {
        print_gpt_sample(result, cfg.save_path);
      } else {
        std::printf("cleave demo: test accuracy %.4f, %.1f samples/s over %d stage%s (%d daemon%s), %.1f s in all\n",
                    result["test_accuracy"].get<double>(), result["samples_per_sec"].get<double>(), stages,
                    stages == 1 ? "" : "s", o->devices, o->devices == 1 ? "" : "s", result["wall_seconds"].get<double>());
      }
      for (const auto& st : result["plan"])
        std::printf("  stage %d on %s: layers [%d, %d), %lld parameters\n", st["stage"].get<int>(),
                    st["device"].get<std::string>().c_str(), st["layers"][0].get<int>(), st["layers"][1].get<int>(),
                    static_cast<long long>(st["parameters"].get<int64_t>()));
      cleanup();
    } catch (...) {
      cleanup();
      throw;
    }
  });
}

}  // namespace cleave
