// program_cache.cpp: file format "CLVPROG1" | u64 length | u64 FNV-1a of payload | payload.
#include "device/opencl/program_cache.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace cleave {

namespace {

constexpr char kMagic[8] = {'C', 'L', 'V', 'P', 'R', 'O', 'G', '1'};
constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t fnv1a(const unsigned char* data, size_t n, uint64_t h = kFnvOffset) {
  for (size_t i = 0; i < n; ++i) {
    h ^= data[i];
    h *= kFnvPrime;
  }
  return h;
}

void put_u64(std::vector<unsigned char>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::string program_cache_key(const std::vector<std::string>& parts) {
  uint64_t h = kFnvOffset;
  const unsigned char zero = 0;
  for (const std::string& p : parts) {
    h = fnv1a(reinterpret_cast<const unsigned char*>(p.data()), p.size(), h);
    h = fnv1a(&zero, 1, h);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string cached_program_path(const std::string& dir, const std::string& key) {
  return (std::filesystem::path(dir) / (key + ".bin")).string();
}

std::optional<std::vector<unsigned char>> read_cached_program(const std::string& dir, const std::string& key) {
  if (dir.empty()) return std::nullopt;
  std::ifstream in(cached_program_path(dir, key), std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<unsigned char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (file.size() < 24 || std::memcmp(file.data(), kMagic, 8) != 0) return std::nullopt;
  const uint64_t length = get_u64(file.data() + 8);
  const uint64_t sum = get_u64(file.data() + 16);
  if (length == 0 || length != file.size() - 24) return std::nullopt;
  if (fnv1a(file.data() + 24, length) != sum) return std::nullopt;
  return std::vector<unsigned char>(file.begin() + 24, file.end());
}

bool write_cached_program(const std::string& dir, const std::string& key, const std::vector<unsigned char>& binary) {
  if (dir.empty() || binary.empty()) return false;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return false;
  std::vector<unsigned char> file(kMagic, kMagic + 8);
  put_u64(file, binary.size());
  put_u64(file, fnv1a(binary.data(), binary.size()));
  file.insert(file.end(), binary.begin(), binary.end());

  const std::string final_path = cached_program_path(dir, key);
  std::random_device rd;
  const std::string tmp = final_path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
    out.flush();
    if (!out) {
      out.close();
      std::filesystem::remove(tmp, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp, final_path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace cleave
