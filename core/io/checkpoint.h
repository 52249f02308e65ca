// checkpoint.h: cleave's own checkpoint file: JSON metadata plus named float blocks.
//
// A checkpoint holds whatever the trainer needs to resume: `meta` (model spec,
// optimizer state_meta, step counters, RNG seeds...) and named float32 blocks
// (parameter blocks, optimizer buffers). The format (docs/checkpoints.md):
//
//   offset  size  field
//   0       8     magic "CLEAVECK"
//   8       4     format version, u32 LE (kCheckpointVersion)
//   12      4     reserved, 0
//   16      8     header length H, u64 LE
//   24      8     file length L (all bytes, trailing CRC included), u64 LE
//   32      4     CRC32 of bytes [0, 32), u32 LE (guards the fields above)
//   36      H     JSON header {"meta": {...}, "blocks": [{"name": s, "count": n}, ...]}
//   36+H    ...   the blocks' float32 values, little endian, in header order
//   L-4     4     CRC32 (zlib) of bytes [0, L-4), u32 LE
//
// Files are written atomically (atomic_file.h): a crash or error while saving
// leaves the previous checkpoint intact. Loading verifies everything before
// trusting any length, so a truncated or corrupted file is refused with a
// std::runtime_error naming the file and the problem, never a crash or a huge
// allocation.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cleave {

inline constexpr uint32_t kCheckpointVersion = 1;
inline constexpr char kCheckpointMagic[9] = "CLEAVECK";

struct Checkpoint {
  nlohmann::json meta;                                              // any JSON value
  std::vector<std::pair<std::string, std::vector<float>>> blocks;  // unique, non-empty names

  // The block called `name`; throws std::out_of_range "checkpoint has no block 'NAME' (has: ...)".
  const std::vector<float>& block(const std::string& name) const;
  bool has_block(const std::string& name) const;
};

// Writes `ckpt` to `path` atomically (PATH.tmp.<pid>, fsync, rename, fsync of the
// directory). Throws std::invalid_argument for empty or duplicate block names and
// std::runtime_error "PATH: ..." for I/O errors; `path` is unchanged on failure.
void save_checkpoint(const std::string& path, const Checkpoint& ckpt);

// Reads and verifies a checkpoint. Throws std::runtime_error "PATH: <problem>" for a
// missing, truncated, corrupted (checksum), foreign (magic) or newer (version) file.
Checkpoint load_checkpoint(const std::string& path);

// Reads only the JSON metadata (verifying the whole file's checksum first).
nlohmann::json load_checkpoint_meta(const std::string& path);

}  // namespace cleave
