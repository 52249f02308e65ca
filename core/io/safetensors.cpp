// safetensors.cpp: safetensors writer (F32) and validating reader (F32/F16/BF16/F64).
#include "core/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/io/atomic_file.h"
#include "core/io/untrusted_json.h"

namespace cleave {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit
const char* const kMetadataKey = "__metadata__";

[[noreturn]] void bad(const std::string& path, const std::string& problem) {
  throw std::runtime_error(path + ": " + problem);
}

struct DtypeInfo {
  const char* name;
  size_t bytes;
};
constexpr DtypeInfo kDtypes[] = {{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}};

struct Entry {
  std::string name;
  std::string dtype;
  size_t elem_bytes = 0;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Parsed {
  uint64_t data_start = 0;
  std::vector<Entry> entries;  // sorted by begin
  std::map<std::string, std::string> metadata;
};

// Appended piece by piece: `"[" + std::to_string(...)` trips GCC 12's false
// -Wrestrict on operator+(const char*, string&&) (GCC bug 105329).
std::string range_str(uint64_t b, uint64_t e) {
  std::string s = "[";
  s += std::to_string(b);
  s += ", ";
  s += std::to_string(e);
  s += ')';
  return s;
}

Parsed parse_header(const InputFile& f) {
  const std::string& path = f.path();
  if (f.size() < 8) bad(path, "not a safetensors file: only " + std::to_string(f.size()) + " bytes");
  unsigned char len_bytes[8];
  f.read_at(0, len_bytes, 8);
  const uint64_t n = get_u64_le(len_bytes);
  if (n == 0) bad(path, "invalid safetensors file: empty header");
  if (n > f.size() - 8)
    bad(path, "invalid safetensors file: header length " + std::to_string(n) + " exceeds the file size (" +
                  std::to_string(f.size()) + " bytes): truncated, or not a safetensors file");
  if (n > kMaxHeaderBytes)
    bad(path, "invalid safetensors file: header length " + std::to_string(n) + " is over the 100 MiB limit");
  std::string text(static_cast<size_t>(n), '\0');
  f.read_at(8, text.data(), text.size());
  nlohmann::json header;
  try {
    // A file a user was given may be hostile: the depth is bounded before parsing.
    header = parse_untrusted_json(text, JsonLimits{kMaxHeaderBytes, kFileJsonLimits.max_depth}, "header");
  } catch (const std::invalid_argument& e) {
    bad(path, std::string("invalid safetensors header (not JSON): ") + e.what());
  }
  if (!header.is_object()) bad(path, "invalid safetensors header: expected a JSON object");

  Parsed p;
  p.data_start = 8 + n;
  const uint64_t data_size = f.size() - p.data_start;
  for (const auto& [name, v] : header.items()) {
    if (name == kMetadataKey) {
      if (!v.is_object()) bad(path, "invalid safetensors header: __metadata__ must be an object of strings");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) bad(path, "invalid safetensors header: __metadata__ value of '" + k + "' is not a string");
        p.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad(path, where + "expected an object with dtype, shape and data_offsets");
    Entry e;
    e.name = name;
    if (!v.at("dtype").is_string()) bad(path, where + "dtype must be a string");
    e.dtype = v.at("dtype").get<std::string>();
    for (const auto& d : kDtypes)
      if (e.dtype == d.name) e.elem_bytes = d.bytes;
    if (e.elem_bytes == 0) bad(path, where + "unsupported dtype " + e.dtype + " (supported: F32, F16, BF16, F64)");
    const auto& shape = v.at("shape");
    if (!shape.is_array()) bad(path, where + "shape must be an array of integers");
    uint64_t count = 1;
    bool overflow = false;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) bad(path, where + "shape " + shape.dump() + " must hold integers >= 0");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
      e.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && count > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
      count *= dim;
    }
    const auto& offs = v.at("data_offsets");
    if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      bad(path, where + "data_offsets must be two integers >= 0, got " + offs.dump());
    e.begin = offs[0].get<uint64_t>();
    e.end = offs[1].get<uint64_t>();
    if (e.begin > e.end) bad(path, where + "data_offsets " + offs.dump() + " run backwards");
    if (e.end > data_size)
      bad(path, where + "data_offsets " + offs.dump() + " run past the end of the data (" + std::to_string(data_size) +
                    " bytes): truncated file?");
    if (overflow || count > std::numeric_limits<uint64_t>::max() / e.elem_bytes ||
        count * e.elem_bytes != e.end - e.begin)
      bad(path, where + "shape " + shape.dump() + " of " + e.dtype + " does not match data_offsets " + offs.dump() +
                    " (" + std::to_string(e.end - e.begin) + " bytes)");
    p.entries.push_back(std::move(e));
  }
  std::sort(p.entries.begin(), p.entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  for (size_t i = 1; i < p.entries.size(); ++i) {
    const Entry& a = p.entries[i - 1];
    const Entry& b = p.entries[i];
    if (b.begin < a.end)
      bad(path, "invalid safetensors header: tensors '" + a.name + "' " + range_str(a.begin, a.end) + " and '" +
                    b.name + "' " + range_str(b.begin, b.end) + " overlap");
  }
  return p;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // 127 - 15 = 112
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

void decode(const Entry& e, const std::vector<unsigned char>& raw, std::vector<float>& out) {
  const size_t n = raw.size() / e.elem_bytes;
  out.resize(n);
  const unsigned char* p = raw.data();
  if (e.dtype == "F32") {
    for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(get_u32_le(p + 4 * i));
  } else if (e.dtype == "F16") {
    for (size_t i = 0; i < n; ++i) out[i] = half_to_float(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
  } else if (e.dtype == "BF16") {
    for (size_t i = 0; i < n; ++i)
      out[i] = std::bit_cast<float>(static_cast<uint32_t>(p[2 * i] | (p[2 * i + 1] << 8)) << 16);
  } else {  // F64
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(std::bit_cast<double>(get_u64_le(p + 8 * i)));
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) throw std::invalid_argument(path + ": safetensors tensor names must not be empty");
    if (t.name == kMetadataKey) throw std::invalid_argument(path + ": '__metadata__' is reserved, not a tensor name");
    if (!seen.insert(t.name).second) throw std::invalid_argument(path + ": duplicate tensor name '" + t.name + "'");
    for (int64_t d : t.shape)
      if (d < 0)
        throw std::invalid_argument(path + ": tensor '" + t.name + "' has a negative dimension " + shape_str(t.shape));
    if (numel(t.shape) != static_cast<int64_t>(t.data.size()))
      throw std::invalid_argument(path + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) + " (" +
                                  std::to_string(numel(t.shape)) + " values) but " + std::to_string(t.data.size()) +
                                  " values");
    const uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(path + ": safetensors header cannot be written as JSON: " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  put_u64_le(len, text.size());

  AtomicFileWriter out(path);
  out.write(len, 8);
  out.write(text.data(), text.size());
  std::vector<float> swapped;
  for (const auto& t : tensors) {
    if constexpr (std::endian::native == std::endian::little) {
      out.write(t.data.data(), t.data.size() * sizeof(float));
    } else {
      swapped = t.data;
      floats_host_to_le(swapped.data(), swapped.size());
      out.write(swapped.data(), swapped.size() * sizeof(float));
    }
  }
  out.commit();
}

std::vector<NamedTensor> read_safetensors(const std::string& path) {
  InputFile f(path);
  const Parsed p = parse_header(f);
  std::vector<NamedTensor> out;
  out.reserve(p.entries.size());
  std::vector<unsigned char> raw;
  for (const Entry& e : p.entries) {
    raw.resize(static_cast<size_t>(e.end - e.begin));
    if (!raw.empty()) f.read_at(p.data_start + e.begin, raw.data(), raw.size());
    NamedTensor t;
    t.name = e.name;
    t.shape = e.shape;
    decode(e, raw, t.data);
    out.push_back(std::move(t));
  }
  return out;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  InputFile f(path);
  return parse_header(f).metadata;
}

}  // namespace cleave
