// fixtures.h: small files written by the data tests at run time (IDX, gzip
// IDX, CSV) into a private temporary directory removed afterwards.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "scratch_dir.h"

namespace cleave::test {

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes, bool gz) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot write " + path);
    if (!bytes.empty()) gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// An IDX file: magic (0, 0, type, rank), big-endian dims, then `payload`.
inline std::vector<unsigned char> idx_bytes(const std::vector<uint32_t>& dims, const std::vector<unsigned char>& payload,
                                            unsigned char type = 0x08) {
  std::vector<unsigned char> b = {0, 0, type, static_cast<unsigned char>(dims.size())};
  for (uint32_t d : dims) {
    b.push_back(static_cast<unsigned char>(d >> 24));
    b.push_back(static_cast<unsigned char>(d >> 16));
    b.push_back(static_cast<unsigned char>(d >> 8));
    b.push_back(static_cast<unsigned char>(d));
  }
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

// n images of rows x cols with pixel (i, j) of image k = (k * 7 + i * cols + j) % 256,
// and labels k % classes.
inline std::vector<unsigned char> image_payload(uint32_t n, uint32_t rows, uint32_t cols) {
  std::vector<unsigned char> p;
  for (uint32_t k = 0; k < n; ++k)
    for (uint32_t i = 0; i < rows * cols; ++i) p.push_back(static_cast<unsigned char>((k * 7 + i) % 256));
  return p;
}
inline std::vector<unsigned char> label_payload(uint32_t n, uint32_t classes) {
  std::vector<unsigned char> p;
  for (uint32_t k = 0; k < n; ++k) p.push_back(static_cast<unsigned char>(k % classes));
  return p;
}

}  // namespace cleave::test
