// profile.h: what the planner knows about a model, its devices and their links.
//
// A ModelProfile lists, per layer, the work (FLOPs) and the bytes the layer
// needs: its weights, their gradients, the optimizer's state, the activation
// that crosses a cut placed after it, and what it keeps for backward. It is
// computed from a ModelSpec (profile_model) or written by hand in tests.
// DeviceProfile / LinkProfile / Cluster describe the hardware: usable memory,
// sustained compute rate (or measured per-layer times) and directional links.
// Everything here is plain data: no sockets, no clocks (design note 4).
//
// Conventions (documented in docs/planner.md):
//   - every byte count assumes float32 tensors (4 bytes per element);
//   - backward FLOPs = 2 x forward for layers with parameters (input gradient
//     and weight gradient), = 1 x forward for parameter-free layers;
//   - optimizer state: optimizer_state_count (core/optim/optimizer.h) x the
//     parameter bytes: sgd without momentum 0, sgd with momentum 1, adam / adamw 2.
// What a stage of these layers needs in memory is memory_model.h's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/device.h"
#include "transport/codec.h"

namespace cleave {

struct ModelSpec;

struct LayerProfile {
  std::string type;                   // JSON "type", e.g. "linear"
  int64_t fwd_flops = 0;              // forward FLOPs per sample (multiply-add = 2)
  int64_t bwd_flops = 0;              // backward FLOPs per sample (see above)
  int64_t weight_grad_flops = 0;      // of bwd_flops, what a split backward leaves to W (ZB-H1); 0: all in B
  int64_t param_count = 0;            // float parameters
  int64_t param_bytes = 0;            // 4 * param_count
  int64_t optimizer_state_bytes = 0;  // 0, 1x or 2x param_bytes (see above)
  int64_t grad_bytes = 0;             // = param_bytes
  int64_t out_act_bytes = 0;          // per sample: the output, what crosses a cut after this layer
  int64_t stash_bytes = 0;            // per sample kept for backward: the input + saved context
  int64_t workspace_bytes = 0;        // per sample of temporaries while the layer runs, on any device (conv columns)
  // The same temporaries for a micro-batch of `samples` on a device of `backend`
  // (Layer::workspace_bytes), when the profile comes from a model's layers;
  // hand-written profiles leave it empty and count samples * workspace_bytes.
  std::function<int64_t(int64_t samples, Backend backend)> workspace_for;
};

struct ModelProfile {
  std::string name;                   // model name (for reports)
  std::string optimizer;              // optimizer the state bytes were computed for
  std::vector<LayerProfile> layers;
  int64_t input_bytes_per_sample = 0;  // the model's input, per sample
  // Per sample, what the loss holds on the last stage: the targets and its
  // per-row values (loss, and for cross-entropy the per-row hit).
  int64_t loss_bytes_per_sample = 0;

  int num_layers() const { return static_cast<int>(layers.size()); }
  // Per-sample bytes of layer i's input (the model input for i = 0).
  int64_t in_act_bytes(int i) const { return i == 0 ? input_bytes_per_sample : layers[i - 1].out_act_bytes; }
};

// The profile of `spec` trained with `optimizer_kind` (sgd | adam | adamw).
// Throws std::invalid_argument for an unknown optimizer (or a layer the
// registry rejects, which a loaded ModelSpec never has).
ModelProfile profile_model(const ModelSpec& spec, const std::string& optimizer_kind, double momentum);

// Layer times measured at two micro-batch sizes, `small` < `large` samples
// (seconds per sample at each, one per layer), fitted as
// time(mb) = fixed + mb * per_sample: per layer, the line through both
// measurements, fixed clamped to [0, time(small)] and per_sample to >= 0 so
// that noise never makes a micro-batch cheaper than nothing. A layer with a
// measurement that is negative or not finite (it did not fit the device at that
// size) keeps its small-size value as its per-sample time (still negative when
// that one did not fit either) and no fixed cost.
struct LayerTimeFit {
  std::vector<double> per_sample;     // DeviceProfile::layer_seconds_per_sample
  std::vector<double> per_microbatch; // DeviceProfile::layer_seconds_per_microbatch
};
LayerTimeFit fit_layer_times(int64_t small, const std::vector<double>& per_sample_small, int64_t large,
                             const std::vector<double>& per_sample_large);

// How activations and gradients travel on a link is transport::Encoding
// (transport/codec.h: its names, parser and bytes per value), the same enum
// the links use.

struct DeviceProfile {
  std::string name;
  int64_t memory_bytes = 0;  // usable memory (after --memory-limit)
  double gflops = 0;         // effective sustained rate, GFLOP/s
  // Optional measured seconds per sample, forward + backward, one per layer;
  // when present it replaces flops / gflops for this device.
  std::optional<std::vector<double>> layer_seconds_per_sample;
  // Optional measured fixed seconds per micro-batch, one per layer (with
  // layer_seconds_per_sample only): a micro-batch of mb samples of layer l then
  // takes layer_seconds_per_microbatch[l] + mb * layer_seconds_per_sample[l]
  // (each call's overhead, small micro-batches' lower efficiency). Absent: 0.
  std::optional<std::vector<double>> layer_seconds_per_microbatch{};
  // Seconds per parameter of one optimizer step (with zero_grad) on this
  // device: a stage pays it once per batch for every parameter it holds.
  // 0 when unknown (offline files that do not give it).
  double update_seconds_per_param = 0;
  // Devices on one machine share its CPU cores. `host` names the machine (""
  // = a machine of its own), `host_cores` its cores, `cpu_threads` the cores
  // this device computes with (0 for a GPU, whose work leaves the cores free).
  std::string host{};
  double host_cores = 0;
  double cpu_threads = 0;
  // How much slower this device computes while the other devices of its host
  // compute too, beyond what their thread counts explain (memory bandwidth,
  // shared caches): its layers timed all together over timed alone (live
  // profiles, when the host's threads fit its cores; noise can put it a little
  // below 1). The planner slows the device by max(1, it) in plans that use
  // two or more devices of the host. Absent: not measured.
  std::optional<double> host_contention{};
  // The device's backend, when known: the memory model then counts the
  // temporaries that backend's ops take; unknown, the largest of any backend.
  std::optional<Backend> backend{};
};

struct LinkProfile {
  double mbps = 1000;        // bandwidth, megabits per second (10^6 bit/s)
  double latency_ms = 0.5;   // one-way latency per message
  std::optional<transport::Encoding> encoding;  // overrides the plan's encoding on this link
  // How fast the two ends' CPUs move the link's bytes (copying, encrypting,
  // decrypting), Mbit/s, where the wire is not only that: between devices of
  // one machine whose stages take all its cores, each end's compute pays half
  // of bytes / this (CostModel::link_times). Absent: `mbps` (a link within a
  // machine is its CPU); the live profile sets it where a --bandwidth-limit
  // throttles the link.
  std::optional<double> cpu_mbps{};
};

// Devices plus directional links between them. link(a, b) is the explicit
// a -> b link when one was set, else the default link.
struct Cluster {
  std::vector<DeviceProfile> devices;
  LinkProfile default_link;
  std::map<std::pair<int, int>, LinkProfile> links;  // (from, to) device indices

  int num_devices() const { return static_cast<int>(devices.size()); }
  // Index of the device called `name`, or -1.
  int index_of(const std::string& name) const;
  // The a -> b link (explicit or default). a, b are device indices.
  const LinkProfile& link(int from, int to) const;
  // Sets the a -> b link only (links are directional).
  void set_link(int from, int to, const LinkProfile& l) { links[{from, to}] = l; }
};

}  // namespace cleave
