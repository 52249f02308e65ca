// test_text_training.cpp: --text in one process. A small GPT
// (tests/fixtures/gpt-micro.json) trained on a generated text: the validation
// loss after every epoch falls, val_loss / val_bits_per_byte / val_losses are
// in the result and reproducible from the seed; a model that is not a
// language model is refused with --text, and a language model without it.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "core/train/local_trainer.h"
#include "core/train/train_config.h"
#include "scratch_dir.h"
#include "text_corpus.h"

using namespace cleave;
using Catch::Contains;

namespace {

TrainConfig text_config(const std::string& text) {
  TrainConfig c;
  c.model_path = std::string(CLEAVE_SOURCE_DIR) + "/tests/fixtures/gpt-micro.json";
  c.text_path = text;
  c.epochs = 3;
  c.batch = 16;
  c.seed = 5;
  c.limit_train = 320;  // windows per epoch: 20 steps
  c.limit_test = 64;
  c.microbatches = 2;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 3e-3f;
  c.threads = 1;
  c.progress = false;
  return c;
}

}  // namespace

TEST_CASE("text: a small GPT's validation loss falls epoch by epoch", "[train][text]") {
  test::TempDir dir;
  const std::string text = dir.file("corpus.txt");
  test::write_generated_text(text, 40000);
  const TrainConfig cfg = text_config(text);
  const nlohmann::json r = train_local(cfg);
  REQUIRE(r["losses"].size() == 60);
  const auto& val = r["val_losses"];
  REQUIRE(val.size() == 3);
  INFO("val_losses " << val.dump());
  CHECK(val[0].get<double>() < std::log(256.0));  // better than a uniform guess after one epoch
  CHECK(val[1].get<double>() < val[0].get<double>());
  CHECK(val[2].get<double>() < val[1].get<double>());
  CHECK(val[2].get<double>() < 0.6 * std::log(256.0));
  CHECK(r["val_loss"].get<double>() == val[2].get<double>());
  CHECK(r["val_bits_per_byte"].get<double>() == Approx(r["val_loss"].get<double>() / std::log(2.0)));
  CHECK(r["test_loss"].get<double>() == r["val_loss"].get<double>());  // kept for compatibility: the same windows
  CHECK(r["test_samples"] == 64);
  CHECK(r["windows_per_epoch"] == 320);
  CHECK(r["text"] == text);
  CHECK(r["losses"][59].get<double>() < r["losses"][0].get<double>());

  TrainConfig one = cfg;
  one.epochs = 1;
  one.microbatches = 1;  // micro-batches add up to the batch: the same first epoch
  const nlohmann::json again = train_local(one);
  REQUIRE(again["losses"].size() == 20);
  for (size_t i = 0; i < 20; ++i) CHECK(again["losses"][i].get<double>() == Approx(r["losses"][i].get<double>()).epsilon(1e-4));
  CHECK(again["val_losses"].size() == 1);
}

TEST_CASE("text: --text needs a language model, and a language model needs --text", "[train][text]") {
  test::TempDir dir;
  const std::string text = dir.file("corpus.txt");
  test::write_generated_text(text, 4000);
  TrainConfig cfg = text_config(text);
  cfg.model_path = std::string(CLEAVE_SOURCE_DIR) + "/models/cnn.json";
  CHECK_THROWS_WITH(train_local(cfg), Contains("cnn.json") && Contains("--text trains a byte-level language model") &&
                                          Contains("not a sequence"));
  cfg = text_config("");
  cfg.dataset = dir.file("none-train.csv");
  CHECK_THROWS_WITH(train_local(cfg), Contains("gpt-micro.json is a byte-level language model") &&
                                          Contains("--text FILE"));
}
