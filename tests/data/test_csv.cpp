// Tests for the CSV reader: good files (header detection, label column by
// index / name / "last", shape, scale, limit, regression) and bad ones, whose
// messages must name file, line and column.
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "core/data/dataset.h"
#include "data/fixtures.h"

using namespace cleave;
using cleave::test::TempDir;
using cleave::test::write_text;
using Catch::Matchers::Contains;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("csv: label first, no header", "[data][csv]") {
  TempDir dir;
  const std::string path = dir.file("data.csv");
  write_text(path, "1,0.5,2\n0, 3 ,-4e-1\r\n\n2,+1,0\n");
  const Dataset d = load_csv(path);
  CHECK(d.name == "data");
  CHECK(d.size() == 3);
  CHECK(d.sample_shape == Shape{2});
  CHECK(d.num_classes == 3);
  CHECK(d.y == std::vector<float>{1, 0, 2});
  CHECK(d.x == std::vector<float>{0.5f, 2.0f, 3.0f, -0.4f, 1.0f, 0.0f});
  CHECK_NOTHROW(check_dataset(d));
}

TEST_CASE("csv: header detection and label by name or last", "[data][csv]") {
  TempDir dir;
  const std::string path = dir.file("h.csv");
  write_text(path, "\xEF\xBB\xBF" "a,\"b\",label\n1,2,1\n3,4,0\n");
  CsvOptions opts;
  opts.label_column = "label";
  Dataset d = load_csv(path, opts);
  CHECK(d.size() == 2);
  CHECK(d.y == std::vector<float>{1, 0});
  CHECK(d.x == std::vector<float>{1, 2, 3, 4});
  opts.label_column = "last";
  CHECK(load_csv(path, opts).y == d.y);
  opts.label_column = "2";
  CHECK(load_csv(path, opts).y == d.y);
  opts.label_column = "b";
  CHECK(load_csv(path, opts).y == std::vector<float>{2, 4});

  // A numeric first row is data unless the header is declared present.
  const std::string numeric = dir.file("n.csv");
  write_text(numeric, "0,1\n1,2\n");
  CHECK(load_csv(numeric).size() == 2);
  CsvOptions present;
  present.header = CsvHeader::present;
  CHECK(load_csv(numeric, present).size() == 1);
  // An explicitly absent header makes a text first row an error.
  CsvOptions absent;
  absent.header = CsvHeader::absent;
  CHECK_THAT(error_of([&] { load_csv(path, absent); }), Contains(path + ":1: column 1: 'a' is not a number"));
}

TEST_CASE("csv: sample shape, scale, limit, num_classes, delimiter", "[data][csv]") {
  TempDir dir;
  const std::string path = dir.file("img.csv");
  write_text(path, "label,p0,p1,p2,p3\n3,0,255,51,102\n1,255,0,0,0\n0,1,1,1,1\n");
  CsvOptions opts;
  opts.sample_shape = {1, 2, 2};
  opts.scale = 1.0f / 255.0f;
  opts.limit = 2;
  opts.num_classes = 10;
  const Dataset d = load_csv(path, opts);
  CHECK(d.size() == 2);
  CHECK(d.sample_shape == Shape{1, 2, 2});
  CHECK(d.num_classes == 10);
  CHECK(d.x[1] == Approx(1.0f));
  CHECK(d.x[2] == Approx(0.2f));
  opts.limit = 0;
  CHECK(load_csv(path, opts).size() == 0);

  opts.limit = -1;
  opts.sample_shape = {3};
  CHECK_THAT(error_of([&] { load_csv(path, opts); }), Contains(path + ": sample_shape (3,) does not hold the 4 features"));

  const std::string semi = dir.file("semi.csv");
  write_text(semi, "1;2;3\n0;4;5\n");
  CsvOptions semicolon;
  semicolon.delimiter = ';';
  CHECK(load_csv(semi, semicolon).x == std::vector<float>{2, 3, 4, 5});
}

TEST_CASE("csv: regression targets", "[data][csv]") {
  TempDir dir;
  const std::string path = dir.file("r.csv");
  write_text(path, "x1,x2,y\n1,2,-0.5\n3,4,2.25\n");
  CsvOptions opts;
  opts.label_column = std::string("y");  // not `= "y"`: GCC 12's false -Wrestrict (GCC bug 105329)
  CHECK_THAT(error_of([&] { load_csv(path, opts); }), Contains(path + ":2: column 3: label '-0.5' is not an integer >= 0"));
  opts.regression = true;
  const Dataset d = load_csv(path, opts);
  CHECK(d.num_classes == 0);
  CHECK(d.y == std::vector<float>{-0.5f, 2.25f});
  CHECK_NOTHROW(check_dataset(d));
}

TEST_CASE("csv: errors name file, line and column", "[data][csv]") {
  TempDir dir;
  const std::string path = dir.file("data.csv");
  auto error_for = [&](const std::string& text, const CsvOptions& opts = {}) {
    write_text(path, text);
    return error_of([&] { load_csv(path, opts); });
  };
  CHECK_THAT(error_for("1,2,3,4\n0,1,2,abc\n"), Contains(path + ":2: column 4: 'abc' is not a number"));
  // A first row mixing text and numbers is data, and the message says how to declare a header.
  CHECK_THAT(error_for("y,1,2\n0,1,2\n"), Contains(path + ":1: column 1: 'y' is not a number (a header row"));
  CHECK_THAT(error_for("1,2,3\n0,1\n"), Contains(path + ":2: 2 columns, but line 1 has 3"));
  CHECK_THAT(error_for("a,b,c\n\n1,2,3\n1,2,3,4\n"), Contains(path + ":4: 4 columns, but line 1 has 3"));
  CHECK_THAT(error_for("1,2\n2.5,1\n"), Contains(path + ":2: column 1: label '2.5' is not an integer >= 0"));
  CHECK_THAT(error_for("-1,2\n"), Contains(path + ":1: column 1: label '-1' is not an integer >= 0"));
  CHECK_THAT(error_for("1,,3\n"), Contains(path + ":1: column 2: empty cell, expected a number"));
  CHECK_THAT(error_for("1,nan\n"), Contains(path + ":1: column 2: 'nan' is not a finite number"));
  CHECK_THAT(error_for("1,1e999\n"), Contains(path + ":1: column 2: '1e999' is not a finite number"));
  CHECK_THAT(error_for("1,1e300\n"), Contains(path + ":1: column 2: '1e300' is outside the range of a 32-bit float"));
  write_text(path, "1,1e-999\n");  // underflow reads as zero
  CHECK(load_csv(path).x == std::vector<float>{0.0f});

  CHECK_THAT(error_for("1,+-2\n"), Contains("'+-2' is not a number"));
  CHECK_THAT(error_for("1,0x10\n"), Contains("'0x10' is not a number"));
  CHECK_THAT(error_for("5\n"), Contains(path + ":1: a row needs a label column and at least one feature column"));
  CHECK_THAT(error_for(""), Contains(path + ": no data rows"));
  CHECK_THAT(error_for("a,b\n"), Contains(path + ": no data rows"));
  CsvOptions ten;
  ten.num_classes = 10;
  CHECK_THAT(error_for("12,1\n", ten), Contains(path + ":1: column 1: label '12' is not below num_classes 10"));
  CsvOptions named;
  named.label_column = "target";
  CHECK_THAT(error_for("a,b\n1,2\n", named), Contains(path + ": no column named 'target' in the header (columns: a, b)"));
  CHECK_THAT(error_for("1,2\n", named), Contains("is a name but the file has no header row"));
  CsvOptions far;
  far.label_column = "7";
  CHECK_THAT(error_for("1,2\n", far), Contains(path + ": label column 7 is out of range: rows have 2 columns"));
  CHECK_THAT(error_of([&] { load_csv(dir.file("missing.csv")); }), Contains(dir.file("missing.csv") + ": cannot open"));
  CHECK_THAT(error_of([&] { load_csv(dir.str()); }), Contains("is a directory"));
  CsvOptions bad_delim;
  bad_delim.delimiter = '"';
  CHECK_THROWS_AS(load_csv(path, bad_delim), std::invalid_argument);
}

TEST_CASE("load_dataset: csv train and test siblings", "[data][csv]") {
  TempDir dir;
  write_text(dir.file("blobs-train.csv"), "0,1,1\n1,2,2\n1,3,3\n");
  write_text(dir.file("blobs-test.csv"), "1,9,9\n");
  const Dataset train = load_dataset(dir.file("blobs-train.csv"), "", true, -1);
  const Dataset test = load_dataset(dir.file("blobs-train.csv"), "", false, -1);
  CHECK(train.size() == 3);
  CHECK(test.size() == 1);
  CHECK(test.x == std::vector<float>{9, 9});
  CHECK(load_dataset(dir.file("blobs-train.csv"), "", true, 2).size() == 2);
  // Relative to --dataset-dir.
  CHECK(load_dataset("blobs-train.csv", dir.str(), true, -1).size() == 3);

  write_text(dir.file("only.csv"), "0,1\n");
  CHECK(load_dataset(dir.file("only.csv"), "", true, -1).size() == 1);
  CHECK_THAT(error_of([&] { load_dataset(dir.file("only.csv"), "", false, -1); }),
             Contains("no test split: the file name has no 'train'"));
  write_text(dir.file("x_train.csv"), "0,1\n");
  CHECK_THAT(error_of([&] { load_dataset(dir.file("x_train.csv"), "", false, -1); }),
             Contains(dir.file("x_test.csv") + " does not exist"));
}
