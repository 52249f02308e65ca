// csv.cpp: the numeric CSV reader.
//
// One sample per row; one column is the label (or regression target), the
// others are features in file order. Cells may be surrounded by spaces or
// double quotes; quoted cells cannot contain the delimiter (this is a reader
// for numeric tables, not a full RFC 4180 parser). Blank lines are skipped.
// Messages give 1-based line and column numbers, as editors show them.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/dataset.h"

namespace cleave {
namespace {

constexpr double kMaxExactLabel = 16777216.0;  // 2^24: larger integers are not exact in a float

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

// Splits `line` into `cells` (cleared first; reused across lines).
void split(std::string_view line, char delim, std::vector<std::string_view>& cells) {
  cells.clear();
  size_t start = 0;
  while (true) {
    const size_t at = line.find(delim, start);
    cells.push_back(trim(line.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start)));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
}

// The number in `cell`, or nullopt when the whole cell is not one number.
std::optional<double> parse_number(std::string_view cell) {
  const bool plus = !cell.empty() && cell.front() == '+';
  if (plus) cell.remove_prefix(1);
  if (cell.empty() || (plus && (cell.front() == '+' || cell.front() == '-'))) return std::nullopt;
  double v = 0.0;
  const auto [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
  if (end != cell.data() + cell.size()) return std::nullopt;
  if (ec == std::errc::result_out_of_range) {
    // Too small rounds to zero; too large is infinite (refused by the caller).
    const bool negative = cell.front() == '-';
    if (cell.find("e-") != std::string_view::npos || cell.find("E-") != std::string_view::npos)
      return negative ? -0.0 : 0.0;
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  if (ec != std::errc()) return std::nullopt;
  return v;
}

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

std::string quote(std::string_view cell) { return "'" + std::string(cell) + "'"; }

std::string shape_text(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// Resolves the label column option against the first row (0-based result).
size_t label_index(const std::string& path, const std::string& option, const std::vector<std::string>& header,
                   size_t columns) {
  if (option == "first") return 0;
  if (option == "last") return columns - 1;
  if (!option.empty() && std::all_of(option.begin(), option.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    size_t index = 0;
    const auto [end, ec] = std::from_chars(option.data(), option.data() + option.size(), index);
    if (ec != std::errc() || end != option.data() + option.size() || index >= columns)
      throw std::runtime_error(path + ": label column " + option + " is out of range: rows have " +
                               std::to_string(columns) + " columns (the label column is a 0-based index)");
    return index;
  }
  if (header.empty())
    throw std::runtime_error(path + ": label column '" + option +
                             "' is a name but the file has no header row (use an index, 'first' or 'last')");
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i] == option) return i;
  std::string names;
  for (size_t i = 0; i < header.size() && i < 12; ++i) names += (i ? ", " : "") + header[i];
  if (header.size() > 12) names += ", ...";
  throw std::runtime_error(path + ": no column named '" + option + "' in the header (columns: " + names + ")");
}

}  // namespace

Dataset load_csv(const std::string& path, const CsvOptions& opts) {
  if (opts.delimiter == '"' || opts.delimiter == '\n' || opts.delimiter == '\r')
    throw std::invalid_argument("load_csv: delimiter cannot be a quote or a line break");
  if (!std::isfinite(opts.scale)) throw std::invalid_argument("load_csv: scale must be a finite number");
  if (opts.num_classes < 0) throw std::invalid_argument("load_csv: num_classes must be >= 0");
  std::error_code fs_ec;
  if (std::filesystem::is_directory(path, fs_ec)) throw std::runtime_error(path + ": is a directory, not a CSV file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));

  Dataset data;
  data.name = std::filesystem::path(path).stem().string();
  std::vector<std::string> header;
  size_t columns = 0;
  size_t label = 0;
  int64_t first_line = 0;  // line of the row that fixed the column count
  bool detected_data = false;  // header detection read the first row as data
  double max_label = -1.0;
  int64_t rows = 0;
  std::string line;
  std::vector<std::string_view> cells;
  int64_t line_no = 0;
  const std::string where = path + ":";
  while (std::getline(in, line)) {
    ++line_no;
    std::string_view view(line);
    if (line_no == 1 && view.substr(0, 3) == "\xEF\xBB\xBF") view.remove_prefix(3);  // UTF-8 BOM
    if (is_blank(view)) continue;
    split(view, opts.delimiter, cells);
    auto at_line = [&] { return where + std::to_string(line_no) + ": "; };
    if (columns == 0) {
      columns = cells.size();
      first_line = line_no;
      if (columns < 2)
        throw std::runtime_error(at_line() + "a row needs a label column and at least one feature column, found " +
                                 std::to_string(columns) + " column");
      bool is_header = opts.header == CsvHeader::present;
      if (opts.header == CsvHeader::detect)
        is_header = std::none_of(cells.begin(), cells.end(), [](std::string_view c) { return parse_number(c).has_value(); });
      detected_data = opts.header == CsvHeader::detect && !is_header;
      if (is_header) for (std::string_view c : cells) header.emplace_back(c);
      label = label_index(path, opts.label_column, header, columns);
      if (is_header) continue;
    }
    if (opts.limit >= 0 && rows >= opts.limit) break;
    if (cells.size() != columns)
      throw std::runtime_error(at_line() + std::to_string(cells.size()) + " columns, but line " + std::to_string(first_line) +
                               " has " + std::to_string(columns));
    for (size_t c = 0; c < columns; ++c) {
      auto at = [&] { return at_line() + "column " + std::to_string(c + 1) + ": "; };
      const std::optional<double> v = parse_number(cells[c]);
      if (!v) {
        if (cells[c].empty()) throw std::runtime_error(at() + "empty cell, expected a number");
        throw std::runtime_error(at() + quote(cells[c]) + " is not a number" +
                                 (detected_data && line_no == first_line
                                      ? " (a header row must have no numeric cell; or declare the header present)"
                                      : ""));
      }
      if (!std::isfinite(*v)) throw std::runtime_error(at() + quote(cells[c]) + " is not a finite number");
      if (!std::isfinite(static_cast<float>(*v)))
        throw std::runtime_error(at() + quote(cells[c]) + " is outside the range of a 32-bit float");
      if (c == label) {
        if (!opts.regression) {
          if (*v < 0.0 || *v != std::floor(*v) || *v >= kMaxExactLabel)
            throw std::runtime_error(at() + "label " + quote(cells[c]) + " is not an integer >= 0");
          if (opts.num_classes > 0 && *v >= opts.num_classes)
            throw std::runtime_error(at() + "label " + quote(cells[c]) + " is not below num_classes " +
                                     std::to_string(opts.num_classes));
          max_label = std::max(max_label, *v);
        }
        data.y.push_back(static_cast<float>(*v));
      } else {
        data.x.push_back(static_cast<float>(*v) * opts.scale);
      }
    }
    ++rows;
  }
  if (in.bad()) throw std::runtime_error(path + ": read error: " + std::strerror(errno));
  if (columns == 0 || (rows == 0 && opts.limit != 0)) throw std::runtime_error(path + ": no data rows");

  const int64_t features = columns > 0 ? static_cast<int64_t>(columns) - 1 : 0;
  if (opts.sample_shape.empty()) {
    data.sample_shape = {features};
  } else {
    data.sample_shape = opts.sample_shape;
    if (std::any_of(opts.sample_shape.begin(), opts.sample_shape.end(), [](int64_t d) { return d <= 0; }) ||
        data.sample_numel() != features)
      throw std::runtime_error(path + ": sample_shape " + shape_text(opts.sample_shape) + " does not hold the " +
                               std::to_string(features) + " features of a row");
  }
  if (opts.regression) data.num_classes = 0;
  else data.num_classes = opts.num_classes > 0 ? opts.num_classes : static_cast<int>(max_label) + 1;
  return data;
}

}  // namespace cleave
