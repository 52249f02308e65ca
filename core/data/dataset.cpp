// dataset.cpp: Dataset helpers, the Fashion-MNIST lookup and load_dataset,
// the front door that maps a dataset name or path to a reader.
#include "core/data/dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace cleave {
namespace fs = std::filesystem;

namespace {

constexpr const char* kDefaultFashionDir = "/usr/share/datasets/fashion-mnist";

// `dir`/`base` or `dir`/`base`.gz, whichever exists (plain first); "" if neither.
std::string find_idx_file(const fs::path& dir, const std::string& base) {
  std::error_code ec;
  for (const std::string& name : {base, base + ".gz"}) {
    const fs::path p = dir / name;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

const char* const kFashionFiles[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                      "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

std::vector<std::string> missing_fashion_files(const fs::path& dir) {
  std::vector<std::string> missing;
  for (const char* base : kFashionFiles)
    if (find_idx_file(dir, base).empty()) missing.push_back(std::string(base) + "[.gz]");
  return missing;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `path` if it exists; else `dataset_dir`/`path` when that exists and `path`
// is relative; else `path` unchanged.
std::string resolve(const std::string& path, const std::string& dataset_dir) {
  std::error_code ec;
  if (fs::exists(path, ec) || dataset_dir.empty() || fs::path(path).is_absolute()) return path;
  const fs::path alt = fs::path(dataset_dir) / path;
  return fs::exists(alt, ec) ? alt.string() : path;
}

// data/train.csv -> data/test.csv: the last "train" in the file name becomes "test".
std::string csv_test_sibling(const std::string& train_path) {
  const fs::path p(train_path);
  std::string file = p.filename().string();
  const size_t at = file.rfind("train");
  if (at == std::string::npos)
    throw std::runtime_error(train_path + ": no test split: the file name has no 'train' to replace with 'test' "
                             "(name the files like data-train.csv / data-test.csv)");
  file.replace(at, 5, "test");
  return (p.parent_path() / file).string();
}

Dataset load_idx_dir(const std::string& dir, bool train, int64_t limit) {
  const std::vector<std::string> prefixes = train ? std::vector<std::string>{"train"}
                                                  : std::vector<std::string>{"t10k", "test"};
  for (const std::string& prefix : prefixes) {
    const std::string images = find_idx_file(dir, prefix + "-images-idx3-ubyte");
    const std::string labels = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
    if (!images.empty() && !labels.empty()) {
      const std::string base = fs::path(dir).lexically_normal().filename().string();
      const std::string stem = base.empty() ? fs::path(dir).lexically_normal().parent_path().filename().string() : base;
      return load_idx(images, labels, stem + (train ? "/train" : "/test"), limit);
    }
  }
  throw std::runtime_error(dir + ": no IDX " + std::string(train ? "train" : "test") + " split: expected " +
                           prefixes[0] + "-images-idx3-ubyte[.gz] and " + prefixes[0] +
                           "-labels-idx1-ubyte[.gz]" + (train ? "" : " (or test-...)"));
}

}  // namespace

int64_t Dataset::size() const {
  if (source) return source->count;
  if (text) {
    const int64_t last = static_cast<int64_t>(text->size()) - sample_numel() - 1;  // the last offset that fits
    return last < 0 || text_stride < 1 ? 0 : last / text_stride + 1;
  }
  const int64_t per = target_numel();
  return per > 0 ? static_cast<int64_t>(y.size()) / per : 0;
}

int64_t Dataset::sample_numel() const {
  int64_t n = 1;
  for (int64_t d : sample_shape) n *= d;
  return n;
}

int64_t Dataset::target_numel() const {
  int64_t n = 1;
  for (int64_t d : target_shape) n *= d;
  return n;
}

void Dataset::copy_samples(const int64_t* indices, int64_t n, float* xs, float* ys) const {
  if (source) {
    source->fetch(indices, n, xs, ys);
    return;
  }
  const auto per = static_cast<size_t>(sample_numel()), tper = static_cast<size_t>(target_numel());
  for (int64_t k = 0; k < n; ++k) copy_sample(indices[k], xs + static_cast<size_t>(k) * per, ys + static_cast<size_t>(k) * tper);
}

void Dataset::copy_sample(int64_t i, float* xs, float* ys) const {
  if (source) {
    source->fetch(&i, 1, xs, ys);
    return;
  }
  const auto per = static_cast<size_t>(sample_numel()), tper = static_cast<size_t>(target_numel());
  const auto at = static_cast<size_t>(i);
  if (text) {  // the window at i * text_stride and its next bytes
    const uint8_t* bytes = text->data() + at * static_cast<size_t>(text_stride);
    for (size_t t = 0; t < per; ++t) {
      xs[t] = static_cast<float>(bytes[t]);
      ys[t] = static_cast<float>(bytes[t + 1]);
    }
    return;
  }
  std::memcpy(xs, x.data() + at * per, per * sizeof(float));
  std::memcpy(ys, y.data() + at * tper, tper * sizeof(float));
}

// The windows of a text: shape (T), targets (T), bytes for at least one window.
static void check_text(const Dataset& data, const std::string& who) {
  if (data.sample_shape.size() != 1 || data.target_shape != data.sample_shape)
    throw std::runtime_error(who + ": text windows need sample and target shapes (T), got " +
                             std::to_string(data.sample_shape.size()) + "-d samples");
  if (!data.x.empty() || !data.y.empty()) throw std::runtime_error(who + ": text windows hold no x / y");
  if (data.text_stride < 1)
    throw std::runtime_error(who + ": text windows need a stride >= 1, got " + std::to_string(data.text_stride));
  if (static_cast<int64_t>(data.text->size()) < data.sample_numel() + 1)
    throw std::runtime_error(who + ": " + std::to_string(data.text->size()) + " bytes hold no window of " +
                             std::to_string(data.sample_numel()) + " + 1");
}

void check_dataset(const Dataset& data) {
  const std::string who = "dataset '" + data.name + "'";
  for (int64_t d : data.sample_shape)
    if (d <= 0) throw std::runtime_error(who + ": sample shape has a dimension " + std::to_string(d));
  for (int64_t d : data.target_shape)
    if (d <= 0) throw std::runtime_error(who + ": target shape has a dimension " + std::to_string(d));
  if (data.num_classes < 0) throw std::runtime_error(who + ": num_classes is negative");
  if (data.text) {
    check_text(data, who);
    return;  // bytes are classes [0, 256)
  }
  if (data.source) {
    if (!data.x.empty() || !data.y.empty() || data.source->count < 0 || !data.source->fetch)
      throw std::runtime_error(who + ": a sample source holds no x / y and needs a count and a fetch");
    return;
  }
  if (static_cast<int64_t>(data.y.size()) != data.size() * data.target_numel())
    throw std::runtime_error(who + ": y holds " + std::to_string(data.y.size()) + " floats, not a multiple of " +
                             std::to_string(data.target_numel()) + " targets per sample");
  const int64_t want = data.size() * data.sample_numel();
  if (static_cast<int64_t>(data.x.size()) != want)
    throw std::runtime_error(who + ": x holds " + std::to_string(data.x.size()) + " floats, expected " +
                             std::to_string(want) + " (" + std::to_string(data.size()) + " samples of " +
                             std::to_string(data.sample_numel()) + ")");
  if (data.num_classes > 0) {
    for (size_t i = 0; i < data.y.size(); ++i)
      if (const std::string why = label_refusal(data.y[i], data.num_classes); !why.empty())
        throw std::runtime_error(who + ": sample " + std::to_string(static_cast<int64_t>(i) / data.target_numel()) +
                                 " has label " + std::to_string(data.y[i]) + ", " + why);
  }
}

std::string label_refusal(float label, int64_t num_classes) {
  if (num_classes <= 0) return std::isfinite(label) ? "" : "not a finite number";
  if (label >= 0.0f && label < static_cast<float>(num_classes) && label == std::floor(label)) return "";
  return "not a class in [0, " + std::to_string(num_classes) + ")";
}

std::string find_fashion_mnist(const std::string& dir_override) {
  std::string dir = dir_override;
  std::string source = "--dataset-dir";
  if (dir.empty()) {
    const char* env = std::getenv("CLEAVE_DATA_DIR");
    if (env && *env) {
      dir = env;
      source = "$CLEAVE_DATA_DIR";
    } else {
      dir = kDefaultFashionDir;
      source = "";
    }
  }
  std::vector<std::string> missing = missing_fashion_files(dir);
  if (missing.empty()) return dir;
  // A data root holding a fashion-mnist/ folder is accepted too.
  const fs::path nested = fs::path(dir) / "fashion-mnist";
  if (missing_fashion_files(nested).empty()) return nested.string();
  std::string list;
  for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
  throw std::runtime_error("Fashion-MNIST not found in " + dir + (source.empty() ? "" : " (from " + source + ")") +
                           ": install it with `apt-get install dataset-fashion-mnist` or pass --dataset-dir"
                           " (missing " + list + ")");
}

Dataset load_fashion_mnist(const std::string& dir, bool train, int64_t limit) {
  const fs::path root = find_fashion_mnist(dir);
  const std::string prefix = train ? "train" : "t10k";
  const std::string images = find_idx_file(root, prefix + "-images-idx3-ubyte");
  const std::string labels = find_idx_file(root, prefix + "-labels-idx1-ubyte");
  Dataset data = load_idx(images, labels, train ? "fashion-mnist/train" : "fashion-mnist/test", limit);
  if (data.sample_shape != Shape{1, 28, 28})
    throw std::runtime_error(images + ": Fashion-MNIST images must be 28x28");
  if (data.num_classes > 10)
    throw std::runtime_error(labels + ": Fashion-MNIST label " + std::to_string(data.num_classes - 1) +
                             " is not in [0, 10)");
  data.num_classes = 10;
  return data;
}

Dataset load_dataset(const std::string& name_or_path, const std::string& dataset_dir, bool train,
                     int64_t limit, const CsvOptions& csv) {
  const std::string key = lower(name_or_path);
  if (key == "fashion-mnist" || key == "fashion_mnist" || key == "fashionmnist")
    return load_fashion_mnist(dataset_dir, train, limit);
  if (name_or_path.empty())
    throw std::runtime_error("no dataset given: expected 'fashion-mnist', a .csv file or a directory of IDX files");

  const std::string path = resolve(name_or_path, dataset_dir);
  std::error_code ec;
  if (ends_with(key, ".csv")) {
    std::string file = path;
    if (!train) {
      file = csv_test_sibling(path);
      if (!fs::exists(file, ec))
        throw std::runtime_error(path + ": no test split: " + file + " does not exist");
    }
    CsvOptions opts = csv;
    if (limit >= 0) opts.limit = limit;
    return load_csv(file, opts);
  }
  if (fs::is_directory(path, ec)) return load_idx_dir(path, train, limit);
  if (fs::exists(path, ec))
    throw std::runtime_error(path + ": unsupported dataset file: expected a .csv file or a directory of IDX files");
  throw std::runtime_error("unknown dataset '" + name_or_path +
                           "': expected 'fashion-mnist', a .csv file or a directory of IDX files (no such file or "
                           "directory" + (dataset_dir.empty() ? "" : ", also looked in " + dataset_dir) + ")");
}

Dataset subset(const Dataset& data, const std::vector<int64_t>& indices) {
  Dataset out;
  out.name = data.name;
  out.sample_shape = data.sample_shape;
  out.target_shape = data.target_shape;
  out.num_classes = data.num_classes;
  const int64_t n = data.size();
  const size_t per = static_cast<size_t>(data.sample_numel()), tper = static_cast<size_t>(data.target_numel());
  if (!data.text && !data.source && data.x.size() != static_cast<size_t>(n) * per)
    throw std::runtime_error("subset of dataset '" + data.name + "': x holds " + std::to_string(data.x.size()) +
                             " floats, expected " + std::to_string(n) + " samples of " + std::to_string(per));
  out.x.resize(indices.size() * per);
  out.y.resize(indices.size() * tper);
  for (const int64_t i : indices)
    if (i < 0 || i >= n)
      throw std::out_of_range("subset of dataset '" + data.name + "': index " + std::to_string(i) +
                              " is outside [0, " + std::to_string(n) + ")");
  data.copy_samples(indices.data(), static_cast<int64_t>(indices.size()), out.x.data(), out.y.data());
  return out;
}

}  // namespace cleave
