// idx.cpp: the IDX reader (the MNIST / Fashion-MNIST file format).
//
// An IDX file is a 4-byte magic (0, 0, element type, number of dimensions),
// one big-endian uint32 per dimension, then the elements. Files are read
// through zlib, which reads gzip and plain files alike. Only unsigned-byte
// elements are supported. Data is read in chunks and the output grows with
// what the file actually holds, so a lying header cannot force a huge
// allocation.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/data/dataset.h"

namespace cleave {
namespace {

constexpr int kIdxUnsignedByte = 0x08;
constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr int64_t kMaxSampleNumel = int64_t{1} << 30;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// RAII owner of a zlib file handle.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, not an IDX file");
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (!file_) fail(path, std::string("cannot open: ") + (errno ? std::strerror(errno) : "out of memory"));
    gzbuffer(file_, 1 << 17);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;
  ~GzReader() { gzclose(file_); }

  // Reads up to n bytes; returns how many were read (fewer only at end of
  // file). Throws on a read or decompression error other than a clean or
  // truncated end.
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (done < n) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n - done, INT_MAX / 2));
      const int got = gzread(file_, out + done, want);
      if (got < 0) fail(path_, "read error: " + zlib_error());
      if (got == 0) {
        // End of data. A gzip stream cut short ends with Z_BUF_ERROR: that is a
        // truncated file, which the caller reports with counts.
        int code = 0;
        gzerror(file_, &code);
        if (code != Z_OK && code != Z_BUF_ERROR) fail(path_, "read error: " + zlib_error());
        break;
      }
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  // zlib's message for the last error, without the "path: " it prepends.
  std::string zlib_error() const {
    int code = 0;
    const char* raw = gzerror(file_, &code);
    std::string msg = raw ? raw : "unknown zlib error";
    if (msg.rfind(path_ + ": ", 0) == 0) msg.erase(0, path_.size() + 2);
    if (code == Z_DATA_ERROR) msg = "corrupt gzip data (" + msg + ")";
    return msg;
  }

  std::string path_;
  gzFile file_ = nullptr;
};

struct IdxHeader {
  std::vector<int64_t> dims;  // (N, ...)
};

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, v);
  return buf;
}
std::string hex32(uint32_t v) { return hex(v, 8); }

// Reads and validates the header of an unsigned-byte IDX file with a rank in
// [min_rank, max_rank]. `what` names the content ("images", "labels").
IdxHeader read_header(GzReader& in, const std::string& path, int min_rank, int max_rank,
                      const std::string& what) {
  std::array<unsigned char, 4> magic{};
  const size_t got = in.read(magic.data(), 4);
  if (got == 0) fail(path, "empty file, expected an IDX " + what + " file");
  if (got < 4) fail(path, "truncated: file ends inside the IDX magic number");
  const uint32_t m = (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) |
                     (uint32_t{magic[2]} << 8) | uint32_t{magic[3]};
  if (magic[0] != 0 || magic[1] != 0)
    fail(path, "bad magic " + hex32(m) + ": not an IDX file (expected 0x0000080" +
                   std::to_string(min_rank) + (min_rank == max_rank ? "" : "..0x0000080" + std::to_string(max_rank)) +
                   " for " + what + ")");
  if (magic[2] != kIdxUnsignedByte)
    fail(path, "bad magic " + hex32(m) + ": element type " + hex(magic[2], 2) +
                   " is not supported (only unsigned byte, 0x08)");
  const int rank = magic[3];
  if (rank < min_rank || rank > max_rank)
    fail(path, "bad magic " + hex32(m) + ": " + std::to_string(rank) + " dimension(s), but " + what +
                   " need " + (min_rank == max_rank ? std::to_string(min_rank) :
                               std::to_string(min_rank) + " to " + std::to_string(max_rank)));
  IdxHeader h;
  for (int i = 0; i < rank; ++i) {
    std::array<unsigned char, 4> b{};
    if (in.read(b.data(), 4) < 4) fail(path, "truncated: file ends inside the IDX header");
    const uint32_t d = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
    if (d == 0 && i > 0) fail(path, "dimension " + std::to_string(i) + " of the IDX header is 0");
    h.dims.push_back(static_cast<int64_t>(d));
  }
  int64_t per_sample = 1;
  for (size_t i = 1; i < h.dims.size(); ++i) {
    per_sample *= h.dims[i];
    if (per_sample > kMaxSampleNumel)
      fail(path, "IDX header gives an implausible sample size (more than 2^30 values per sample)");
  }
  return h;
}

std::string sample_dims_str(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 1; i < dims.size(); ++i) {
    if (i > 1) s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

// Reads `count` samples of `per_sample` bytes each, appending them to `out`
// converted by `lut`. Throws "truncated" naming what the header promised.
void read_samples(GzReader& in, const std::string& path, int64_t count, int64_t per_sample,
                  const std::array<float, 256>& lut, std::vector<float>& out,
                  const std::string& promised) {
  const size_t total = static_cast<size_t>(count) * static_cast<size_t>(per_sample);
  out.reserve(std::min(total, size_t{64} << 20));
  std::vector<unsigned char> chunk(std::min(total, kChunkBytes));
  size_t done = 0;
  while (done < total) {
    const size_t want = std::min(total - done, chunk.size());
    const size_t got = in.read(chunk.data(), want);
    const size_t base = out.size();
    out.resize(base + got);
    for (size_t i = 0; i < got; ++i) out[base + i] = lut[chunk[i]];
    done += got;
    if (got < want) {
      fail(path, "truncated: header says " + promised + " but file holds " +
                     std::to_string(done / static_cast<size_t>(per_sample)));
    }
  }
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path,
                 const std::string& name, int64_t limit) {
  GzReader images(images_path);
  const IdxHeader ih = read_header(images, images_path, 2, 4, "images");
  GzReader labels(labels_path);
  const IdxHeader lh = read_header(labels, labels_path, 1, 1, "labels");

  const int64_t n = ih.dims[0];
  if (lh.dims[0] != n)
    throw std::runtime_error(images_path + " holds " + std::to_string(n) + " images but " + labels_path +
                             " holds " + std::to_string(lh.dims[0]) + " labels");
  const int64_t count = limit >= 0 ? std::min(limit, n) : n;

  Dataset data;
  data.name = name;
  if (ih.dims.size() == 2) data.sample_shape = {ih.dims[1]};
  else if (ih.dims.size() == 3) data.sample_shape = {1, ih.dims[1], ih.dims[2]};
  else data.sample_shape = {ih.dims[1], ih.dims[2], ih.dims[3]};
  const int64_t per_sample = data.sample_numel();

  std::array<float, 256> pixel{};
  std::array<float, 256> label{};
  for (int i = 0; i < 256; ++i) {
    pixel[i] = static_cast<float>(i) / 255.0f;
    label[i] = static_cast<float>(i);
  }
  const bool all = limit < 0;  // with a limit, read only what is needed
  read_samples(images, images_path, count, per_sample, pixel, data.x,
               std::to_string(n) + " images of " + sample_dims_str(ih.dims));
  read_samples(labels, labels_path, count, 1, label, data.y, std::to_string(n) + " labels");
  if (all) {
    unsigned char extra = 0;
    if (images.read(&extra, 1) != 0)
      fail(images_path, "header says " + std::to_string(n) + " images of " + sample_dims_str(ih.dims) +
                            " but the file holds more data (wrong header or not an IDX file)");
    if (labels.read(&extra, 1) != 0)
      fail(labels_path, "header says " + std::to_string(n) + " labels but the file holds more data");
  }
  float max_label = -1.0f;
  for (float v : data.y) max_label = std::max(max_label, v);
  data.num_classes = static_cast<int>(max_label) + 1;
  return data;
}

}  // namespace cleave
