// test_optimizer.cpp: SGD / Adam / AdamW steps against PyTorch.
//
// Each case runs 3 steps on a 5-element block and checks the result twice:
// against a double-precision re-implementation of PyTorch's update rules
// (written out below), and against literal values printed by torch itself
// (tests/fixtures/make_optimizer_reference.py). A few values are derived by hand.
//
// PyTorch's rules (torch.optim, default flags), g = gradient, t = 1-based step:
//   SGD:   d = g + wd*p;  buf = d (t = 1) else momentum*buf + (1 - dampening)*d
//          u = nesterov ? d + momentum*buf : buf   (u = d without momentum)
//          p -= lr*u
//   Adam:  g += wd*p (Adam) | p *= 1 - lr*wd (AdamW)
//          m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//          p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "core/optim/optimizer.h"
#include "device/device.h"

using namespace cleave;

namespace {

const std::vector<float> kP0 = {0.5f, -1.0f, 2.0f, 0.0f, -0.25f};
const std::vector<std::vector<float>> kGrads = {
    {0.1f, -0.2f, 0.3f, 1.0f, -0.5f},
    {0.05f, 0.4f, -0.3f, 0.5f, 0.0f},
    {-0.2f, 0.1f, 0.25f, -1.5f, 0.75f},
};

std::unique_ptr<Device> cpu() {
  DeviceOptions o;
  o.threads = 1;
  return open_device("cpu", o);
}

// PyTorch's update rules in double (see the file comment).
std::vector<double> reference(const OptimizerConfig& c, const std::vector<std::vector<float>>& grads) {
  std::vector<double> p(kP0.begin(), kP0.end());
  const size_t n = p.size();
  std::vector<double> buf(n, 0), m(n, 0), v(n, 0);
  for (size_t t = 0; t < grads.size(); ++t) {
    const double lr = learning_rate(c, static_cast<int64_t>(t));
    for (size_t i = 0; i < n; ++i) {
      double g = grads[t][i];
      if (c.kind == "sgd") {
        const double d = g + c.weight_decay * p[i];
        double u = d;
        if (c.momentum != 0) {
          buf[i] = t == 0 ? d : c.momentum * buf[i] + (1 - c.dampening) * d;
          u = c.nesterov ? d + c.momentum * buf[i] : buf[i];
        }
        p[i] -= lr * u;
      } else {
        if (c.kind == "adamw") {
          p[i] *= 1 - lr * c.weight_decay;
        } else {
          g += c.weight_decay * p[i];
        }
        m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
        v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
        const double step = static_cast<double>(t + 1);
        const double mhat = m[i] / (1 - std::pow(static_cast<double>(c.beta1), step));
        const double vhat = v[i] / (1 - std::pow(static_cast<double>(c.beta2), step));
        p[i] -= lr * mhat / (std::sqrt(vhat) + c.eps);
      }
    }
  }
  return p;
}

// Runs `grads` through an Optimizer on the CPU device; returns the parameters.
std::vector<float> run(const OptimizerConfig& c, const std::vector<std::vector<float>>& grads,
                       std::vector<float> p0 = kP0) {
  auto dev = cpu();
  const auto n = static_cast<int64_t>(p0.size());
  Tensor params(*dev, {n}), g(*dev, {n});
  params.from_host(p0);
  Optimizer opt(*dev, c, n);
  for (const auto& gv : grads) {
    g.from_host(gv);
    opt.step(params, g);
  }
  CHECK(opt.steps_taken() == static_cast<int64_t>(grads.size()));
  return params.to_host();
}

void check_case(const OptimizerConfig& c, const std::vector<float>& torch_values) {
  const std::vector<float> got = run(c, kGrads);
  const std::vector<double> ref = reference(c, kGrads);
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(ref[i]).margin(2e-6));
    CHECK(got[i] == Approx(torch_values[i]).margin(2e-6));
  }
}

OptimizerConfig sgd(float lr, float momentum = 0, bool nesterov = false) {
  OptimizerConfig c;
  c.kind = "sgd";
  c.lr = lr;
  c.momentum = momentum;
  c.nesterov = nesterov;
  return c;
}

}  // namespace

TEST_CASE("SGD matches PyTorch", "[optim]") {
  SECTION("plain") {
    check_case(sgd(0.1f), {0.504999995f, -1.02999997f, 1.97500002f, -3.7252903e-09f, -0.275000006f});
  }
  SECTION("momentum 0.9") {
    check_case(sgd(0.1f, 0.9f), {0.483400017f, -1.03180003f, 1.95070004f, -0.215999991f, -0.189500004f});
  }
  SECTION("nesterov momentum 0.9") {
    check_case(sgd(0.1f, 0.9f, true), {0.490060002f, -1.0586201f, 1.93062997f, -0.194399998f, -0.220550001f});
  }
  SECTION("dampening and weight decay") {
    OptimizerConfig c = sgd(0.05f, 0.8f);
    c.dampening = 0.3f;
    c.weight_decay = 0.01f;
    check_case(c, {0.490557283f, -1.00210845f, 1.96916664f, -0.100930884f, -0.214731693f});
  }
}

TEST_CASE("SGD momentum by hand", "[optim]") {
  // p = 1, g = 1 every step, lr 0.1, momentum 0.9:
  //   buf 1, 1.9, 2.71 -> p 0.9, 0.71, 0.439
  //   nesterov: u = 1 + 0.9*buf = 1.9, 2.71, 3.439 -> p 0.81, 0.539, 0.1951
  const std::vector<std::vector<float>> ones(3, std::vector<float>{1.f});
  CHECK(run(sgd(0.1f, 0.9f), ones, {1.f})[0] == Approx(0.439f).margin(1e-6));
  CHECK(run(sgd(0.1f, 0.9f, true), ones, {1.f})[0] == Approx(0.1951f).margin(1e-6));
  CHECK(run(sgd(0.1f, 0.9f), {{1.f}, {1.f}}, {1.f})[0] == Approx(0.71f).margin(1e-6));
}

TEST_CASE("Adam and AdamW match PyTorch", "[optim]") {
  SECTION("adam") {
    OptimizerConfig c;
    c.lr = 0.01f;
    check_case(c, {0.482741773f, -0.997817576f, 1.98763192f, -0.0185020268f, -0.235745177f});
  }
  SECTION("adam with L2 weight decay, custom betas and eps") {
    OptimizerConfig c;
    c.lr = 0.01f;
    c.beta1 = 0.8f;
    c.beta2 = 0.99f;
    c.eps = 1e-6f;
    c.weight_decay = 0.1f;
    check_case(c, {0.479716063f, -0.991959751f, 1.97819304f, -0.0173945539f, -0.23628141f});
  }
  SECTION("adamw") {
    OptimizerConfig c;
    c.kind = "adamw";
    c.lr = 0.01f;
    c.weight_decay = 0.1f;
    check_case(c, {0.481272608f, -0.994836986f, 1.98165751f, -0.0184727162f, -0.235022634f});
  }
}

TEST_CASE("Adam first step by hand", "[optim]") {
  // Step 1: m/(1-b1) = g and v/(1-b2) = g^2, so p -= lr * g / (|g| + eps) ~= lr * sign(g).
  OptimizerConfig c;
  c.lr = 0.1f;
  const std::vector<float> p = run(c, {{2.f, -3.f}}, {1.f, 1.f});
  CHECK(p[0] == Approx(0.9f).margin(1e-6));
  CHECK(p[1] == Approx(1.1f).margin(1e-6));
  // AdamW decays first: p = 1 * (1 - 0.1 * 0.5) - 0.1 = 0.85.
  c.kind = "adamw";
  c.weight_decay = 0.5f;
  CHECK(run(c, {{2.f}}, {1.f})[0] == Approx(0.85f).margin(1e-6));
}

TEST_CASE("the schedule drives each step's learning rate", "[optim]") {
  // Plain SGD with g = 1: p decreases by exactly lr(step) each step.
  OptimizerConfig c = sgd(1.0f);
  c.schedule = "step";
  c.step_size = 2;
  c.gamma = 0.5f;
  auto dev = cpu();
  Tensor p(*dev, {1}), g(*dev, {1});
  p.from_host(std::vector<float>{10.f});
  g.from_host(std::vector<float>{1.f});
  Optimizer opt(*dev, c, 1);
  const float expected_lr[] = {1.f, 1.f, 0.5f, 0.5f, 0.25f};
  float expected = 10.f;
  for (float lr : expected_lr) {
    CHECK(opt.current_lr() == Approx(lr));
    opt.step(p, g);
    expected -= lr;
    CHECK(p.to_host()[0] == Approx(expected));
  }
}

TEST_CASE("optimizer state round-trips through state_meta / load_state", "[optim]") {
  for (const char* kind : {"sgd", "adam", "adamw"}) {
    DYNAMIC_SECTION(kind) {
      OptimizerConfig c;
      c.kind = kind;
      c.lr = 0.01f;
      if (c.kind == "sgd") c.momentum = 0.9f;
      c.weight_decay = 0.01f;
      auto dev = cpu();
      const int64_t n = static_cast<int64_t>(kP0.size());
      // Uninterrupted: 3 steps.
      Tensor p(*dev, {n}), g(*dev, {n});
      p.from_host(kP0);
      Optimizer a(*dev, c, n);
      for (int t = 0; t < 2; ++t) {
        g.from_host(kGrads[static_cast<size_t>(t)]);
        a.step(p, g);
      }
      // Snapshot after 2 steps, as a checkpoint would.
      const nlohmann::json meta = a.state_meta();
      std::vector<std::vector<float>> blocks;
      for (const Tensor& s : a.state()) blocks.push_back(s.to_host());
      CHECK(blocks.size() == (c.kind == "sgd" ? 1u : 2u));
      CHECK(meta.at("steps_taken") == 2);
      const std::vector<float> p_mid = p.to_host();
      g.from_host(kGrads[2]);
      a.step(p, g);
      const std::vector<float> p_end = p.to_host();

      // Resumed: fresh optimizer, load the snapshot, one more step.
      Tensor q(*dev, {n});
      q.from_host(p_mid);
      Optimizer b(*dev, c, n);
      b.load_state(meta, blocks);
      CHECK(b.steps_taken() == 2);
      CHECK(b.current_lr() == a.config().lr);
      b.step(q, g);
      CHECK(q.to_host() == p_end);  // bit-identical
    }
  }
}

TEST_CASE("load_state refuses mismatched state", "[optim]") {
  auto dev = cpu();
  OptimizerConfig adam;
  Optimizer a(*dev, adam, 4);
  const nlohmann::json meta = a.state_meta();
  const std::vector<std::vector<float>> blocks(2, std::vector<float>(4, 0.f));

  OptimizerConfig s = sgd(0.1f, 0.9f);
  Optimizer b(*dev, s, 4);
  CHECK_THROWS_WITH(b.load_state(meta, blocks), Catch::Contains("holds \"adam\" optimizer state") &&
                                                     Catch::Contains("'sgd'"));
  Optimizer c(*dev, adam, 5);
  CHECK_THROWS_WITH(c.load_state(meta, blocks), Catch::Contains("for 4 parameters, this model has 5"));
  Optimizer d(*dev, adam, 4);
  CHECK_THROWS_WITH(d.load_state(meta, {blocks[0]}), Catch::Contains("expected 2 state blocks, got 1"));
  CHECK_THROWS_WITH(d.load_state(meta, {blocks[0], std::vector<float>(3)}),
                    Catch::Contains("'exp_avg_sq' has 3 floats, expected 4"));
  CHECK(d.steps_taken() == 0);
  Optimizer plain(*dev, sgd(0.1f), 4);
  CHECK_THROWS_WITH(b.load_state(plain.state_meta(), {}), Catch::Contains("was momentum changed?"));
  CHECK_THROWS_WITH(d.load_state(nlohmann::json::object(), blocks), Catch::Contains("no 'kind' field"));
}

TEST_CASE("step refuses wrong sizes", "[optim]") {
  auto dev = cpu();
  Optimizer opt(*dev, OptimizerConfig{}, 4);
  Tensor p(*dev, {4}), g(*dev, {3});
  CHECK_THROWS_WITH(opt.step(p, g), Catch::Contains("expected 4 parameters and gradients, got 4 and 3"));
  CHECK(opt.steps_taken() == 0);
}

TEST_CASE("optimizer state is allocated at construction", "[optim]") {
  auto dev = cpu();
  CHECK(Optimizer(*dev, sgd(0.1f), 10).state().empty());
  CHECK(Optimizer(*dev, sgd(0.1f, 0.5f), 10).state().size() == 1);
  const auto st = Optimizer(*dev, OptimizerConfig{}, 10).state();
  REQUIRE(st.size() == 2);
  CHECK(st[0].numel() == 10);
  CHECK(st[1].to_host() == std::vector<float>(10, 0.f));
}

TEST_CASE("optimizer_state_count is the number of state buffers the optimizer allocates", "[optim]") {
  auto dev = cpu();
  for (const char* kind : {"sgd", "adam", "adamw"})
    for (float momentum : {0.f, 0.9f}) {
      OptimizerConfig c = sgd(0.1f, momentum);
      c.kind = kind;
      INFO(kind << " momentum " << momentum);
      const int count = optimizer_state_count(c);
      CHECK(count == optimizer_state_count(kind, momentum));
      CHECK(static_cast<int>(Optimizer(*dev, c, 7).state().size()) == count);
      CHECK(static_cast<int>(optimizer_state_names(c).size()) == count);
    }
  CHECK(optimizer_state_count("sgd", 0) == 0);
  CHECK(optimizer_state_count("sgd", 0.5) == 1);
  CHECK(optimizer_state_count("adam", 0) == 2);
  CHECK_THROWS_WITH(optimizer_state_count("lion", 0), Catch::Contains("unknown optimizer 'lion'"));
}

TEST_CASE("OptimizerConfig::validate names the problem", "[optim][config]") {
  auto fails = [](auto edit, const std::string& text) {
    OptimizerConfig c;
    edit(c);
    CHECK_THROWS_WITH(c.validate(), Catch::Contains(text));
  };
  fails([](auto& c) { c.kind = "rmsprop"; }, "unknown kind 'rmsprop' (valid: sgd, adam, adamw)");
  fails([](auto& c) { c.schedule = "poly"; }, "unknown schedule 'poly' (valid: constant, step, cosine)");
  fails([](auto& c) { c.lr = 0; }, "lr must be > 0");
  fails([](auto& c) { c.lr = -1e-3f; }, "lr must be > 0");
  fails([](auto& c) { c.lr = NAN; }, "lr must be > 0");
  fails([](auto& c) { c.kind = "sgd"; c.momentum = 1.0f; }, "momentum must be in [0, 1)");
  fails([](auto& c) { c.kind = "sgd"; c.momentum = -0.1f; }, "momentum must be in [0, 1)");
  fails([](auto& c) { c.kind = "sgd"; c.nesterov = true; }, "nesterov needs momentum > 0");
  fails([](auto& c) { c.kind = "sgd"; c.nesterov = true; c.momentum = 0.9f; c.dampening = 0.1f; },
        "nesterov needs momentum > 0 and dampening = 0");
  fails([](auto& c) { c.weight_decay = -1; }, "weight_decay must be >= 0");
  fails([](auto& c) { c.beta2 = 1.0f; }, "beta2 must be in [0, 1)");
  fails([](auto& c) { c.eps = 0; }, "eps must be > 0");
  fails([](auto& c) { c.schedule = "cosine"; }, "cosine schedule needs total_steps > 0");
  fails([](auto& c) { c.schedule = "cosine"; c.total_steps = 10; c.warmup_steps = 10; }, "must be < total_steps");
  fails([](auto& c) { c.schedule = "cosine"; c.total_steps = 10; c.min_lr = 1; }, "min_lr must be in [0, lr]");
  fails([](auto& c) { c.schedule = "step"; c.step_size = 0; }, "step_size must be > 0");
  fails([](auto& c) { c.schedule = "step"; c.gamma = 0; }, "gamma must be in (0, 1]");
  fails([](auto& c) { c.warmup_steps = -1; }, "warmup_steps must be >= 0");
  OptimizerConfig ok;
  CHECK_NOTHROW(ok.validate());
  auto dev = cpu();
  OptimizerConfig bad;
  bad.lr = 0;
  CHECK_THROWS_AS(Optimizer(*dev, bad, 3), std::invalid_argument);
}

TEST_CASE("OptimizerConfig JSON round-trip and errors", "[optim][config]") {
  OptimizerConfig c;
  c.kind = "sgd";
  c.lr = 0.05f;
  c.momentum = 0.9f;
  c.nesterov = true;
  c.schedule = "cosine";
  c.total_steps = 500;
  c.warmup_steps = 20;
  c.min_lr = 1e-4f;
  const OptimizerConfig back = OptimizerConfig::from_json(c.to_json());
  CHECK(back.to_json() == c.to_json());
  CHECK(back.nesterov);
  CHECK(back.total_steps == 500);

  const auto d = OptimizerConfig::from_json({{"kind", "adamw"}, {"weight_decay", 0.01}});
  CHECK(d.kind == "adamw");
  CHECK(d.weight_decay == Approx(0.01f));
  CHECK(d.lr == Approx(1e-3f));  // untouched fields keep defaults

  CHECK_THROWS_WITH(OptimizerConfig::from_json({{"learning_rate", 0.1}}),
                    Catch::Contains("unknown field 'learning_rate'") && Catch::Contains("lr"));
  CHECK_THROWS_WITH(OptimizerConfig::from_json({{"lr", "fast"}}), Catch::Contains("lr: expected a number"));
  CHECK_THROWS_WITH(OptimizerConfig::from_json({{"total_steps", 1.5}}),
                    Catch::Contains("total_steps: expected an integer"));
  CHECK_THROWS_WITH(OptimizerConfig::from_json({{"nesterov", 1}}), Catch::Contains("nesterov: expected true or false"));
  CHECK_THROWS_WITH(OptimizerConfig::from_json({{"kind", "lamb"}}), Catch::Contains("unknown kind 'lamb'"));
  CHECK_THROWS_WITH(OptimizerConfig::from_json(nlohmann::json::array()), Catch::Contains("expected a JSON object"));
}
