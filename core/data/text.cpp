// text.cpp: load_text, a file's bytes as a language model's windows; see
// dataset.h and docs/data.md ("Text").
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "core/data/dataset.h"

namespace cleave {

namespace {

// The file's size, its bytes [from, from + count), read in one call.
struct TextFile {
  std::string path;
  std::ifstream in;
  int64_t size = 0;
  explicit TextFile(const std::string& p) : path(p), in(p, std::ios::binary) {
    if (!in) throw std::runtime_error(path + ": cannot open the --text file");
    std::error_code ec;
    const auto n = std::filesystem::file_size(path, ec);
    if (ec) throw std::runtime_error(path + ": not a regular file (" + ec.message() + "): give --text a file");
    size = static_cast<int64_t>(n);
  }
  std::vector<uint8_t> read(int64_t from, int64_t count) {
    std::vector<uint8_t> bytes(static_cast<size_t>(count));
    in.seekg(from);
    in.read(reinterpret_cast<char*>(bytes.data()), count);
    if (!in || in.gcount() != count) throw std::runtime_error(path + ": cannot read the --text file");
    return bytes;
  }
};

}  // namespace

Dataset load_text(const std::string& path, int64_t context, bool train, int64_t limit) {
  if (context < 1) throw std::invalid_argument("load_text: context must be >= 1, got " + std::to_string(context));
  TextFile file(path);
  const int64_t n = file.size;
  const int64_t cut = n / 10 * 9 + (n % 10) * 9 / 10;  // floor(0.9 n) without overflow
  const int64_t part = train ? cut : n - cut;
  if (part < context + 1)
    throw std::runtime_error(path + ": " + std::to_string(n) + " bytes are too few for a model of context " +
                             std::to_string(context) + ": its " + (train ? "training" : "validation") + " split (the " +
                             (train ? "first 90%" : "last 10%") + ", " + std::to_string(part) +
                             " bytes) needs at least " + std::to_string(context + 1) + " (a window and its next byte)");
  Dataset data;
  data.name = std::string("text:") + path + (train ? "/train" : "/validation");
  data.sample_shape = {context};
  data.target_shape = {context};
  data.num_classes = 256;
  if (train) {  // only the split's bytes are read: memory is the text's 90%, once
    data.text = std::make_shared<const std::vector<uint8_t>>(file.read(0, cut));
    const int64_t windows = cut - context;  // offsets 0 .. cut - T - 1
    data.epoch_samples = std::min(windows, limit >= 0 ? limit : cut / context);
  } else {
    // The windows at offsets 0, T, 2T, ... while a window and its next byte
    // fit, at most `limit`: only the bytes they cover are read.
    int64_t count = (n - cut - 1) / context;
    if (limit >= 0) count = std::min(count, limit);
    if (count > 0) {
      data.text = std::make_shared<const std::vector<uint8_t>>(file.read(cut, count * context + 1));
      data.text_stride = context;
    }
  }
  return data;
}

std::string write_fortunes_text(const std::string& dir, const std::string& out) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat") files.push_back(e.path());
  if (ec || files.empty())
    throw std::runtime_error("no fortunes in " + dir + " (install Debian's `fortunes` package, or pass --text FILE)");
  std::sort(files.begin(), files.end());
  std::ofstream o(out, std::ios::binary);
  for (const auto& f : files) o << std::ifstream(f, std::ios::binary).rdbuf();
  if (!o) throw std::runtime_error("cannot write " + out);
  return out;
}

}  // namespace cleave
