// checkpoint.cpp: writing and verifying the CLEAVECK format (see checkpoint.h).
#include "core/io/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>

#include "core/io/atomic_file.h"
#include "core/io/untrusted_json.h"

namespace cleave {

namespace {

constexpr size_t kPrefixBytes = 36;  // magic, version, reserved, H, L, prefix CRC
constexpr size_t kTrailerBytes = 4;  // whole-file CRC
constexpr size_t kChunkFloats = 1 << 18;
const char* const kAdvice = "; re-save it or use an older checkpoint";

uint32_t crc_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt take = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, take));
    p += take;
    n -= take;
  }
  return crc;
}

uint32_t crc_init() { return static_cast<uint32_t>(crc32(0L, Z_NULL, 0)); }

// Writes through AtomicFileWriter while keeping a running CRC32.
struct CrcWriter {
  AtomicFileWriter& out;
  uint32_t crc = crc_init();
  void write(const void* data, size_t n) {
    crc = crc_update(crc, data, n);
    out.write(data, n);
  }
};

[[noreturn]] void bad(const std::string& path, const std::string& problem) {
  throw std::runtime_error(path + ": " + problem);
}

struct Layout {
  uint64_t header_len = 0, file_len = 0;
};

// Checks magic, prefix CRC, version and lengths, then the whole-file CRC.
Layout verify(const InputFile& f) {
  const std::string& path = f.path();
  const uint64_t size = f.size();
  unsigned char prefix[kPrefixBytes] = {};
  const size_t have = static_cast<size_t>(std::min<uint64_t>(size, kPrefixBytes));
  if (have > 0) f.read_at(0, prefix, have);
  if (std::memcmp(prefix, kCheckpointMagic, std::min<size_t>(have, 8)) != 0)
    bad(path, "not a cleave checkpoint (the file does not start with \"CLEAVECK\")");
  if (size < kPrefixBytes + kTrailerBytes)
    bad(path, "truncated: the file has only " + std::to_string(size) + " bytes, less than any checkpoint" +
                  kAdvice);
  if (get_u32_le(prefix + 32) != crc_update(crc_init(), prefix, 32))
    bad(path, std::string("checksum mismatch: the file is corrupted (its fixed header is damaged)") + kAdvice);
  const uint32_t version = get_u32_le(prefix + 8);
  if (version != kCheckpointVersion)
    bad(path, "unsupported checkpoint format version " + std::to_string(version) + " (this build reads version " +
                  std::to_string(kCheckpointVersion) + "; use a newer cleave)");
  Layout l;
  l.header_len = get_u64_le(prefix + 16);
  l.file_len = get_u64_le(prefix + 24);
  if (size < l.file_len)
    bad(path, "truncated: the file has " + std::to_string(size) + " bytes but was written with " +
                  std::to_string(l.file_len) + " (an interrupted copy or a full disk?)" + kAdvice);
  if (size > l.file_len)
    bad(path, "corrupted: " + std::to_string(size - l.file_len) +
                  " unexpected bytes after the end of the checkpoint" + kAdvice);
  if (l.header_len > l.file_len - kPrefixBytes - kTrailerBytes)
    bad(path, "corrupted: header length " + std::to_string(l.header_len) + " does not fit in a file of " +
                  std::to_string(l.file_len) + " bytes" + kAdvice);
  // Whole-file checksum, streamed in bounded chunks.
  uint32_t crc = crc_init();
  std::vector<unsigned char> chunk(1 << 20);
  const uint64_t body = l.file_len - kTrailerBytes;
  for (uint64_t off = 0; off < body;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), body - off));
    f.read_at(off, chunk.data(), n);
    crc = crc_update(crc, chunk.data(), n);
    off += n;
  }
  unsigned char trailer[kTrailerBytes];
  f.read_at(body, trailer, kTrailerBytes);
  if (get_u32_le(trailer) != crc) bad(path, std::string("checksum mismatch: the file is corrupted") + kAdvice);
  return l;
}

nlohmann::json read_header(const InputFile& f, const Layout& l) {
  std::string text(static_cast<size_t>(l.header_len), '\0');
  if (!text.empty()) f.read_at(kPrefixBytes, text.data(), text.size());
  nlohmann::json header;
  try {
    // A file a user was given may be hostile: the depth is bounded before parsing.
    header = parse_untrusted_json(text, kFileJsonLimits, "header");
  } catch (const std::invalid_argument& e) {
    bad(f.path(), std::string("invalid checkpoint header (not JSON: ") + e.what() + ")");
  }
  if (!header.is_object() || !header.contains("blocks") || !header.at("blocks").is_array())
    bad(f.path(), "invalid checkpoint header: expected an object with a \"blocks\" array");
  return header;
}

}  // namespace

const std::vector<float>& Checkpoint::block(const std::string& name) const {
  for (const auto& [n, data] : blocks)
    if (n == name) return data;
  std::string names;
  for (const auto& b : blocks) names += (names.empty() ? "" : ", ") + b.first;
  throw std::out_of_range("checkpoint has no block '" + name + "' (has: " + (names.empty() ? "none" : names) + ")");
}

bool Checkpoint::has_block(const std::string& name) const {
  for (const auto& b : blocks)
    if (b.first == name) return true;
  return false;
}

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  nlohmann::json header;
  header["meta"] = ckpt.meta;
  header["blocks"] = nlohmann::json::array();
  std::set<std::string> seen;
  for (const auto& [name, data] : ckpt.blocks) {
    if (name.empty()) throw std::invalid_argument(path + ": checkpoint block names must not be empty");
    if (!seen.insert(name).second) throw std::invalid_argument(path + ": duplicate checkpoint block '" + name + "'");
    header["blocks"].push_back(nlohmann::json{{"name", name}, {"count", data.size()}});
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(path + ": checkpoint metadata cannot be written as JSON: " + e.what());
  }
  uint64_t file_len = kPrefixBytes + text.size() + kTrailerBytes;
  for (const auto& b : ckpt.blocks) file_len += b.second.size() * sizeof(float);

  unsigned char prefix[kPrefixBytes] = {};
  std::memcpy(prefix, kCheckpointMagic, 8);
  put_u32_le(prefix + 8, kCheckpointVersion);
  put_u32_le(prefix + 12, 0);
  put_u64_le(prefix + 16, text.size());
  put_u64_le(prefix + 24, file_len);
  put_u32_le(prefix + 32, crc_update(crc_init(), prefix, 32));

  AtomicFileWriter file(path);
  CrcWriter out{file};
  out.write(prefix, sizeof prefix);
  out.write(text.data(), text.size());
  std::vector<float> chunk;
  for (const auto& b : ckpt.blocks) {
    for (size_t off = 0; off < b.second.size(); off += kChunkFloats) {
      const size_t n = std::min(kChunkFloats, b.second.size() - off);
      chunk.assign(b.second.begin() + static_cast<std::ptrdiff_t>(off),
                   b.second.begin() + static_cast<std::ptrdiff_t>(off + n));
      floats_host_to_le(chunk.data(), n);
      out.write(chunk.data(), n * sizeof(float));
    }
  }
  unsigned char trailer[kTrailerBytes];
  put_u32_le(trailer, out.crc);
  file.write(trailer, sizeof trailer);
  if (file.size() != file_len) throw std::logic_error(path + ": checkpoint size bookkeeping is wrong");
  file.commit();
}

nlohmann::json load_checkpoint_meta(const std::string& path) {
  InputFile f(path);
  const Layout l = verify(f);
  nlohmann::json header = read_header(f, l);
  return header.contains("meta") ? header.at("meta") : nlohmann::json();
}

Checkpoint load_checkpoint(const std::string& path) {
  InputFile f(path);
  const Layout l = verify(f);
  const nlohmann::json header = read_header(f, l);
  const uint64_t data_bytes = l.file_len - kPrefixBytes - kTrailerBytes - l.header_len;
  // Validate every block entry against the data size before allocating anything.
  uint64_t total = 0;
  std::set<std::string> seen;
  std::vector<std::pair<std::string, uint64_t>> entries;
  for (const auto& b : header.at("blocks")) {
    if (!b.is_object() || !b.contains("name") || !b.at("name").is_string() || !b.contains("count") ||
        !b.at("count").is_number_unsigned())
      bad(path, "invalid checkpoint header: block entry " + b.dump() + " needs a string name and a count");
    const std::string name = b.at("name").get<std::string>();
    const uint64_t count = b.at("count").get<uint64_t>();
    if (name.empty() || !seen.insert(name).second)
      bad(path, "invalid checkpoint header: empty or duplicate block name '" + name + "'");
    if (count > (data_bytes - total) / sizeof(float))
      bad(path, "invalid checkpoint header: block '" + name + "' (" + std::to_string(count) +
                    " floats) runs past the end of the data");
    total += count * sizeof(float);
    entries.emplace_back(name, count);
  }
  if (total != data_bytes)
    bad(path, "invalid checkpoint header: the blocks cover " + std::to_string(total) + " bytes but the data has " +
                  std::to_string(data_bytes));
  Checkpoint ckpt;
  ckpt.meta = header.contains("meta") ? header.at("meta") : nlohmann::json();
  uint64_t off = kPrefixBytes + l.header_len;
  for (const auto& [name, count] : entries) {
    std::vector<float> data(static_cast<size_t>(count));
    if (count > 0) f.read_at(off, data.data(), data.size() * sizeof(float));
    floats_le_to_host(data.data(), data.size());
    off += count * sizeof(float);
    ckpt.blocks.emplace_back(name, std::move(data));
  }
  return ckpt;
}

}  // namespace cleave
