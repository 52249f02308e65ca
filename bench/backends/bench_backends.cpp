// bench_backends.cpp: per-backend GEMM rate against the backend's own GEMM library,
// and per-backend training throughput of the MLP and the CNN, in one run.
//
//   bench_backends [--backends cpu,opencl,cuda] [--seconds S] [--reps R] [--steps N]
//                  [--threads T] [--ordinal I] [--models-dir D] [--json PATH]
//
// For each backend that opens (the others are skipped with a printed note):
//  1. GEMM. For each shape, Device::gemm on cleave Tensors, and the library the
//     backend is built on, called directly on buffers this program allocates
//     itself: cblas_sgemm (OpenBLAS) for cpu, clblast::Gemm<float> on an OpenCL
//     context and queue of our own (same device as the backend picks) for opencl,
//     cublasSgemm on our own cuBLAS handle and stream for cuda. A timed batch is
//     a calibrated number of calls followed by a synchronize; repetitions of the
//     two alternate, so both see the same machine load; the rate is the median
//     GFLOP/s (2*m*n*k per call) over repetitions, and ratio = cleave / library.
//     Afterwards both compute C once from the same inputs and the largest
//     difference (relative to max |C|) is reported: a rate of a wrong GEMM is no rate.
//  2. Training. models/mlp.json at batch 128 and models/cnn.json at batch 64 on
//     synthetic data (inputs in [0, 1), random labels, fixed seed), the loop of
//     core/train/local_trainer.cpp: upload, forward, softmax cross-entropy,
//     backward, Adam (lr 1e-3), zero_grad; each timed repetition ends with a
//     synchronize. Steps per repetition are calibrated so that all repetitions
//     take about --seconds (at least one step each: PoCL is slow); samples/s is
//     the median over repetitions.
// Prints one table and writes JSON (default bench-backends.json). The exit status
// is 1 when no backend could be measured or a measurement failed.
#include <cblas.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#if CLEAVE_HAVE_OPENCL
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <clblast.h>
#endif
#if CLEAVE_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

#include "bench/common/synthetic_training.h"
#include "core/io/json_file.h"
#include "device/cpu/process_env.h"
#include "bench/common/bench_args.h"
#include "core/model/model_spec.h"
#include "core/model/partition.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"
#include "core/util/rng.h"
#include "core/util/seconds.h"
#include "device/device.h"

#ifndef CLEAVE_SOURCE_DIR
#define CLEAVE_SOURCE_DIR "."
#endif

namespace {

namespace bench = cleave::bench;

using cleave::seconds_since;
using cleave::Shape;
using cleave::Tensor;
using nlohmann::json;
using Clock = std::chrono::steady_clock;


using cleave::bench::load_average;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// options

struct Options {
  std::vector<std::string> backends{"cpu", "opencl", "cuda"};
  std::vector<bench::ModelRun> models{{"mlp", 128}, {"cnn", 64}};
  double seconds = 2.0;  // timed seconds per (GEMM shape, implementation) and per training run, all reps
  int reps = 5;
  int64_t steps = 0;  // training steps per repetition; 0 = calibrate to `seconds`
  int warmup = 2;     // untimed training steps before calibration
  int threads = 0;    // CPU threads (cleave's CPU device and OpenBLAS); 0 = all cores
  int ordinal = 0;    // GPU / OpenCL device number
  uint64_t seed = 1;
  std::string models_dir = std::string(CLEAVE_SOURCE_DIR) + "/models";
  std::string json_path = "bench-backends.json";
};

void usage(std::ostream& os) {
  os << "usage: bench_backends [options]\n"
        "  --backends L      comma-separated backends: cpu, opencl, cuda (default cpu,opencl,cuda;\n"
        "                    --backend is the same option); one that does not open is skipped\n"
        "  --seconds S       timed seconds per GEMM shape and implementation, and per training\n"
        "                    run, over all repetitions (default 2)\n"
        "  --reps R          repetitions; medians are reported (default 5)\n"
        "  --steps N         training steps per repetition (default: calibrated to --seconds)\n"
        "  --warmup W        untimed training steps first (default 2)\n"
        "  --models L        comma-separated: mlp, cnn, optionally NAME:BATCH (default mlp:128,cnn:64)\n"
        "  --threads T       CPU threads of the cpu backend and OpenBLAS (default: all cores)\n"
        "  --ordinal I       which GPU / OpenCL device (default 0)\n"
        "  --seed S          seed of the synthetic data, weights and GEMM inputs (default 1)\n"
        "  --models-dir D    folder holding mlp.json and cnn.json (default <source>/models)\n"
        "  --json PATH       where to write the results (default bench-backends.json)\n";
}

[[noreturn]] void bad_args(const std::string& msg) {
  std::cerr << "bench_backends: " << msg << "\n";
  usage(std::cerr);
  std::exit(2);
}

Options parse_options_or_throw(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_args(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--backends" || arg == "--backend") {
      o.backends.clear();
      for (const std::string& b : bench::split_text(value(), ',')) {
        if (b != "cpu" && b != "opencl" && b != "cuda")
          bad_args(arg + ": unknown backend '" + b + "' (expected cpu, opencl or cuda)");
        if (std::find(o.backends.begin(), o.backends.end(), b) == o.backends.end()) o.backends.push_back(b);
      }
      if (o.backends.empty()) bad_args(arg + " is empty");
    } else if (arg == "--models") {
      o.models = bench::parse_model_runs(value());
    } else if (arg == "--seconds") {
      o.seconds = bench::parse_positive_arg(arg, value());
    } else if (arg == "--reps") {
      o.reps = static_cast<int>(bench::parse_int_arg(arg, value(), 1));
    } else if (arg == "--steps") {
      o.steps = bench::parse_int_arg(arg, value(), 1);
    } else if (arg == "--warmup") {
      o.warmup = static_cast<int>(bench::parse_int_arg(arg, value(), 0));
    } else if (arg == "--threads") {
      o.threads = static_cast<int>(bench::parse_int_arg(arg, value(), 1));
    } else if (arg == "--ordinal") {
      o.ordinal = static_cast<int>(bench::parse_int_arg(arg, value(), 0));
    } else if (arg == "--seed") {
      o.seed = static_cast<uint64_t>(bench::parse_int_arg(arg, value(), 0));
    } else if (arg == "--models-dir") {
      o.models_dir = value();
    } else if (arg == "--json") {
      o.json_path = value();
    } else if (arg == "--help" || arg == "-h") {
      usage(std::cout);
      std::exit(0);
    } else {
      bad_args("unknown argument '" + arg + "'");
    }
  }
  return o;
}

Options parse_options(int argc, char** argv) {
  try {
    return parse_options_or_throw(argc, argv);
  } catch (const std::invalid_argument& e) {
    bad_args(e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM shapes

struct GemmShape {
  const char* what;  // where the shape comes from
  bool ta, tb;
  int64_t m, n, k;
  int64_t rows_a() const { return ta ? k : m; }
  int64_t cols_a() const { return ta ? m : k; }
  int64_t rows_b() const { return tb ? n : k; }
  int64_t cols_b() const { return tb ? k : n; }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  std::string label() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " + (ta ? "T" : "N") +
           (tb ? "T" : "N");
  }
};

// MLP linear forward at batch 128 (y = x W^T), the square reference, and the second
// convolution of models/cnn.json at batch 64 (64 channels over 11x11 outputs, 32*3*3
// patch rows): forward W * cols and weight gradient dY * cols^T.
const std::vector<GemmShape> kShapes = {
    {"mlp linear fwd", false, true, 128, 1024, 1024},
    {"square", false, false, 1024, 1024, 1024},
    {"cnn conv2 fwd", false, false, 64, 64 * 121, 288},
    {"cnn conv2 dW", false, true, 64, 288, 64 * 121},
};

// The backend's own GEMM library, on buffers it allocates itself (row-major like Device::gemm).
class LibraryGemm {
 public:
  virtual ~LibraryGemm() = default;
  virtual std::string name() const = 0;
  // Allocates A, B, C for `s` and uploads a (rows_a x cols_a) and b (rows_b x cols_b).
  virtual void prepare(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b) = 0;
  virtual void run() = 0;  // one C = A*B call (may be asynchronous)
  virtual void synchronize() = 0;
  virtual std::vector<float> result() = 0;  // C (m x n), after waiting
};

class BlasGemm final : public LibraryGemm {
 public:
  std::string name() const override { return std::string("cblas_sgemm (") + openblas_get_config() + ")"; }
  void prepare(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b) override {
    s_ = s;
    a_ = a;
    b_ = b;
    c_.assign(static_cast<size_t>(s.m * s.n), 0.f);
  }
  void run() override {
    cblas_sgemm(CblasRowMajor, s_.ta ? CblasTrans : CblasNoTrans, s_.tb ? CblasTrans : CblasNoTrans,
                static_cast<int>(s_.m), static_cast<int>(s_.n), static_cast<int>(s_.k), 1.0f, a_.data(),
                static_cast<int>(s_.cols_a()), b_.data(), static_cast<int>(s_.cols_b()), 0.0f, c_.data(),
                static_cast<int>(s_.n));
  }
  void synchronize() override {}
  std::vector<float> result() override { return c_; }

 private:
  GemmShape s_{};
  std::vector<float> a_, b_, c_;
};

#if CLEAVE_HAVE_OPENCL
void cl_check(cl_int err, const char* call) {
  if (err != CL_SUCCESS) throw std::runtime_error(std::string("OpenCL: ") + call + " failed with error " + std::to_string(err));
}

std::string cl_device_name(cl_device_id d) {
  size_t len = 0;
  clGetDeviceInfo(d, CL_DEVICE_NAME, 0, nullptr, &len);
  std::string s(len, '\0');
  clGetDeviceInfo(d, CL_DEVICE_NAME, len, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

// clblast::Gemm<float> on a context, queue and buffers of its own. The device is
// chosen as OpenclDevice chooses (GPUs of all platforms first, then the others
// that are available and have a compiler), number `ordinal`.
class ClblastGemm final : public LibraryGemm {
 public:
  explicit ClblastGemm(int ordinal) {
    cl_uint np = 0;
    cl_check(clGetPlatformIDs(0, nullptr, &np), "clGetPlatformIDs");
    std::vector<cl_platform_id> platforms(np);
    cl_check(clGetPlatformIDs(np, platforms.data(), nullptr), "clGetPlatformIDs");
    std::vector<cl_device_id> gpus, others;
    for (cl_platform_id p : platforms) {
      cl_uint nd = 0;
      if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS || nd == 0) continue;
      std::vector<cl_device_id> devs(nd);
      if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, devs.data(), nullptr) != CL_SUCCESS) continue;
      for (cl_device_id d : devs) {
        cl_device_type type = 0;
        cl_bool available = CL_FALSE, compiler = CL_FALSE;
        clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof type, &type, nullptr);
        clGetDeviceInfo(d, CL_DEVICE_AVAILABLE, sizeof available, &available, nullptr);
        clGetDeviceInfo(d, CL_DEVICE_COMPILER_AVAILABLE, sizeof compiler, &compiler, nullptr);
        if (!available || !compiler) continue;
        ((type & CL_DEVICE_TYPE_GPU) ? gpus : others).push_back(d);
      }
    }
    gpus.insert(gpus.end(), others.begin(), others.end());
    if (ordinal >= static_cast<int>(gpus.size()))
      throw std::runtime_error("OpenCL device " + std::to_string(ordinal) + " not found (" +
                               std::to_string(gpus.size()) + " usable)");
    device_ = gpus[static_cast<size_t>(ordinal)];
    cl_int err = CL_SUCCESS;
    context_ = clCreateContext(nullptr, 1, &device_, nullptr, nullptr, &err);
    cl_check(err, "clCreateContext");
    queue_ = clCreateCommandQueue(context_, device_, 0, &err);
    cl_check(err, "clCreateCommandQueue");
  }
  ~ClblastGemm() override {
    release_buffers();
    if (queue_) clReleaseCommandQueue(queue_);
    if (context_) clReleaseContext(context_);
  }
  ClblastGemm(const ClblastGemm&) = delete;
  ClblastGemm& operator=(const ClblastGemm&) = delete;

  std::string name() const override { return "clblast::Gemm<float> (" + cl_device_name(device_) + ")"; }
  void prepare(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b) override {
    release_buffers();
    s_ = s;
    a_ = make_buffer(a.size());
    b_ = make_buffer(b.size());
    c_ = make_buffer(static_cast<size_t>(s.m * s.n));
    cl_check(clEnqueueWriteBuffer(queue_, a_, CL_TRUE, 0, a.size() * sizeof(float), a.data(), 0, nullptr, nullptr),
             "clEnqueueWriteBuffer");
    cl_check(clEnqueueWriteBuffer(queue_, b_, CL_TRUE, 0, b.size() * sizeof(float), b.data(), 0, nullptr, nullptr),
             "clEnqueueWriteBuffer");
  }
  void run() override {
    const clblast::StatusCode st = clblast::Gemm<float>(
        clblast::Layout::kRowMajor, s_.ta ? clblast::Transpose::kYes : clblast::Transpose::kNo,
        s_.tb ? clblast::Transpose::kYes : clblast::Transpose::kNo, static_cast<size_t>(s_.m),
        static_cast<size_t>(s_.n), static_cast<size_t>(s_.k), 1.0f, a_, 0, static_cast<size_t>(s_.cols_a()), b_, 0,
        static_cast<size_t>(s_.cols_b()), 0.0f, c_, 0, static_cast<size_t>(s_.n), &queue_, nullptr);
    if (st != clblast::StatusCode::kSuccess)
      throw std::runtime_error("clblast::Gemm failed with status " + std::to_string(static_cast<int>(st)));
  }
  void synchronize() override { cl_check(clFinish(queue_), "clFinish"); }
  std::vector<float> result() override {
    std::vector<float> c(static_cast<size_t>(s_.m * s_.n));
    cl_check(clEnqueueReadBuffer(queue_, c_, CL_TRUE, 0, c.size() * sizeof(float), c.data(), 0, nullptr, nullptr),
             "clEnqueueReadBuffer");
    return c;
  }

 private:
  cl_mem make_buffer(size_t floats) {
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(context_, CL_MEM_READ_WRITE, std::max<size_t>(1, floats) * sizeof(float), nullptr, &err);
    cl_check(err, "clCreateBuffer");
    return m;
  }
  void release_buffers() {
    for (cl_mem* m : {&a_, &b_, &c_})
      if (*m) {
        clReleaseMemObject(*m);
        *m = nullptr;
      }
  }
  cl_device_id device_ = nullptr;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  cl_mem a_ = nullptr, b_ = nullptr, c_ = nullptr;
  GemmShape s_{};
};
#endif  // CLEAVE_HAVE_OPENCL

#if CLEAVE_HAVE_CUDA
void cuda_check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + call + ": " + cudaGetErrorString(e));
}
void cublas_check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS: ") + call + " failed with status " + std::to_string(static_cast<int>(s)));
}

// cublasSgemm on a handle, stream and cudaMalloc'ed buffers of its own. Row-major
// C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands swap.
class CublasGemm final : public LibraryGemm {
 public:
  explicit CublasGemm(int ordinal) {
    cuda_check(cudaSetDevice(ordinal), "cudaSetDevice");
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    gpu_ = prop.name;
    cuda_check(cudaStreamCreate(&stream_), "cudaStreamCreate");
    cublas_check(cublasCreate(&handle_), "cublasCreate");
    cublas_check(cublasSetStream(handle_, stream_), "cublasSetStream");
  }
  ~CublasGemm() override {
    release_buffers();
    if (handle_) cublasDestroy(handle_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  std::string name() const override { return "cublasSgemm (" + gpu_ + ")"; }
  void prepare(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b) override {
    release_buffers();
    s_ = s;
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&a_), a.size() * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&b_), b.size() * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&c_), static_cast<size_t>(s.m * s.n) * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemcpy(a_, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_check(cudaMemcpy(b_, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void run() override {
    const float alpha = 1.f, beta = 0.f;
    cublas_check(cublasSgemm(handle_, s_.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s_.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                             static_cast<int>(s_.n), static_cast<int>(s_.m), static_cast<int>(s_.k), &alpha, b_,
                             static_cast<int>(s_.cols_b()), a_, static_cast<int>(s_.cols_a()), &beta, c_,
                             static_cast<int>(s_.n)),
                 "cublasSgemm");
  }
  void synchronize() override { cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  std::vector<float> result() override {
    synchronize();
    std::vector<float> c(static_cast<size_t>(s_.m * s_.n));
    cuda_check(cudaMemcpy(c.data(), c_, c.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return c;
  }

 private:
  void release_buffers() {
    for (float** p : {&a_, &b_, &c_})
      if (*p) {
        cudaFree(*p);
        *p = nullptr;
      }
  }
  std::string gpu_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  float *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
  GemmShape s_{};
};
#endif  // CLEAVE_HAVE_CUDA

std::unique_ptr<LibraryGemm> make_library_gemm(const std::string& backend, int ordinal) {
  if (backend == "cpu") return std::make_unique<BlasGemm>();
#if CLEAVE_HAVE_OPENCL
  if (backend == "opencl") return std::make_unique<ClblastGemm>(ordinal);
#endif
#if CLEAVE_HAVE_CUDA
  if (backend == "cuda") return std::make_unique<CublasGemm>(ordinal);
#endif
  (void)ordinal;
  throw std::runtime_error("no library GEMM for backend '" + backend + "' in this build");
}

// Calls per timed batch so that `reps` batches of `call` (each ending in `sync`)
// take about `seconds`: doubles a probe batch until it lasts 20 ms, then scales.
int64_t calibrate_calls(const std::function<void()>& call, const std::function<void()>& sync, double seconds,
                        int reps) {
  int64_t n = 1;
  for (;;) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) call();
    sync();
    const double t = seconds_since(t0);
    if (t >= 0.02 || n >= (int64_t{1} << 20)) {
      const double per_call = t / static_cast<double>(n);
      return std::clamp<int64_t>(static_cast<int64_t>(seconds / reps / per_call + 0.5), 1, int64_t{1} << 24);
    }
    n *= 2;
  }
}

double time_batch(const std::function<void()>& call, const std::function<void()>& sync, int64_t calls) {
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < calls; ++i) call();
  sync();
  return seconds_since(t0);
}

struct GemmResult {
  GemmShape shape;
  int64_t cleave_calls = 0, library_calls = 0;
  std::vector<double> cleave_gflops, library_gflops;
  double max_rel_diff = 0;
};

GemmResult measure_gemm(cleave::Device& dev, LibraryGemm& lib, const GemmShape& s, const Options& opt) {
  cleave::Rng rng(cleave::derive_seed(opt.seed, 11));
  std::vector<float> a(static_cast<size_t>(s.rows_a() * s.cols_a())), b(static_cast<size_t>(s.rows_b() * s.cols_b()));
  for (float& v : a) v = rng.uniform(-1, 1);
  for (float& v : b) v = rng.uniform(-1, 1);

  Tensor ta(dev, {s.rows_a(), s.cols_a()}), tb(dev, {s.rows_b(), s.cols_b()}), tc(dev, {s.m, s.n});
  ta.from_host(a);
  tb.from_host(b);
  dev.fill(tc, 0.f);
  auto cleave_call = [&] { dev.gemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, ta, s.cols_a(), tb, s.cols_b(), 0.f, tc, s.n); };
  auto cleave_sync = [&] { dev.synchronize(); };
  lib.prepare(s, a, b);
  auto lib_call = [&] { lib.run(); };
  auto lib_sync = [&] { lib.synchronize(); };

  // Warm up both (kernel compilation, thread pools, caches), then calibrate each.
  time_batch(cleave_call, cleave_sync, 1);
  time_batch(lib_call, lib_sync, 1);
  GemmResult r;
  r.shape = s;
  r.cleave_calls = calibrate_calls(cleave_call, cleave_sync, opt.seconds, opt.reps);
  r.library_calls = calibrate_calls(lib_call, lib_sync, opt.seconds, opt.reps);
  for (int rep = 0; rep < opt.reps; ++rep) {  // alternate: both see the same load
    const double tc_s = time_batch(cleave_call, cleave_sync, r.cleave_calls);
    r.cleave_gflops.push_back(s.flops() * static_cast<double>(r.cleave_calls) / tc_s * 1e-9);
    const double tl_s = time_batch(lib_call, lib_sync, r.library_calls);
    r.library_gflops.push_back(s.flops() * static_cast<double>(r.library_calls) / tl_s * 1e-9);
  }

  // Both computed C = A*B from the same inputs: they must agree.
  const std::vector<float> c_cleave = tc.to_host(), c_lib = lib.result();
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < c_lib.size(); ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(c_lib[i])));
    const double d = std::fabs(static_cast<double>(c_cleave[i]) - static_cast<double>(c_lib[i]));
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
  }
  r.max_rel_diff = max_diff / std::max(max_abs, 1e-30);
  return r;
}

// ---------------------------------------------------------------------------------------------
// training step (as bench/core/bench_train_step.cpp and core/train/local_trainer.cpp)

using TrainRun = cleave::bench::SyntheticTraining;

struct TrainResult {
  std::string model;
  int64_t batch = 0, steps = 0;
  std::vector<double> samples_per_sec;
  double loss = 0;
};

TrainResult measure_training(cleave::Device& dev, const cleave::ModelSpec& spec, const bench::ModelRun& m,
                             const Options& opt) {
  TrainRun run(dev, spec, m.batch, opt.seed);
  if (opt.warmup > 0) run.time(opt.warmup);
  int64_t steps = opt.steps;
  if (steps == 0) {  // enough steps for `seconds` over all repetitions (at least 1 each)
    int64_t n = 0;
    double t = 0;
    do {
      t += run.time(1);
      ++n;
    } while (t < 0.2 && n < 1000);
    const double per_step = t / static_cast<double>(n);
    steps = std::clamp<int64_t>(static_cast<int64_t>(opt.seconds / opt.reps / per_step + 0.5), 1, 1000000);
  }
  TrainResult r{m.name, m.batch, steps, {}, 0};
  for (int rep = 0; rep < opt.reps; ++rep)
    r.samples_per_sec.push_back(static_cast<double>(steps * m.batch) / run.time(steps));
  r.loss = run.last_loss();
  return r;
}

}  // namespace

// One line of the closing table.
struct Row {
  std::string backend, what, unit;
  double cleave = 0, library = -1;  // library < 0: none
  std::string note;
};

// Every GEMM shape on `dev` against the backend's own BLAS: printed, added to
// `rows`, returned as JSON; `failed` is set when the two disagree.
json measure_gemms(cleave::Device& dev, LibraryGemm& lib, const std::string& name, const Options& opt,
                   std::vector<Row>& rows, bool& failed) {
  json gj = json::array();
  for (const GemmShape& s : kShapes) {
    const GemmResult g = measure_gemm(dev, lib, s, opt);
    const double c = bench::median(g.cleave_gflops), l = bench::median(g.library_gflops);
    std::printf("  gemm %-18s %-14s cleave %8.1f GFLOP/s  library %8.1f GFLOP/s  ratio %.2f  max rel diff %.1e\n",
                s.label().c_str(), s.what, c, l, c / l, g.max_rel_diff);
    std::fflush(stdout);
    const bool agree = g.max_rel_diff <= 1e-3;
    if (!agree) {
      std::printf("  error: cleave's and the library's C differ (max rel diff %.3g)\n", g.max_rel_diff);
      failed = true;
    }
    rows.push_back({name, "gemm " + s.label() + " (" + s.what + ")", "GFLOP/s", c, l, agree ? "" : "C DIFFERS"});
    gj.push_back({{"shape", s.what},          {"m", s.m},
                  {"n", s.n},                 {"k", s.k},
                  {"trans_a", s.ta},          {"trans_b", s.tb},
                  {"cleave_calls_per_rep", g.cleave_calls},
                  {"library_calls_per_rep", g.library_calls},
                  {"cleave_gflops", g.cleave_gflops},
                  {"library_gflops", g.library_gflops},
                  {"cleave_median_gflops", c},
                  {"library_median_gflops", l},
                  {"ratio", c / l},
                  {"max_rel_diff", g.max_rel_diff}});
  }
  return gj;
}

// Training steps of every model on `dev`: printed, added to `rows`, returned as JSON.
json measure_trainings(cleave::Device& dev, const std::vector<std::pair<bench::ModelRun, cleave::ModelSpec>>& models,
                       const std::string& name, const Options& opt, std::vector<Row>& rows) {
  json tj = json::array();
  for (const auto& [m, spec] : models) {
    const TrainResult t = measure_training(dev, spec, m, opt);
    const double med = bench::median(t.samples_per_sec);
    std::printf("  train %-4s batch %-4lld %10.1f samples/s  %9.2f ms/step  (%lld steps x %d reps, loss %.3f)\n",
                m.name.c_str(), static_cast<long long>(m.batch), med, 1e3 * static_cast<double>(m.batch) / med,
                static_cast<long long>(t.steps), opt.reps, t.loss);
    std::fflush(stdout);
    rows.push_back({name, "train " + m.name + " batch " + std::to_string(m.batch), "samples/s", med, -1, ""});
    tj.push_back({{"model", m.name},
                  {"batch", m.batch},
                  {"steps_per_rep", t.steps},
                  {"reps", opt.reps},
                  {"samples_per_sec", t.samples_per_sec},
                  {"median_samples_per_sec", med},
                  {"ms_per_step", 1e3 * static_cast<double>(m.batch) / med},
                  {"final_loss", t.loss}});
  }
  return tj;
}

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);  // before any OpenMP/BLAS threads start
  const Options opt = parse_options(argc, argv);
  const auto t_start = Clock::now();
  const double load_start = load_average();

  std::vector<std::pair<bench::ModelRun, cleave::ModelSpec>> models;
  try {
    for (const bench::ModelRun& m : opt.models)
      models.emplace_back(m, cleave::ModelSpec::load(opt.models_dir + "/" + m.name + ".json"));
  } catch (const std::exception& e) {
    std::cerr << "bench_backends: " << e.what() << " (use --models-dir)\n";
    return 1;
  }
  if (opt.threads > 0) openblas_set_num_threads(opt.threads);
  std::printf("bench_backends: %d cores, load average %.2f, %d reps, %.2g s per measurement\n", bench::online_cores(),
              load_start, opt.reps, opt.seconds);

  std::vector<Row> rows;
  json backends_json = json::array();
  int measured = 0;
  bool failed = false;

  for (const std::string& name : opt.backends) {
    json bj = {{"backend", name}};
    cleave::DeviceOptions dopts;
    dopts.threads = opt.threads;
    dopts.ordinal = opt.ordinal;
    std::unique_ptr<cleave::Device> dev;
    const auto t_open = Clock::now();
    try {
      dev = cleave::open_device(name, dopts);
    } catch (const std::exception& e) {
      std::printf("note: skipping %s: %s\n", name.c_str(), e.what());
      bj["status"] = "skipped";
      bj["reason"] = e.what();
      backends_json.push_back(bj);
      continue;
    }
    bj["device"] = dev->name();
    bj["open_seconds"] = seconds_since(t_open);
    std::printf("\n%s: %s (opened in %.2f s)\n", name.c_str(), dev->name().c_str(), seconds_since(t_open));
    std::fflush(stdout);
    try {
      std::unique_ptr<LibraryGemm> lib = make_library_gemm(name, opt.ordinal);
      bj["library"] = lib->name();
      std::printf("  library GEMM: %s\n", lib->name().c_str());
      bj["gemm"] = measure_gemms(*dev, *lib, name, opt, rows, failed);
      lib.reset();

      bj["train"] = measure_trainings(*dev, models, name, opt, rows);
      bj["status"] = "ok";
      ++measured;
    } catch (const std::exception& e) {
      std::printf("error: %s failed: %s\n", name.c_str(), e.what());
      bj["status"] = "failed";
      bj["reason"] = e.what();
      failed = true;
    }
    backends_json.push_back(bj);
  }

  // The table.
  std::printf("\n%-7s %-44s %12s %12s %6s %-9s\n", "backend", "measurement", "cleave", "library", "ratio", "unit");
  for (const Row& r : rows) {
    const bool lib = r.library >= 0;
    std::printf("%-7s %-44s %12.1f %12s %6s %-9s%s%s\n", r.backend.c_str(), r.what.c_str(), r.cleave,
                lib ? fmt("%.1f", r.library).c_str() : "-", lib ? fmt("%.2f", r.cleave / r.library).c_str() : "-",
                r.unit.c_str(), r.note.empty() ? "" : " ", r.note.c_str());
  }
  std::printf("GEMM: median GFLOP/s of %d timed batches (each ends in a synchronize); library = the backend's\n"
              "own BLAS called directly on its own buffers; ratio = cleave / library. Training: median samples/s\n"
              "of %d repetitions of forward, cross-entropy, backward, Adam.\n",
              opt.reps, opt.reps);

  json report = {{"benchmark", "backends"},
                 {"machine", {{"cores", bench::online_cores()}, {"load_average_start", load_start}, {"openblas", openblas_get_config()}}},
                 {"settings",
                  {{"backends", opt.backends},
                   {"seconds", opt.seconds},
                   {"reps", opt.reps},
                   {"steps", opt.steps},
                   {"warmup", opt.warmup},
                   {"threads", opt.threads},
                   {"ordinal", opt.ordinal},
                   {"seed", opt.seed},
                   {"optimizer", "adam lr 1e-3"}}},
                 {"backends", backends_json}};
  report["machine"]["load_average_end"] = load_average();
  report["wall_seconds"] = seconds_since(t_start);
  try {
    cleave::write_json_file(opt.json_path, report);
  } catch (const std::exception& e) {
    std::cerr << "bench_backends: cannot write the results: " << e.what() << "\n";
    return 1;
  }
  std::printf("wrote %s (%.0f s)\n", opt.json_path.c_str(), seconds_since(t_start));
  if (measured == 0) {
    std::cerr << "bench_backends: no backend could be measured\n";
    return 1;
  }
  return failed ? 1 : 0;
}
