// test_lr_schedule.cpp: learning_rate() against the documented formulas and
// PyTorch's schedulers (literals printed by tests/fixtures/make_optimizer_reference.py).
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>

#include "core/optim/lr_schedule.h"
#include "core/optim/optimizer.h"

using namespace cleave;

TEST_CASE("constant schedule keeps lr", "[optim][schedule]") {
  OptimizerConfig c;
  c.lr = 0.02f;
  for (int64_t s : {0, 1, 7, 100000}) CHECK(learning_rate(c, s) == Approx(0.02f));
}

TEST_CASE("step schedule matches torch StepLR", "[optim][schedule]") {
  OptimizerConfig c;
  c.lr = 0.1f;
  c.schedule = "step";
  c.step_size = 3;
  c.gamma = 0.5f;
  const double torch_lr[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025};  // StepLR(3, 0.5)
  for (int s = 0; s < 8; ++s) {
    CHECK(learning_rate(c, s) == Approx(torch_lr[s]).epsilon(1e-6));
    CHECK(learning_rate(c, s) == Approx(0.1 * std::pow(0.5, s / 3)).epsilon(1e-6));
  }
}

TEST_CASE("cosine schedule matches torch CosineAnnealingLR and clamps at the end", "[optim][schedule]") {
  OptimizerConfig c;
  c.lr = 0.1f;
  c.schedule = "cosine";
  c.total_steps = 10;
  c.min_lr = 0.01f;
  // CosineAnnealingLR(T_max=10, eta_min=0.01)
  const double torch_lr[] = {0.1,          0.0977975432, 0.0914057647, 0.0814503364, 0.0689057647, 0.055,
                             0.0410942353, 0.0285496636, 0.0185942353, 0.0122024568, 0.01};
  for (int s = 0; s <= 10; ++s) {
    CHECK(learning_rate(c, s) == Approx(torch_lr[s]).epsilon(1e-6));
    const double formula = 0.01 + 0.5 * (0.1 - 0.01) * (1 + std::cos(std::numbers::pi * s / 10.0));
    CHECK(learning_rate(c, s) == Approx(formula).epsilon(1e-6));
  }
  CHECK(learning_rate(c, 11) == Approx(0.01f));
  CHECK(learning_rate(c, 1000) == Approx(0.01f));
  CHECK(learning_rate(c, 5) == Approx(0.055f));  // by hand: midpoint of 0.1 and 0.01
}

TEST_CASE("linear warm-up then cosine matches torch SequentialLR", "[optim][schedule]") {
  OptimizerConfig c;
  c.lr = 0.1f;
  c.schedule = "cosine";
  c.warmup_steps = 4;
  c.total_steps = 10;
  // SequentialLR([LinearLR(1/4, total_iters=3), CosineAnnealingLR(6)], milestones=[4])
  const double torch_lr[] = {0.025, 0.05, 0.075, 0.1, 0.1, 0.0933012702, 0.075, 0.05, 0.025, 0.00669872981};
  for (int s = 0; s < 10; ++s) CHECK(learning_rate(c, s) == Approx(torch_lr[s]).epsilon(1e-6));
  CHECK(learning_rate(c, 10) == Approx(0.0).margin(1e-9));
}

TEST_CASE("warm-up applies to constant and step schedules too", "[optim][schedule]") {
  OptimizerConfig c;
  c.lr = 1.0f;
  c.warmup_steps = 2;
  CHECK(learning_rate(c, 0) == Approx(0.5));
  CHECK(learning_rate(c, 1) == Approx(1.0));
  CHECK(learning_rate(c, 2) == Approx(1.0));
  c.schedule = "step";
  c.step_size = 2;
  c.gamma = 0.1f;
  CHECK(learning_rate(c, 0) == Approx(0.5));
  CHECK(learning_rate(c, 2) == Approx(1.0));   // step decay counts from the end of warm-up
  CHECK(learning_rate(c, 3) == Approx(1.0));
  CHECK(learning_rate(c, 4) == Approx(0.1));
  CHECK(learning_rate(c, 6) == Approx(0.01));
}
