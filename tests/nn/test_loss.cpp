// test_loss.cpp: cross-entropy and MSE values against host references, their
// gradients by finite differences, label checks, and micro-batch additivity.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/nn/loss.h"
#include "nn/nn_test_util.h"

using namespace cleave;
using namespace cleave::test;
using Catch::Matchers::Contains;

namespace {

// Host reference: per-row loss summed, and argmax matches.
LossResult host_loss(LossKind kind, const std::vector<float>& out, const std::vector<float>& tgt, int64_t rows,
                     int64_t cols) {
  LossResult r;
  for (int64_t i = 0; i < rows; ++i) {
    const float* o = &out[i * cols];
    if (kind == LossKind::cross_entropy) {
      double mx = o[0];
      int64_t arg = 0;
      for (int64_t j = 1; j < cols; ++j)
        if (o[j] > mx) mx = o[j], arg = j;
      double z = 0;
      for (int64_t j = 0; j < cols; ++j) z += std::exp(o[j] - mx);
      const auto label = static_cast<int64_t>(tgt[i]);
      r.loss_sum += std::log(z) + mx - o[label];
      r.correct += arg == label;
    } else {
      for (int64_t j = 0; j < cols; ++j) r.loss_sum += (double(o[j]) - tgt[i * cols + j]) * (o[j] - tgt[i * cols + j]);
    }
  }
  return r;
}

std::vector<float> random_labels(Rng& rng, int64_t rows, int64_t classes) {
  std::vector<float> t(rows);
  for (float& v : t) v = static_cast<float>(rng.below(classes));
  return t;
}

std::string loss_error(LossKind kind, const Tensor& out, const Tensor& tgt) {
  Tensor d(cpu(), out.shape());
  try {
    compute_loss(cpu(), kind, out, tgt, d, 1.0f);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("losses: values, accuracy and finite-difference gradients", "[nn][loss][gradcheck]") {
  Rng rng(77);
  for (LossKind kind : {LossKind::cross_entropy, LossKind::mse}) {
    for (int t = 0; t < 3; ++t) {
      const int64_t rows = 1 + static_cast<int64_t>(rng.below(4)), cols = 2 + static_cast<int64_t>(rng.below(5));
      const Shape shape = t == 2 && kind == LossKind::mse ? Shape{rows, 1, cols} : Shape{rows, cols};
      const auto out = random_normal(rng, rows * cols, 2.0f);
      const auto tgt = kind == LossKind::cross_entropy ? random_labels(rng, rows, cols) : random_normal(rng, rows * cols);
      const Shape tshape = kind == LossKind::cross_entropy ? Shape{rows} : shape;
      const float scale = 1.0f / static_cast<float>(rows);
      INFO(loss_name(kind) << " " << shape_str(shape));

      Tensor o = upload(cpu(), shape, out), g = upload(cpu(), tshape, tgt), d(cpu(), shape);
      const LossResult got = compute_loss(cpu(), kind, o, g, d, scale);
      const LossResult want = host_loss(kind, out, tgt, rows, cols);
      CHECK(got.loss_sum == Approx(want.loss_sum).epsilon(1e-5));
      CHECK(got.correct == want.correct);
      const LossResult ev = evaluate_loss(cpu(), kind, o, g);
      CHECK(ev.loss_sum == Approx(got.loss_sum).epsilon(1e-6));
      CHECK(ev.correct == got.correct);

      // d(scale * loss_sum) / d(output) by central differences
      const auto ana = d.to_host();
      std::vector<float> pert = out;
      const float eps = 1e-2f;
      for (size_t i = 0; i < pert.size(); ++i) {
        pert[i] = out[i] + eps;
        const double lp = evaluate_loss(cpu(), kind, upload(cpu(), shape, pert), g).loss_sum;
        pert[i] = out[i] - eps;
        const double lm = evaluate_loss(cpu(), kind, upload(cpu(), shape, pert), g).loss_sum;
        pert[i] = out[i];
        const double num = scale * (lp - lm) / (double(out[i] + eps) - double(out[i] - eps));
        INFO("element " << i);
        CHECK(std::fabs(num - ana[i]) <= 3e-4 + 3e-3 * std::fabs(num));
      }
    }
  }
}

TEST_CASE("losses: micro-batch gradients add up to the full-batch gradient", "[nn][loss]") {
  Rng rng(78);
  const int64_t rows = 6, cols = 5;
  const auto out = random_normal(rng, rows * cols);
  const auto labels = random_labels(rng, rows, cols);
  const float scale = 1.0f / rows;
  Tensor o = upload(cpu(), {rows, cols}, out), l = upload(cpu(), {rows}, labels), d(cpu(), {rows, cols});
  const LossResult full = compute_loss(cpu(), LossKind::cross_entropy, o, l, d, scale);
  const auto full_grad = d.to_host();
  double sum = 0;
  int64_t correct = 0;
  for (int64_t start : {0, 2}) {
    const int64_t n = start == 0 ? 2 : 4;
    std::vector<float> os(out.begin() + start * cols, out.begin() + (start + n) * cols);
    std::vector<float> ls(labels.begin() + start, labels.begin() + start + n);
    Tensor dm(cpu(), {n, cols});
    const LossResult part = compute_loss(cpu(), LossKind::cross_entropy, upload(cpu(), {n, cols}, os),
                                         upload(cpu(), {n}, ls), dm, scale);
    sum += part.loss_sum;
    correct += part.correct;
    const auto gm = dm.to_host();
    for (int64_t i = 0; i < n * cols; ++i) CHECK(gm[i] == Approx(full_grad[start * cols + i]).margin(1e-7));
  }
  CHECK(sum == Approx(full.loss_sum).epsilon(1e-6));
  CHECK(correct == full.correct);
}

TEST_CASE("losses: PyTorch MSELoss(mean) is grad_scale = 1/(rows*cols)", "[nn][loss]") {
  // pred - target = 1 everywhere: MSELoss(mean) = 1 and its gradient is 2/(rows*cols).
  const int64_t rows = 2, cols = 4;
  Tensor p = upload(cpu(), {rows, cols}, std::vector<float>(8, 3.0f));
  Tensor t = upload(cpu(), {rows, cols}, std::vector<float>(8, 2.0f)), d(cpu(), {rows, cols});
  const LossResult r = compute_loss(cpu(), LossKind::mse, p, t, d, 1.0f / (rows * cols));
  CHECK(r.loss_sum / (rows * cols) == Approx(1.0));
  for (float v : d.to_host()) CHECK(v == Approx(2.0 / 8));
  CHECK(r.correct == 0);
}

TEST_CASE("losses: bad labels and shapes are refused with a clear message", "[nn][loss][errors]") {
  Tensor out = upload(cpu(), {3, 4}, std::vector<float>(12, 0.5f));
  CHECK_THAT(loss_error(LossKind::cross_entropy, out, upload(cpu(), {3}, {0, 4, 1})),
             Contains("label 4 at row 1") && Contains("[0, 4)"));
  CHECK_THAT(loss_error(LossKind::cross_entropy, out, upload(cpu(), {3}, {0, 1, -1})), Contains("label -1 at row 2"));
  CHECK_THAT(loss_error(LossKind::cross_entropy, out, upload(cpu(), {3}, {0.5f, 1, 1})), Contains("label 0.5 at row 0"));
  CHECK_THAT(loss_error(LossKind::cross_entropy, out, upload(cpu(), {3}, {0, NAN, 1})), Contains("at row 1"));
  CHECK_THAT(loss_error(LossKind::cross_entropy, out, upload(cpu(), {2}, {0, 1})), Contains("targets must be (3)"));
  CHECK_THAT(loss_error(LossKind::mse, out, upload(cpu(), {4, 3}, std::vector<float>(12, 0))),
             Contains("mse: targets (4, 3)"));
  Tensor labels = upload(cpu(), {3}, {0, 1, 2}), wrong(cpu(), {3, 5});
  CHECK_THROWS_WITH(compute_loss(cpu(), LossKind::cross_entropy, out, labels, wrong, 1.0f), Contains("doutput"));
  CHECK(loss_error(LossKind::cross_entropy, out, labels) == "(no error)");
}
