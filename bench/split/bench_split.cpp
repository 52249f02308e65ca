// bench_split: cut-layer traffic and epoch time of split learning against the
// cut-layer encoding (issue 7). For each label mode (vanilla: labels on the
// server; U-shaped: on the client) and each encoding (f32, f16, int8) it
// starts a server and N client daemons on loopback (CURVE keys, allow-list),
// trains one epoch over the clients' shards and reports, side by side, the
// cut-layer bytes per epoch sent up (client -> server) and down, their ratio
// to float32, the bytes the cut layer's size predicts, the seconds per epoch
// and the test accuracy after it.
//
// Usage: bench_split [--model models/cnn.json] [--clients 2] [--samples-per-client 2000]
//                    [--encodings f32,f16,int8] [--labels server,client] [--json bench-split.json]
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/common/local_daemons.h"
#include "core/io/json_file.h"
#include "core/model/model_spec.h"
#include "core/runtime/coordinator/split_coordinator.h"
#include "core/runtime/common/split_layout.h"
#include "device/cpu/process_env.h"
#include "transport/codec.h"
#include "transport/log.h"

using namespace cleave;

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  CLI::App app{"bench_split: split-learning cut-layer bytes and epoch time vs encoding"};
  std::string model = std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json", json_path;
  std::string encodings_text = "f32,f16,int8", labels_text = "server,client";
  int clients = 2;
  int64_t per_client = 2000;
  app.add_option("--model", model, "Model JSON")->capture_default_str();
  app.add_option("--clients", clients, "Client daemons")->capture_default_str()->check(CLI::Range(1, 16));
  app.add_option("--samples-per-client", per_client, "Training samples each client holds")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--encodings", encodings_text, "Cut-layer encodings to run")->capture_default_str();
  app.add_option("--labels", labels_text, "Label modes to run (server = vanilla, client = U-shaped)")
      ->capture_default_str();
  app.add_option("--json", json_path, "Write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    transport::set_log_level(transport::LogLevel::kWarning);
    const std::string cleaved = std::string(CLEAVE_BUILD_DIR) + "/apps/cleaved/cleaved";
    const ModelSpec spec = ModelSpec::load(model);
    nlohmann::json results = nlohmann::json::array();
    std::printf("%-7s %-6s %-14s %-14s %-9s %-16s %-9s %-9s\n", "labels", "enc", "MB up/epoch", "MB down/epoch",
                "vs f32", "MB predicted", "s/epoch", "accuracy");
    for (const std::string& labels : split_list(labels_text)) {
      double f32_total = 0;
      const SplitLayout layout = make_split_layout(spec, -1, -1, labels == "client");
      for (const std::string& enc : split_list(encodings_text)) {
        std::vector<std::string> names = {"server"};
        for (int i = 0; i < clients; ++i) names.push_back("client" + std::to_string(i));
        bench::LocalDaemons daemons(names, cleaved);
        const TrainConfig cfg = bench::bench_run_config(model);  // one epoch
        SplitOptions o;
        o.clients = clients;
        o.labels = labels;
        o.encoding = enc;
        daemons.connect(o);
        o.on_listening = [&](const std::string& ep) {
          daemons.start("server", ep);
          for (int i = 0; i < clients; ++i)
            daemons.start(names[static_cast<size_t>(i + 1)], ep,
                          bench::LocalDaemons::data_client_flags(i, clients, per_client * clients));
        };
        const nlohmann::json r = train_split(cfg, o);
        daemons.stop();
        const auto& rd = r["rounds"][0];
        const double up = rd["cut_bytes_up"].get<double>(), down = rd["cut_bytes_down"].get<double>();
        // What the cut layer's size predicts: activations up and their gradients down at the front cut,
        // U-shaped also the server's outputs down and their gradients up; vanilla also 4-byte labels up.
        const double samples = static_cast<double>(per_client * clients);
        const double bytes = static_cast<double>(transport::encoded_element_size(transport::parse_encoding(enc)));
        double predicted = 2 * samples * static_cast<double>(numel(spec.shapes[static_cast<size_t>(layout.cut)])) * bytes;
        if (layout.has_tail()) predicted += 2 * samples * static_cast<double>(numel(spec.shapes[static_cast<size_t>(layout.cut_back)])) * bytes;
        else predicted += 4 * samples;
        if (enc == "f32") f32_total = up + down;
        const double ratio = f32_total > 0 ? (up + down) / f32_total : 0;
        nlohmann::json row = {{"labels", labels},
                              {"encoding", enc},
                              {"clients", clients},
                              {"samples_per_epoch", per_client * clients},
                              {"cut_bytes_up_per_epoch", up},
                              {"cut_bytes_down_per_epoch", down},
                              {"ratio_to_f32", f32_total > 0 ? nlohmann::json(ratio) : nlohmann::json(nullptr)},
                              {"predicted_bytes_per_epoch", predicted},
                              {"seconds_per_epoch", rd["train_seconds"]},
                              {"test_accuracy", r["test_accuracy"]},
                              {"layout", r["layout"]}};
        results.push_back(row);
        std::printf("%-7s %-6s %-14.2f %-14.2f %-9s %-16.2f %-9.2f %-9.4f\n", labels.c_str(), enc.c_str(), up / 1e6,
                    down / 1e6, f32_total > 0 ? (std::to_string(ratio).substr(0, 5) + "x").c_str() : "-",
                    predicted / 1e6, rd["train_seconds"].get<double>(), r["test_accuracy"].get<double>());
        std::fflush(stdout);
      }
    }
    nlohmann::json doc = {{"benchmark", "split"}, {"model", model}, {"results", results}};
    write_json_file(json_path, doc);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_split: error: %s\n", e.what());
    return 1;
  }
}
