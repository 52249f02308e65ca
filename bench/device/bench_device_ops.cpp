// bench_device_ops.cpp: time of the hot non-GEMM ops of a CNN training step
// (batch 64, 32 channels of 28x28, 3x3 convolutions) on one device.
// Prints a table and writes JSON.
//
//   bench_device_ops [--device cpu|opencl|cuda|auto] [--threads N] [--seconds S] [--json PATH]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/json_file.h"
#include "device/cpu/process_env.h"
#include "device/device.h"

namespace {

void usage() { std::cerr << "usage: bench_device_ops [--device NAME] [--threads N] [--seconds S] [--json PATH]\n"; }

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  std::string device_name = "cpu", json_path = "bench-device-ops.json";
  cleave::DeviceOptions opts;
  double seconds = 0.2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage();
      return 0;
    }
    if (i + 1 >= argc) {
      std::cerr << "bench_device_ops: unknown argument or missing value: '" << arg << "'\n";
      usage();
      return 2;
    }
    const std::string value = argv[++i];
    try {
      if (arg == "--device") device_name = value;
      else if (arg == "--threads") opts.threads = std::stoi(value);
      else if (arg == "--seconds") seconds = std::stod(value);
      else if (arg == "--json") json_path = value;
      else {
        std::cerr << "bench_device_ops: unknown argument '" << arg << "'\n";
        usage();
        return 2;
      }
    } catch (const std::exception&) {
      std::cerr << "bench_device_ops: bad value for " << arg << ": '" << value << "'\n";
      return 2;
    }
  }
  std::unique_ptr<cleave::Device> dev;
  try {
    dev = cleave::open_device(device_name, opts);
  } catch (const std::exception& e) {
    std::cerr << "bench_device_ops: " << e.what() << "\n";
    return 1;
  }
  cleave::Device& d = *dev;

  cleave::Window2d conv{64, 32, 28, 28, 3, 3, 1, 1, 1, 1};
  cleave::Window2d pool{64, 32, 28, 28, 2, 2, 2, 2, 0, 0};
  const int64_t n = conv.n, c = conv.c, hw = conv.h * conv.w;
  const int64_t act = n * c * hw;
  const int64_t rows = c * conv.kh * conv.kw, cols = n * conv.out_h() * conv.out_w();
  const int64_t pooled = n * c * pool.out_h() * pool.out_w();
  const int64_t params = 1 << 20;

  cleave::Tensor x(d, {n, c, conv.h, conv.w}), y(d, {n, c, conv.h, conv.w}), dy(d, {n, c, conv.h, conv.w});
  cleave::Tensor colbuf(d, {rows, cols}), bias(d, {c}), py(d, {pooled}), parg(d, {pooled});
  cleave::Tensor p(d, {params}), g(d, {params}), m(d, {params}), v(d, {params});
  for (const auto* t : {&x, &y, &dy, &colbuf, &bias, &p, &g, &m, &v}) d.fill(*t, 0.5f);
  d.maxpool_forward(x, py, parg, pool);

  struct Op {
    const char* name;
    double bytes;  // bytes moved per call (reads + writes), for an effective bandwidth
    std::function<void()> run;
  };
  const double f = sizeof(float);
  int64_t step = 0;
  const std::vector<Op> ops = {
      {"im2col 3x3", f * (act + rows * cols), [&] { d.im2col(x, colbuf, conv); }},
      {"col2im 3x3", f * (act + rows * cols), [&] { d.col2im(colbuf, y, conv); }},
      {"swap_axes01", f * 2 * act, [&] { d.swap_axes01(x, y, c, n, hw); }},
      {"add_bias_channels", f * 2 * act, [&] { d.add_bias_channels(y, bias, n, c, hw); }},
      {"bias_grad_channels", f * act, [&] { d.bias_grad_channels(dy, bias, n, c, hw); }},
      {"relu forward", f * 2 * act, [&] { d.activation_forward(cleave::Activation::relu, x, y); }},
      {"relu backward", f * 3 * act, [&] { d.activation_backward(cleave::Activation::relu, x, y, dy, y); }},
      {"gelu forward", f * 2 * act, [&] { d.activation_forward(cleave::Activation::gelu, x, y); }},
      {"maxpool 2x2 forward", f * (act + 2 * pooled), [&] { d.maxpool_forward(x, py, parg, pool); }},
      {"maxpool 2x2 backward", f * (act + 2 * pooled), [&] { d.maxpool_backward(py, parg, y, pool); }},
      {"sgd momentum 1M", f * 5 * params,
       [&] {
         cleave::SgdStep s;
         s.momentum = 0.9f;
         s.first = step++ == 0;
         d.sgd_step(p, g, m, s);
       }},
      {"adam 1M", f * 7 * params,
       [&] {
         cleave::AdamStep s;
         s.step = ++step;
         d.adam_step(p, g, m, v, s);
       }},
      {"axpy 1M", f * 3 * params, [&] { d.axpy(0.1f, g, p); }},
  };

  nlohmann::json results = nlohmann::json::array();
  std::printf("device: %s\n%-22s %10s %10s\n", d.name().c_str(), "op", "ms/call", "GB/s");
  for (const Op& op : ops) {
    op.run();
    d.synchronize();
    int64_t calls = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    do {
      op.run();
      ++calls;
      d.synchronize();
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (elapsed < seconds);
    const double per_call = elapsed / static_cast<double>(calls);
    std::printf("%-22s %10.3f %10.2f\n", op.name, per_call * 1e3, op.bytes / per_call / 1e9);
    results.push_back({{"op", op.name}, {"calls", calls}, {"ms_per_call", per_call * 1e3},
                       {"gb_per_s", op.bytes / per_call / 1e9}});
  }
  nlohmann::json out = {{"benchmark", "device_ops"}, {"device", d.name()}, {"results", results}};
  try {
    cleave::write_json_file(json_path, out);
  } catch (const std::exception& e) {
    std::cerr << "bench_device_ops: cannot write the results: " << e.what() << "\n";
    return 1;
  }
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
}
