// replay_main.cpp: runs the fuzz target without libFuzzer (any compiler):
//   replay_main [--mutations N] FILE_OR_DIR...   replays every input, then N
//                                                deterministic mutations of each
//   replay_main --write-seeds DIR                writes one seed per message kind
// This is the fuzz run that is part of every test suite; scripts/run-fuzz.sh
// does the coverage-guided run with clang.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "transport/message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;
using namespace cleave::transport;

namespace {

std::vector<Message> seed_messages() {
  std::vector<Message> out;
  auto add = [&](Body body) {
    Message m;
    m.request_id = out.size() + 1;
    m.body = std::move(body);
    out.push_back(std::move(m));
  };
  add(RegisterMsg{"pi-4", {"cpu", "opencl:0"}, 4ull << 30, 3ull << 30, 12.5, "tcp://10.0.0.2:7000",
                  "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", "0.1.0", "{}"});
  AssignMsg a;
  a.stage = 1;
  a.num_stages = 3;
  a.layer_begin = 2;
  a.layer_end = 5;
  a.model_spec_json = "{\"layers\":[]}";
  a.prev = PeerInfo{"tcp://10.0.0.1:7000", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", "a"};
  a.link_encoding = Encoding::kF16;
  add(a);
  add(HeartbeatMsg{7, 1700000000000});
  add(CommandMsg{CheckpointCmd{StateKind::kParamsAndOptimizer}});
  add(CommandMsg{StepCmd{12, 64}});
  add(CommandMsg{FedRoundCmd{3, 2, 32, 0.01f, std::nullopt}});
  add(CommandMsg{SplitRoundCmd{SplitPhase::kEval, 1, {0, 1, 0}}});
  add(CommandMsg{ProfileCmd{"{\"layers\":[]}", 16, OptimizerSpec{}}});
  add(AckMsg{3, "ok"});
  add(ErrorMsg{ErrorCode::kShapeMismatch, "bad shape", 4});
  add(MetricsMsg{0, 10, 12.5, 30, 64, 1.5, 0, 0, SplitPhase::kTrain, 0});
  std::vector<float> v = {1.0f, -2.5f, 3.25f, 0.0f, 100.0f, -0.001f};
  for (Encoding e : {Encoding::kF32, Encoding::kF16, Encoding::kInt8}) {
    TensorMsg t;
    t.kind = TensorKind::kGradient;
    t.step = 3;
    t.micro_batch = 1;
    t.shape = {2, 3};
    t.encoding = e;
    out.push_back(make_tensor_message(t, std::make_shared<const std::vector<float>>(v)));
  }
  // Zero-copy: the message keeps its own copy of the values alive (over `v`, the
  // seed read freed memory once this function returned, and changed run to run).
  const auto weights = std::make_shared<const std::vector<float>>(v);
  out.push_back(make_weights_message(WeightsMsg{0, 2, 100, 0}, weights->data(), weights->size(), weights));
  out.push_back(make_probe_message(1, 16, true));
  SecAggMsg keys;
  keys.round = 2;
  keys.phase = SecAggPhase::kKeys;
  keys.items = {{1, std::vector<uint8_t>(32, 3), std::vector<uint8_t>(32, 4), std::vector<uint8_t>(64, 5)}};
  add(keys);
  SecAggMsg unmask;
  unmask.round = 2;
  unmask.phase = SecAggPhase::kUnmask;
  unmask.survivors = {1, 2};
  unmask.dropped = {3};
  add(unmask);
  out.push_back(make_secagg_masked_message(2, 64, {1, 2, 3}));
  add(CommandMsg{FedRoundCmd{3, 1, 32, 0, SecAggSetup{2, {{"", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", "a"},
                                                        {"", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", "b"}},
                                                  16, 24, 0, 0, true}}});
  // A zero-bubble stage that recomputes (issue 17's fields of the pipeline job).
  AssignMsg zb = a;
  zb.job = PipelineJob{2, 8, 5, 32, 99, 1, true};
  add(zb);
  return out;
}

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "--write-seeds") {
    fs::create_directories(args[1]);
    int i = 0;
    for (const Message& m : seed_messages()) {
      const auto header = encode_header(m);
      const auto bytes = fuzz::join_input(header, m.payloads);
      std::ofstream out(fs::path(args[1]) / ("seed-" + std::string(body_kind_name(m.body)) + "-" +
                                             std::to_string(i++)), std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    std::printf("wrote %d seeds to %s\n", i, args[1].c_str());
    return 0;
  }
  long mutations = 0;
  std::vector<fs::path> files;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--mutations" && i + 1 < args.size()) {
      mutations = std::stol(args[++i]);
    } else if (fs::is_directory(args[i])) {
      for (const auto& e : fs::directory_iterator(args[i]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.push_back(args[i]);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "replay_main: no inputs\n");
    return 2;
  }
  std::mt19937_64 rng(12345);
  long runs = 0;
  for (const auto& f : files) {
    const std::vector<uint8_t> input = read_file(f);
    LLVMFuzzerTestOneInput(input.data(), input.size());
    ++runs;
    for (long k = 0; k < mutations; ++k) {
      std::vector<uint8_t> m = input;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !m.empty(); ++e) {
        const size_t at = rng() % m.size();
        switch (rng() % 4) {
          case 0: m[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;         // bit flip
          case 1: m[at] = static_cast<uint8_t>(rng()); break;                      // byte set
          case 2: m.resize(at); break;                                             // truncate
          default: m.insert(m.begin() + static_cast<long>(at), static_cast<uint8_t>(rng())); break;
        }
      }
      LLVMFuzzerTestOneInput(m.data(), m.size());
      ++runs;
    }
  }
  std::printf("replayed %ld inputs from %zu files: no crash\n", runs, files.size());
  return 0;
}
