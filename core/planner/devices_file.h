// devices_file.h: the device / link description file the planner reads.
//
//   {"devices": [{"name": "jetson", "memory": "4G", "gflops": 400}, ...],
//    "links": [{"from": "a", "to": "b", "mbps": 100, "latency_ms": 2}],
//    "default_link": {"mbps": 1000, "latency_ms": 0.5}}
//
// `cleave plan --devices` reads it; `cleave profile --json` writes it from live
// devices (write_devices_file). Rules (docs/planner.md):
//   - memory: a byte count (integer) or a string with a binary suffix
//     ("4G" = 4 GiB; K, M, G, T, optional "i" and "B": "512MiB", "1.5GB");
//   - a device may carry "layer_seconds": measured forward + backward seconds
//     per sample, one per layer, replacing gflops for that device;
//   - links are directional; a link a -> b also applies to b -> a unless the
//     file gives b -> a itself. "latency_ms" defaults to 0, and "encoding"
//     ("f32" | "f16" | "int8") optionally overrides the plan's encoding;
//   - default_link is optional (1000 Mbit/s, 0.5 ms);
//   - a device may name its "backend" ("cpu" | "opencl" | "cuda"): the memory
//     model then counts that backend's op temporaries (memory_model.h), else
//     the largest of any backend;
//   - informational fields ("address", "description") are allowed, any other
//     unknown field is an error (it is probably a typo).
// Every error names the file and the entry: "FILE: devices[2] ('pi'): memory: ...".
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/planner/profile.h"

namespace cleave {

// "4G" -> 4294967296; a JSON integer is taken as bytes. Throws
// std::invalid_argument describing the accepted forms.
int64_t parse_memory_size(const nlohmann::json& value);

// Validates `doc`; `source` names it in messages. Throws std::runtime_error.
Cluster parse_cluster(const nlohmann::json& doc, const std::string& source);
// Reads and parses PATH; throws std::runtime_error "PATH: ..." (missing file, bad JSON, bad entry).
Cluster load_cluster(const std::string& path);

// The same format (every directional link written out explicitly, memory in bytes).
nlohmann::json cluster_to_json(const Cluster& cluster);
// Writes cluster_to_json to PATH; throws std::runtime_error when it cannot.
void write_devices_file(const std::string& path, const Cluster& cluster);

}  // namespace cleave
