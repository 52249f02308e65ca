// test_op_checks.cpp: the argument checks shared by every backend
// (device/op_checks.h), called directly and through the CPU device's ops. Each op
// group gets bad arguments; the error must be std::invalid_argument starting
// "cpu <op>: " and saying what is wrong. Good arguments must pass.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "device/cpu/cpu_device.h"
#include "device/device.h"
#include "device/op_checks.h"
#include "device/tensor.h"

using namespace cleave;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

// The message of the std::invalid_argument that f throws.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not std::invalid_argument) ") + e.what();
  }
  return "(nothing thrown)";
}

Window2d window(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t s, int64_t p) {
  Window2d g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.kh = k, g.kw = k, g.sh = s, g.sw = s, g.ph = p, g.pw = p;
  return g;
}

}  // namespace

TEST_CASE("op_error names the backend and the op", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  const std::invalid_argument e = op_error(dev, "gemm", "something is wrong");
  CHECK(std::string(e.what()) == "cpu gemm: something is wrong");
}

TEST_CASE("memory op checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}}, other{DeviceOptions{1, 0, 0, ""}};
  Tensor x(dev, {4}), small(dev, {3}), elsewhere(other, {4}), empty(dev, {0});
  CHECK_THAT(error_of([&] { check_upload(dev, x, nullptr); }), StartsWith("cpu upload: ") && Contains("null source"));
  CHECK_THAT(error_of([&] { dev.download(x, nullptr); }),
             StartsWith("cpu download: ") && Contains("null destination"));
  CHECK_THAT(error_of([&] { dev.upload(elsewhere, nullptr); }),
             StartsWith("cpu upload: ") && Contains("dst lives on another device"));
  CHECK_THAT(error_of([&] { dev.copy(x, small); }),
             StartsWith("cpu copy: ") && Contains("dst (3) has 3 elements, expected 4"));
  CHECK_THAT(error_of([&] { dev.fill(Tensor(), 0.f); }), StartsWith("cpu fill: ") && Contains("tensor is undefined"));
  CHECK_THAT(error_of([&] { dev.sum_squares(elsewhere); }), StartsWith("cpu sum_squares: "));
  CHECK_NOTHROW(check_upload(dev, empty, nullptr));  // nothing to read
  CHECK_NOTHROW(check_copy(dev, x, x));
}

TEST_CASE("gemm checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  Tensor a(dev, {16}), c(dev, {16}), small(dev, {3});
  CHECK_THAT(error_of([&] { dev.gemm(false, false, 4, 4, 4, 1.f, a, 3, a, 4, 0.f, c, 4); }),
             StartsWith("cpu gemm: ") && Contains("leading dimension too small (lda 3"));
  CHECK_THAT(error_of([&] { check_gemm(dev, false, false, -1, 4, 4, a, 4, a, 4, c, 4); }),
             StartsWith("cpu gemm: ") && Contains("negative dimension -1"));
  CHECK_THAT(error_of([&] { check_gemm(dev, false, false, 1, 1, int64_t{1} << 31, a, int64_t{1} << 31, a, 1, c, 1); }),
             StartsWith("cpu gemm: ") && Contains("BLAS integer range"));
  CHECK_THAT(error_of([&] { dev.gemm(false, false, 4, 4, 4, 1.f, small, 4, a, 4, 0.f, c, 4); }),
             StartsWith("cpu gemm: ") && Contains("A (3) has 3 elements, needs 16"));
  CHECK_THAT(error_of([&] { dev.gemm(true, false, 4, 4, 4, 1.f, a, 4, a, 4, 0.f, small, 4); }),
             StartsWith("cpu gemm: ") && Contains("C (3) has 3 elements, needs 16"));
  // Only what the op reads is checked: nothing when m or n is 0, C alone when k is 0.
  CHECK_NOTHROW(check_gemm(dev, false, false, 0, 4, 4, Tensor(), 4, Tensor(), 4, Tensor(), 4));
  CHECK_NOTHROW(check_gemm(dev, false, false, 4, 4, 0, Tensor(), 1, Tensor(), 4, c, 4));
}

TEST_CASE("elementwise and activation checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}}, other{DeviceOptions{1, 0, 0, ""}};
  Tensor x(dev, {8}), small(dev, {3}), elsewhere(other, {8});
  CHECK_THAT(error_of([&] { dev.axpy(1.f, elsewhere, x); }),
             StartsWith("cpu axpy: ") && Contains("x lives on another device"));
  CHECK_THAT(error_of([&] { dev.scale(Tensor(), 2.f); }), StartsWith("cpu scale: ") && Contains("x is undefined"));
  CHECK_THAT(error_of([&] { dev.mul(x, small, x); }),
             StartsWith("cpu mul: ") && Contains("b (3) has 3 elements, expected 8"));
  CHECK_THAT(error_of([&] { dev.activation_forward(Activation::gelu, x, small); }),
             StartsWith("cpu activation_forward: ") && Contains("y (3)"));
  CHECK_THAT(error_of([&] { dev.activation_forward(static_cast<Activation>(42), x, x); }),
             StartsWith("cpu activation_forward: ") && Contains("unknown activation"));
  // tanh's derivative reads y, gelu's reads x, relu's x or else y.
  CHECK_THAT(error_of([&] { dev.activation_backward(Activation::tanh, x, Tensor(), x, x); }),
             StartsWith("cpu activation_backward: ") && Contains("y is undefined"));
  CHECK_THAT(error_of([&] { dev.activation_backward(Activation::gelu, Tensor(), x, x, x); }),
             StartsWith("cpu activation_backward: ") && Contains("x is undefined"));
  CHECK_THAT(error_of([&] { dev.activation_backward(Activation::relu, Tensor(), small, x, x); }),
             StartsWith("cpu activation_backward: ") && Contains("y (x being undefined) (3)"));
  CHECK_NOTHROW(check_activation_backward(dev, Activation::relu, Tensor(), x, x, x));
}

TEST_CASE("bias checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  Tensor y(dev, {8}), small(dev, {3});
  CHECK_THAT(error_of([&] { dev.add_bias_rows(y, small, 2, 4); }),
             StartsWith("cpu add_bias_rows: ") && Contains("b (3) has 3 elements, needs 4"));
  CHECK_THAT(error_of([&] { dev.bias_grad_rows(y, small, -2, 4); }),
             StartsWith("cpu bias_grad_rows: ") && Contains("negative dimension -2"));
  CHECK_THAT(error_of([&] { dev.add_bias_channels(small, y, 1, 2, 4); }),
             StartsWith("cpu add_bias_channels: ") && Contains("y (3) has 3 elements, needs 8"));
  CHECK_THAT(error_of([&] { dev.bias_grad_channels(y, small, 1, 4, 2); }),
             StartsWith("cpu bias_grad_channels: ") && Contains("db (3) has 3 elements, needs 4"));
}

TEST_CASE("convolution helper checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  Tensor x(dev, {16}), cols(dev, {64}), small(dev, {3});
  const Window2d too_big = window(1, 1, 3, 3, 5, 1, 0);
  CHECK_THAT(error_of([&] { dev.im2col(x, cols, too_big); }),
             StartsWith("cpu im2col: ") && Contains("invalid window (input 1x1x3x3, kernel 5x5"));
  const Window2d g = window(1, 1, 4, 4, 2, 1, 0);  // cols (4, 9)
  CHECK_THAT(error_of([&] { dev.im2col(x, small, g); }),
             StartsWith("cpu im2col: ") && Contains("cols (3) has 3 elements, needs 36"));
  CHECK_THAT(error_of([&] { dev.col2im(cols, small, g); }),
             StartsWith("cpu col2im: ") && Contains("dx (3) has 3 elements, needs 16"));
  CHECK_NOTHROW(check_im2col(dev, x, cols, g));
}

TEST_CASE("conv2d op checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  const Window2d g = window(2, 3, 4, 4, 3, 1, 1);  // x (2,3,4,4) -> y (2,5,4,4) with 5 out channels
  Tensor x(dev, {2, 3, 4, 4}), w(dev, {5, 27}), b(dev, {5}), y(dev, {2, 5, 4, 4}), small(dev, {3});
  CHECK_NOTHROW(check_conv2d_forward(dev, x, w, b, y, g, 5));
  CHECK_NOTHROW(check_conv2d_forward(dev, x, w, Tensor(), y, g, 5));  // no bias
  CHECK_NOTHROW(check_conv2d_backward(dev, x, w, y, w, Tensor(), Tensor(), g, 5));  // no db, no dx
  CHECK_THAT(error_of([&] { dev.conv2d_forward(x, w, b, y, g, 0); }),
             StartsWith("cpu conv2d_forward: ") && Contains("out channels must be > 0"));
  CHECK_THAT(error_of([&] { dev.conv2d_forward(x, small, b, y, g, 5); }),
             StartsWith("cpu conv2d_forward: ") && Contains("w (3) has 3 elements, needs 135"));
  CHECK_THAT(error_of([&] { dev.conv2d_forward(x, w, small, y, g, 5); }),
             StartsWith("cpu conv2d_forward: ") && Contains("b (3) has 3 elements, needs 5"));
  CHECK_THAT(error_of([&] { dev.conv2d_backward(x, w, y, w, b, small, g, 5); }),
             StartsWith("cpu conv2d_backward: ") && Contains("dx (3) has 3 elements, needs 96"));
  CHECK_THAT(error_of([&] { dev.conv2d_backward(x, w, small, w, b, x, g, 5); }),
             StartsWith("cpu conv2d_backward: ") && Contains("dy (3) has 3 elements, needs 160"));
  CHECK_THAT(error_of([&] { dev.conv2d_forward(x, w, b, y, window(2, 3, 2, 2, 5, 1, 0), 5); }),
             StartsWith("cpu conv2d_forward: ") && Contains("invalid window"));
}

TEST_CASE("swap_axes01 checks overlap the same way on every backend", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  Tensor buf(dev, {32});
  Tensor lo = Tensor::view(buf, 0, {8}), shifted = Tensor::view(buf, 4, {8}), apart = Tensor::view(buf, 16, {8});
  CHECK_THAT(error_of([&] { dev.swap_axes01(lo, lo, 2, 2, 2); }),
             StartsWith("cpu swap_axes01: ") && Contains("must not overlap"));
  // A partial overlap is refused too (it used to be missed on the CPU).
  CHECK_THAT(error_of([&] { dev.swap_axes01(lo, shifted, 2, 2, 2); }),
             StartsWith("cpu swap_axes01: ") && Contains("must not overlap"));
  // Two host tensors over the same memory are seen as overlapping as well.
  std::vector<float> host(8, 0.f);
  Tensor w1 = Tensor::wrap_host(dev, host.data(), {8}), w2 = Tensor::wrap_host(dev, host.data() + 2, {6});
  CHECK_THAT(error_of([&] { static_cast<void>(check_swap_axes01(dev, w1, w2, 3, 2, 1)); }),
             Contains("must not overlap"));
  // In place with a or b == 1 is the identity: nothing to do, no error.
  CHECK_FALSE(check_swap_axes01(dev, lo, lo, 1, 4, 2));
  CHECK(check_swap_axes01(dev, lo, apart, 2, 2, 2));
  CHECK_THAT(error_of([&] { dev.swap_axes01(lo, apart, 2, -2, 2); }),
             StartsWith("cpu swap_axes01: ") && Contains("negative dimension -2"));
}

TEST_CASE("pooling checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  Tensor x(dev, {16}), y(dev, {4}), small(dev, {3});
  const Window2d g = window(1, 1, 4, 4, 2, 2, 0);  // y (1, 1, 2, 2)
  const Window2d zero_stride = window(1, 1, 4, 4, 2, 0, 0);
  CHECK_THAT(error_of([&] { dev.maxpool_forward(x, y, y, zero_stride); }),
             StartsWith("cpu maxpool_forward: ") && Contains("invalid window") && Contains("stride 0x0"));
  CHECK_THAT(error_of([&] { dev.maxpool_forward(x, y, small, g); }),
             StartsWith("cpu maxpool_forward: ") && Contains("argmax (3) has 3 elements, needs 4"));
  CHECK_THAT(error_of([&] { dev.maxpool_backward(y, y, small, g); }),
             StartsWith("cpu maxpool_backward: ") && Contains("dx (3) has 3 elements, needs 16"));
  CHECK_THAT(error_of([&] { dev.avgpool_forward(small, y, g); }),
             StartsWith("cpu avgpool_forward: ") && Contains("x (3) has 3 elements, needs 16"));
  CHECK_THAT(error_of([&] { dev.avgpool_backward(small, x, g); }),
             StartsWith("cpu avgpool_backward: ") && Contains("dy (3) has 3 elements, needs 4"));
}

TEST_CASE("layer norm checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  Tensor a(dev, {8}), small(dev, {3});
  CHECK_THAT(error_of([&] { dev.layernorm_forward(a, a, a, a, a, a, 2, 0, 1e-5f); }),
             StartsWith("cpu layernorm_forward: ") && Contains("cols must be > 0"));
  CHECK_THAT(error_of([&] { dev.layernorm_forward(a, small, a, a, a, a, 2, 4, 1e-5f); }),
             StartsWith("cpu layernorm_forward: ") && Contains("gamma (3) has 3 elements, needs 4"));
  CHECK_THAT(error_of([&] { dev.layernorm_backward(a, a, a, a, a, a, a, small, 2, 4); }),
             StartsWith("cpu layernorm_backward: ") && Contains("dbeta (3) has 3 elements, needs 4"));
}

TEST_CASE("loss checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  Tensor logits(dev, {2, 4}), labels(dev, {2}), small(dev, {3});
  CHECK_THAT(error_of([&] { dev.softmax_xent(logits, labels, labels, Tensor(), 2, 0, 1.f); }),
             StartsWith("cpu softmax_xent: ") && Contains("classes must be > 0"));
  CHECK_THAT(error_of([&] { dev.softmax_xent(logits, labels, labels, small, 2, 4, 1.f); }),
             StartsWith("cpu softmax_xent: ") && Contains("dlogits (3) has 3 elements, needs 8"));
  CHECK_THAT(error_of([&] { dev.mse(logits, small, labels, Tensor(), 2, 4, 1.f); }),
             StartsWith("cpu mse: ") && Contains("target (3) has 3 elements, needs 8"));
  CHECK_THAT(error_of([&] { dev.argmax_match(logits, labels, Tensor(), 2, 4); }),
             StartsWith("cpu argmax_match: ") && Contains("correct is undefined"));
  // Optional gradients are not checked when undefined.
  CHECK_NOTHROW(check_mse(dev, logits, logits, labels, Tensor(), 2, 4));
}

TEST_CASE("optimizer checks", "[device][errors]") {
  CpuDevice dev{DeviceOptions{1, 0, 0, ""}};
  Tensor p(dev, {8}), small(dev, {3});
  SgdStep sgd;
  sgd.momentum = 0.9f;
  CHECK_THAT(error_of([&] { dev.sgd_step(p, p, Tensor(), sgd); }),
             StartsWith("cpu sgd_step: ") && Contains("momentum_buf is undefined"));
  sgd.momentum = 0.f;
  CHECK_NOTHROW(check_sgd_step(dev, p, p, Tensor(), sgd));
  AdamStep adam;
  CHECK_THAT(error_of([&] { dev.adam_step(p, p, small, p, adam); }),
             StartsWith("cpu adam_step: ") && Contains("m (3) has 3 elements, expected 8"));
  adam.step = 0;
  CHECK_THAT(error_of([&] { dev.adam_step(p, p, p, p, adam); }),
             StartsWith("cpu adam_step: ") && Contains("step must be >= 1, got 0"));
}
