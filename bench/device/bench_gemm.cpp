// bench_gemm.cpp: GEMM rate (GFLOP/s) of a device at square and convolution-like
// shapes, through Device::gemm. Prints a table and writes JSON.
//
//   bench_gemm [--device cpu|opencl|cuda|auto] [--threads N] [--seconds S] [--json PATH]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/json_file.h"
#include "device/device.h"

namespace {

struct GemmShape {
  const char* label;
  int64_t m, n, k;
  bool trans_a, trans_b;
};

void usage() {
  std::cerr << "usage: bench_gemm [--device NAME] [--threads N] [--seconds S] [--json PATH]\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cpu", json_path = "bench-gemm.json";
  cleave::DeviceOptions opts;
  double seconds = 0.3;  // time spent per shape
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "bench_gemm: " << arg << " needs a value\n";
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (arg == "--device") device_name = value();
      else if (arg == "--threads") opts.threads = std::stoi(value());
      else if (arg == "--seconds") seconds = std::stod(value());
      else if (arg == "--json") json_path = value();
      else if (arg == "--help" || arg == "-h") {
        usage();
        return 0;
      } else {
        std::cerr << "bench_gemm: unknown argument '" << arg << "'\n";
        usage();
        return 2;
      }
    } catch (const std::exception&) {
      std::cerr << "bench_gemm: bad value for " << arg << "\n";
      return 2;
    }
  }

  std::unique_ptr<cleave::Device> dev;
  try {
    dev = cleave::open_device(device_name, opts);
  } catch (const std::exception& e) {
    std::cerr << "bench_gemm: " << e.what() << "\n";
    return 1;
  }

  // Square sizes, then the GEMMs of a small CNN / MLP training step (batch 64):
  // conv forward (cout, n*oh*ow, cin*k*k), conv weight grad (A * B^T), data grad (A^T * B).
  const std::vector<GemmShape> shapes = {
      {"square", 128, 128, 128, false, false},      {"square", 256, 256, 256, false, false},
      {"square", 512, 512, 512, false, false},      {"square", 1024, 1024, 1024, false, false},
      {"conv fwd", 32, 64 * 28 * 28, 9, false, false}, {"conv fwd", 64, 64 * 14 * 14, 288, false, false},
      {"conv dW", 64, 288, 64 * 14 * 14, false, true}, {"conv dX", 288, 64 * 14 * 14, 64, true, false},
      {"linear fwd", 64, 128, 3136, false, true},    {"linear dW", 128, 3136, 64, true, false},
  };

  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  nlohmann::json results = nlohmann::json::array();
  std::printf("device: %s\n", dev->name().c_str());
  std::printf("%-11s %6s %7s %6s %3s %3s %10s %10s\n", "shape", "m", "n", "k", "tA", "tB", "ms/call", "GFLOP/s");
  for (const GemmShape& s : shapes) {
    const int64_t rows_a = s.trans_a ? s.k : s.m, cols_a = s.trans_a ? s.m : s.k;
    const int64_t rows_b = s.trans_b ? s.n : s.k, cols_b = s.trans_b ? s.k : s.n;
    cleave::Tensor a(*dev, {rows_a, cols_a}), b(*dev, {rows_b, cols_b}), c(*dev, {s.m, s.n});
    std::vector<float> host(static_cast<size_t>(std::max(a.numel(), b.numel())));
    for (float& x : host) x = dist(gen);
    a.from_host(host.data());
    b.from_host(host.data());
    dev->fill(c, 0.f);
    auto run = [&] { dev->gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.f, a, cols_a, b, cols_b, 0.f, c, s.n); };
    run();  // warm-up
    dev->synchronize();
    int64_t calls = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    do {
      run();
      ++calls;
      dev->synchronize();
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (elapsed < seconds);
    const double per_call = elapsed / static_cast<double>(calls);
    const double gflops = 2.0 * static_cast<double>(s.m * s.n) * static_cast<double>(s.k) / per_call / 1e9;
    std::printf("%-11s %6lld %7lld %6lld %3s %3s %10.3f %10.1f\n", s.label, static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k), s.trans_a ? "T" : "N",
                s.trans_b ? "T" : "N", per_call * 1e3, gflops);
    results.push_back({{"shape", s.label}, {"m", s.m}, {"n", s.n}, {"k", s.k}, {"trans_a", s.trans_a},
                       {"trans_b", s.trans_b}, {"calls", calls}, {"ms_per_call", per_call * 1e3},
                       {"gflops", gflops}});
  }
  nlohmann::json out = {{"benchmark", "gemm"}, {"device", dev->name()}, {"results", results}};
  try {
    cleave::write_json_file(json_path, out);
  } catch (const std::exception& e) {
    std::cerr << "bench_gemm: cannot write the results: " << e.what() << "\n";
    return 1;
  }
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
}
