// test_safetensors.cpp: safetensors writing (exact layout), reading of F32 / F16 /
// BF16 / F64, and refusal of malformed files.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/io/atomic_file.h"
#include "core/io/safetensors.h"
#include "io/io_test_util.h"

using namespace cleave;
using cleave::test::read_bytes;
using cleave::test::ScratchDir;
using cleave::test::write_bytes;

namespace {

// A safetensors file from a header (padded to 8-byte alignment unless told
// otherwise) and raw data bytes.
std::vector<unsigned char> make_file(const std::string& header, const std::vector<unsigned char>& data,
                                     bool pad = true, uint64_t len_override = 0) {
  std::string h = header;
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::vector<unsigned char> f(8);
  put_u64_le(f.data(), len_override ? len_override : h.size());
  f.insert(f.end(), h.begin(), h.end());
  f.insert(f.end(), data.begin(), data.end());
  return f;
}

std::vector<unsigned char> u16s(std::initializer_list<uint16_t> v) {
  std::vector<unsigned char> out;
  for (uint16_t x : v) {
    out.push_back(static_cast<unsigned char>(x & 0xff));
    out.push_back(static_cast<unsigned char>(x >> 8));
  }
  return out;
}

std::vector<unsigned char> f32s(std::initializer_list<float> v) {
  std::vector<unsigned char> out(v.size() * 4);
  size_t i = 0;
  for (float x : v) put_u32_le(out.data() + 4 * i++, std::bit_cast<uint32_t>(x));
  return out;
}

}  // namespace

TEST_CASE("safetensors round-trip and exact layout", "[io][safetensors]") {
  ScratchDir dir("st");
  const std::string path = dir.file("m.safetensors");
  const std::vector<NamedTensor> tensors = {
      {"0.weight", {2, 3}, {1, 2, 3, 4, 5, 6}},
      {"0.bias", {2}, {-0.5f, 0.25f}},
      {"scalar", {}, {7.f}},
      {"empty", {0, 4}, {}},
  };
  write_safetensors(path, tensors, {{"format", "pt"}, {"producer", "cleave"}});
  CHECK(dir.entries() == std::vector<std::string>{"m.safetensors"});

  const auto bytes = read_bytes(path);
  const uint64_t n = get_u64_le(bytes.data());
  CHECK((8 + n) % 8 == 0);
  const auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  CHECK(header.at("0.weight") ==
        nlohmann::json({{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}));
  CHECK(header.at("0.bias") == nlohmann::json({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {24, 32}}}));
  CHECK(header.at("scalar").at("data_offsets") == nlohmann::json({32, 36}));
  CHECK(header.at("scalar").at("shape") == nlohmann::json::array());
  CHECK(header.at("empty").at("data_offsets") == nlohmann::json({36, 36}));
  CHECK(header.at("__metadata__") == nlohmann::json({{"format", "pt"}, {"producer", "cleave"}}));
  CHECK(bytes.size() == 8 + n + 36);
  float first = 0;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  CHECK(first == 1.f);

  const auto back = read_safetensors(path);
  REQUIRE(back.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(back[i].name == tensors[i].name);  // data-offset order = written order
    CHECK(back[i].shape == tensors[i].shape);
    CHECK(back[i].data == tensors[i].data);
  }
  CHECK(read_safetensors_metadata(path) == std::map<std::string, std::string>{{"format", "pt"}, {"producer", "cleave"}});
}

TEST_CASE("safetensors writer refuses bad tensors", "[io][safetensors]") {
  ScratchDir dir("st");
  const std::string p = dir.file("w.safetensors");
  CHECK_THROWS_WITH(write_safetensors(p, {{"a", {2}, {1.f}}}),
                    Catch::Contains("tensor 'a' has shape (2) (2 values) but 1 values"));
  CHECK_THROWS_WITH(write_safetensors(p, {{"a", {1}, {1.f}}, {"a", {1}, {1.f}}}),
                    Catch::Contains("duplicate tensor name 'a'"));
  CHECK_THROWS_WITH(write_safetensors(p, {{"__metadata__", {1}, {1.f}}}), Catch::Contains("reserved"));
  CHECK_THROWS_WITH(write_safetensors(p, {{"", {1}, {1.f}}}), Catch::Contains("must not be empty"));
  CHECK_THROWS_WITH(write_safetensors(p, {{"n", {-1}, {}}}), Catch::Contains("negative dimension"));
  CHECK(dir.entries().empty());
}

TEST_CASE("safetensors reader converts F16, BF16 and F64", "[io][safetensors]") {
  ScratchDir dir("st");
  const std::string p = dir.file("h.safetensors");
  // F16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), 2^-14 (smallest normal),
  //      0x3555 = 0.333251953125, -0, +inf, 0x0200 = 2^-15 (subnormal)
  // BF16: 1, -3, 0x4049 = 3.140625, 0x0001 = 2^-133 (subnormal)
  std::vector<unsigned char> data = u16s({0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x3555, 0x8000, 0x7C00, 0x0200});
  const auto bf = u16s({0x3F80, 0xC040, 0x4049, 0x0001});
  data.insert(data.end(), bf.begin(), bf.end());
  for (double d : {0.1, -1e10, 1e300}) {
    unsigned char b[8];
    put_u64_le(b, std::bit_cast<uint64_t>(d));
    data.insert(data.end(), b, b + 8);
  }
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[3,3],"data_offsets":[0,18]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[18,26]},)"
      R"("d":{"dtype":"F64","shape":[3,1],"data_offsets":[26,50]}})";
  write_bytes(p, make_file(header, data));
  const auto t = read_safetensors(p);
  REQUIRE(t.size() == 3);
  CHECK(t[0].name == "h");
  CHECK(t[0].shape == Shape{3, 3});
  const std::vector<float> h = {1.f, -2.f, 65504.f, std::ldexp(1.f, -24), std::ldexp(1.f, -14), 0.333251953125f,
                                -0.f, std::numeric_limits<float>::infinity(), std::ldexp(1.f, -15)};
  CHECK(t[0].data == h);
  CHECK(std::signbit(t[0].data[6]));
  CHECK(t[1].data == std::vector<float>{1.f, -3.f, 3.140625f, std::ldexp(1.f, -133)});
  CHECK(t[2].shape == Shape{3, 1});
  CHECK(t[2].data == std::vector<float>{0.1f, -1e10f, std::numeric_limits<float>::infinity()});

  // F16 NaN stays NaN.
  write_bytes(p, make_file(R"({"n":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", u16s({0x7E00})));
  CHECK(std::isnan(read_safetensors(p)[0].data[0]));
}

TEST_CASE("malformed safetensors files are refused", "[io][safetensors]") {
  ScratchDir dir("st");
  const std::string p = dir.file("bad.safetensors");
  const auto two = f32s({1.f, 2.f});
  auto refuses = [&](const std::vector<unsigned char>& file, const std::string& text) {
    write_bytes(p, file);
    CHECK_THROWS_WITH(read_safetensors(p), Catch::StartsWith(p + ": ") && Catch::Contains(text));
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_bytes(p, make_file(ok, two));
  CHECK(read_safetensors(p)[0].data == std::vector<float>{1.f, 2.f});
  write_bytes(p, make_file(ok, two, false));  // unpadded headers are accepted too
  CHECK(read_safetensors(p).size() == 1);

  refuses({1, 2, 3}, "not a safetensors file: only 3 bytes");
  refuses(make_file(ok, two, true, 1000), "header length 1000 exceeds the file size");
  refuses(make_file(ok, two, true, uint64_t{1} << 62), "exceeds the file size");
  refuses(make_file("", two, false), "empty header");
  refuses(make_file("{\"a\": [", two), "not JSON");
  refuses(make_file("[1, 2]", two), "expected a JSON object");
  refuses(make_file(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", two),
          "tensor 'a': unsupported dtype I64 (supported: F32, F16, BF16, F64)");
  refuses(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", two),
          "tensor 'a': shape [3] of F32 does not match data_offsets [0,8] (8 bytes)");
  refuses(make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", two),
          "run past the end of the data (8 bytes)");
  refuses(make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", two), "must hold integers >= 0");
  refuses(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", two), "run backwards");
  refuses(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", two), "must be two integers");
  refuses(make_file(R"({"a":{"dtype":"F32","shape":[2]}})", two), "expected an object with dtype, shape and data_offsets");
  refuses(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", two),
          "does not match data_offsets");
  refuses(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    two),
          "tensors 'a' [0, 8) and 'b' [4, 8) overlap");
  refuses(make_file(R"({"__metadata__":{"k":1}})", two), "__metadata__ value of 'k' is not a string");
  CHECK_THROWS_WITH(read_safetensors(dir.file("none.safetensors")), Catch::Contains("cannot open"));
}
