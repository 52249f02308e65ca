// test_generate.cpp: `cleave generate` as a user runs it: a micro GPT trained by
// `cleave train --text ... --save`, then sampled. The same seed prints the same
// bytes, greedy ignores the seed, a prompt longer than the context is cropped
// (and says so), a trained model continues in its text's alphabet, and a
// checkpoint of another kind of model or a bad flag is refused with a message.
#include <set>

#include "apps/cli_util.h"
#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/train/train_checkpoint.h"
#include "text_corpus.h"

using namespace cleave;
using namespace cleave::cli_test;

namespace {

const std::string kGptMicro = CLEAVE_SOURCE_DIR "/tests/fixtures/gpt-micro.json";

// Trains gpt-micro for `steps` steps of 16 windows on a generated text and saves it.
std::string trained_checkpoint(TempDir& dir, int steps) {
  const std::string text = dir.file("corpus.txt");
  test::write_generated_text(text, 30000);
  const std::string ck = dir.file("gpt.ckpt");
  const RunResult r = run_cleave("train --local --model '" + kGptMicro + "' --text '" + text +
                                 "' --epochs 1 --batch 16 --limit-train " + std::to_string(16 * steps) +
                                 " --limit-test 16 --optimizer adam --lr 3e-3 --threads 1 --seed 4 --no-progress"
                                 " --save '" + ck + "' --json '" + dir.file("train.json") + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  return ck;
}

// stdout of `cleave generate ARGS` (exit status 0 required); stderr in *messages.
std::string generate(TempDir& dir, const std::string& args, std::string* messages = nullptr) {
  const std::string out = dir.file("generated.txt");
  const std::string err = dir.file("generate.err");
  const RunResult r = run_shell("('" + kCleave + "' generate " + args + " > '" + out + "' 2> '" + err + "')");
  INFO("cleave generate " << args << "\n" << read_bytes(err));
  REQUIRE(r.code == 0);
  if (messages) *messages = read_bytes(err);
  return read_bytes(out);
}

}  // namespace

TEST_CASE("cleave generate: seeded text after the prompt", "[cli][generate]") {
  TempDir dir;
  const std::string ck = trained_checkpoint(dir, 60);
  const std::string base = "--checkpoint '" + ck + "' --prompt 'the red ' --tokens 40";
  const std::string a = generate(dir, base + " --seed 1");
  // The prompt, 40 sampled bytes, a newline.
  REQUIRE(a.size() == 8 + 40 + 1);
  CHECK(a.rfind("the red ", 0) == 0);
  CHECK(a.back() == '\n');
  CHECK(generate(dir, base + " --seed 1") == a);
  CHECK(generate(dir, base + " --seed 2") != a);

  SECTION("greedy: --temperature 0 and --top-k 1 agree and ignore the seed") {
    const std::string g = generate(dir, base + " --temperature 0 --seed 1");
    CHECK(generate(dir, base + " --temperature 0 --seed 9") == g);
    CHECK(generate(dir, base + " --top-k 1 --seed 5") == g);
    // 60 steps on sentences of lower-case words: greedy stays in that alphabet.
    const std::set<char> corpus_bytes = [] {
      const std::string t = test::generated_text(30000);
      return std::set<char>(t.begin(), t.end());
    }();
    for (char c : g.substr(8, 40)) {
      INFO("generated " << g);
      CHECK(corpus_bytes.count(c) == 1);
    }
  }

  SECTION("a prompt longer than the context keeps its last 16 bytes and says so") {
    const std::string tail = "a big cat sees a";  // 16 bytes
    std::string messages;
    const std::string longer =
        generate(dir, "--checkpoint '" + ck + "' --prompt 'one old dog hears " + tail + "' --tokens 12 --seed 3",
                 &messages);
    CHECK(messages.find("the prompt has 34 bytes, the model's context 16: it sees the last 16") != std::string::npos);
    const std::string cropped = generate(dir, "--checkpoint '" + ck + "' --prompt '" + tail + "' --tokens 12 --seed 3");
    CHECK(longer.substr(34) == cropped.substr(16));
  }
}

TEST_CASE("cleave generate refuses a checkpoint of a model that is not a byte-level language model", "[cli][generate]") {
  TempDir dir;
  const ModelSpec cnn = ModelSpec::load(kCnn);
  int64_t params = 0;
  for (int i = 0; i < cnn.num_layers(); ++i) params += make_layer(cnn.layers[i], cnn.shapes[i])->param_count();
  TrainingState st;
  st.model = cnn.to_json();
  st.optimizer = nlohmann::json::object();
  st.optimizer_state = nlohmann::json::object();
  st.batch_size = 32;
  st.params.assign(static_cast<size_t>(params), 0.0f);
  const std::string ck = dir.file("cnn.ckpt");
  save_training_state(ck, st);
  require_failure("generate --checkpoint '" + ck + "' --prompt hi --tokens 5",
                  {"not a byte-level language model", "input is not one sequence of token ids", "cnn",
                   "models/gpt-tiny.json"});
  require_failure("generate --checkpoint '" + dir.file("missing.ckpt") + "' --prompt hi --tokens 5", {"missing.ckpt"});
}

TEST_CASE("cleave generate: bad flags are refused", "[cli][generate]") {
  TempDir dir;
  const std::string ck = trained_checkpoint(dir, 2);
  const std::string base = "generate --checkpoint '" + ck + "'";
  require_usage_error(base + " --prompt hi --tokens -1", {"--tokens must be >= 0"});
  require_usage_error(base + " --prompt hi --tokens 3 --temperature -0.5", {"--temperature must be a finite number >= 0"});
  require_usage_error(base + " --prompt hi --tokens 3 --top-k -2", {"--top-k must be >= 0"});
  require_usage_error(base + " --prompt '' --tokens 3", {"--prompt is empty"});
  require_usage_error(base + " --tokens 3", {"--prompt"});
  require_usage_error("generate --prompt hi --tokens 3", {"--checkpoint"});
  require_usage_error(base + " --prompt hi --tokens three", {"--tokens"});
  require_help_lists("generate", {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--seed"});
}

TEST_CASE("cleave demo --model gpt trains gpt-tiny across three encrypted daemons and prints a sample", "[cli][demo]") {
  TempDir dir;
  const std::string text = dir.file("corpus.txt");
  test::write_generated_text(text, 60000);
  const RunResult r = run_shell("cd '" CLEAVE_SOURCE_DIR "' && '" + kCleave + "' demo --model gpt --text '" + text +
                                "' --max-steps 6 --batch 16 --limit-test 16 --json '" + dir.file("demo.json") + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const nlohmann::json j = read_json(dir.file("demo.json"));
  CHECK(j["mode"] == "demo");
  CHECK(j["plan"].size() == 3);  // three daemons, a stage each
  CHECK(j["steps"] == 6);
  CHECK(std::isfinite(j["val_loss"].get<double>()));
  const size_t at = r.output.find("a sample (cleave generate");
  REQUIRE(at != std::string::npos);
  const size_t q = r.output.find("\nQ: ", at);
  REQUIRE(q != std::string::npos);
  CHECK(r.output.size() >= q + 4 + 200);  // the prompt, then 200 sampled bytes
  require_usage_error("demo --text '" + text + "'", {"--text goes with --model gpt"});
}
