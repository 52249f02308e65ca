// dataset.h: in-memory datasets and the readers that fill them.
//
// A Dataset is the whole split in host memory: float features, one sample after
// another, and the targets of each sample: one float (a class index or a
// regression target) or, for a text read by load_text, one class per position.
// A text's training split keeps its bytes instead (`text`): sample i is then
// the window at byte offset i, made when it is read (copy_sample). Readers
// validate everything they read and throw std::runtime_error naming the file
// and what is wrong with it (bad magic, truncated data, a cell that is not a
// number, ...); they never return a half-filled dataset. Formats, the lookup
// of Fashion-MNIST and the CSV options are described in docs/data.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cleave {

// Same alias as device/tensor.h (redeclared here so cleave_data does not need
// the device library).
using Shape = std::vector<int64_t>;

struct Dataset {
  std::string name;
  Shape sample_shape;     // shape of one sample, e.g. (1, 28, 28) or (features)
  int num_classes = 0;    // classes for classification; 0 for regression targets
  std::vector<float> x;   // (size, sample_shape...) row-major
  std::vector<float> y;   // (size, target_shape...): class index as float, or the regression target
  Shape target_shape;     // the targets of one sample: () one value, (T) a class per position (text)
  // Windows of a byte text (load_text's training split), when set: x and y are
  // empty and sample i, at offset o = i * text_stride while o + T < text->size(),
  // is bytes [o, o + T) with targets bytes [o + 1, o + T + 1), T = sample_shape[0].
  std::shared_ptr<const std::vector<uint8_t>> text;
  // Offset of window i in `text`: i * text_stride (1: every offset, a text's
  // training windows; T: non-overlapping ones, its validation windows).
  int64_t text_stride = 1;
  // Samples someone else holds (an embedding app's data callback), when set:
  // x and y are empty, size() is source->count, and copy_samples asks
  // source->fetch for them (it throws when it cannot give them).
  struct Source {
    int64_t count = 0;
    std::function<void(const int64_t* indices, int64_t n, float* x, float* y)> fetch;
  };
  std::shared_ptr<const Source> source;
  // Samples one epoch draws (BatchLoader): -1 all of them; else the first
  // epoch_samples of the epoch's order (a text's epoch: distinct random windows).
  int64_t epoch_samples = -1;

  int64_t size() const;
  // Floats per sample: the product of sample_shape.
  int64_t sample_numel() const;
  // Target floats per sample: the product of target_shape (1 for ()).
  int64_t target_numel() const;
  // Copies sample i's features (sample_numel floats) to `x` and its targets
  // (target_numel floats) to `y`. i must be in [0, size()).
  void copy_sample(int64_t i, float* x, float* y) const;
  // The same for the n samples at `indices`, one after another (one fetch of a source).
  void copy_samples(const int64_t* indices, int64_t n, float* x, float* y) const;
};

// Throws std::runtime_error when x / y / sample_shape / target_shape / text /
// source / num_classes disagree (x.size() != size * sample_numel, a class
// label outside [0, num_classes)). A source's samples are not read: whoever
// fetches them checks them.
void check_dataset(const Dataset& data);

// "" when `label` is a valid target for a dataset of `num_classes` classes (a
// whole number in [0, num_classes); any finite number when num_classes is 0,
// a regression target), else what it is not ("not a class in [0, 10)").
std::string label_refusal(float label, int64_t num_classes);

// Reads an IDX image file and an IDX label file (gzip or uncompressed, detected
// by content). Images: unsigned-byte IDX with 2, 3 or 4 dimensions (N, ...);
// samples get shape (features), (1, rows, cols) or (d1, d2, d3) and are scaled
// to [0, 1] by /255. Labels: unsigned-byte IDX1 (N). limit >= 0 reads only the
// first `limit` samples (-1: all). num_classes = max label + 1.
Dataset load_idx(const std::string& images_path, const std::string& labels_path,
                 const std::string& name, int64_t limit = -1);

// The Fashion-MNIST directory: dir_override if non-empty, else
// $CLEAVE_DATA_DIR if set, else /usr/share/datasets/fashion-mnist. Throws
// std::runtime_error (with the apt-get hint) when its four IDX files, each
// plain or .gz, are not all there.
std::string find_fashion_mnist(const std::string& dir_override);

// Fashion-MNIST train (60000) or test (10000) split: shape (1, 28, 28), 10
// classes, pixels in [0, 1]. `dir` goes through find_fashion_mnist ("" = the
// default lookup).
Dataset load_fashion_mnist(const std::string& dir, bool train, int64_t limit = -1);

// Where a CSV file's header row comes from.
enum class CsvHeader { detect, present, absent };

struct CsvOptions {
  // Label / target column: a 0-based index ("0"), "first", "last", or a header
  // name (needs a header row).
  std::string label_column = "0";
  // detect: the first row is a header when none of its cells is a number.
  CsvHeader header = CsvHeader::detect;
  Shape sample_shape;            // empty: (features); else its numel must equal the feature count
  float scale = 1.0f;            // every feature is multiplied by this (e.g. 1/255)
  int64_t limit = -1;            // read at most this many data rows (-1: all)
  int num_classes = 0;           // 0: max label + 1; else labels must be below it
  bool regression = false;       // targets are any finite number; num_classes = 0
  char delimiter = ',';
};

// Reads a numeric CSV file: one sample per row, one label column, the other
// columns are the features in file order. Throws std::runtime_error naming
// file, line and column ("data.csv:17: column 4: 'abc' is not a number").
Dataset load_csv(const std::string& path, const CsvOptions& opts = {});

// The front door used by the apps. `name_or_path` is
//   "fashion-mnist"      -> load_fashion_mnist(dataset_dir, train, limit)
//   a path ending .csv   -> load_csv; the test split is the sibling file whose
//                           name has its last "train" replaced by "test"
//                           (data/train.csv -> data/test.csv); a relative path
//                           not found as given is looked up in dataset_dir
//   a directory          -> load_idx on {train,t10k,test}-{images-idx3,labels-idx1}-ubyte[.gz]
// Throws std::runtime_error when nothing matches or the split is missing.
Dataset load_dataset(const std::string& name_or_path, const std::string& dataset_dir, bool train,
                     int64_t limit = -1, const CsvOptions& csv = {});

// A byte text for a language model (`--text`): the file's bytes, vocabulary
// 256. The first floor(0.9 n) of its n bytes train, the rest validate (no
// seed: every run validates on the same bytes). `context` is the model's T.
//   train: every window of T bytes in the training bytes, as `text` windows
//          (size = train bytes - T); an epoch draws epoch_samples of them,
//          distinct, in a seeded random order (BatchLoader): floor(train
//          bytes / T), about one pass over the bytes, or `limit` (if >= 0,
//          capped at size).
//   validation: the non-overlapping windows at offsets 0, T, 2T, ... of the
//          validation bytes (floor((val bytes - 1) / T) of them, at most
//          `limit` if >= 0), as `text` windows of text_stride T (only the
//          bytes they cover are kept).
// Inputs and targets are byte values as floats, target_shape (T),
// num_classes 256. Throws std::runtime_error naming the file when it cannot
// be read or a split is too short for one window of T + 1 bytes.
Dataset load_text(const std::string& path, int64_t context, bool train, int64_t limit = -1);

// Where Debian's `fortunes` package puts its texts.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";
// The shipped example text: every file of `dir` but the .dat indexes, in name
// order, written as one file `out` (what docs/models.md builds by hand);
// returns `out`. Throws std::runtime_error when `dir` holds none (install
// Debian's `fortunes`) or `out` cannot be written.
std::string write_fortunes_text(const std::string& dir, const std::string& out);

// The samples at `indices` (in that order, repeats allowed), same name, shapes
// and num_classes, in x / y (text windows are materialised). Throws std::out_of_range for an index outside [0, size).
Dataset subset(const Dataset& data, const std::vector<int64_t>& indices);

}  // namespace cleave
