// test_checkpoint.cpp: the CLEAVECK format: round-trip, atomic replacement, and
// refusal of truncated, corrupted, foreign, newer and inconsistent files.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/io/atomic_file.h"
#include "core/io/checkpoint.h"
#include "io/io_test_util.h"

using namespace cleave;
using cleave::test::read_bytes;
using cleave::test::ScratchDir;
using cleave::test::write_bytes;

namespace {

Checkpoint sample() {
  Checkpoint c;
  c.meta = {{"step", 42}, {"model", {{"name", "mlp"}, {"layers", {1, 2, 3}}}}, {"note", "ünïcödé"}};
  c.blocks.push_back({"params", {1.f, -2.5f, 3.25f, 0.f, -0.f, std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::denorm_min(), 1e-30f}});
  c.blocks.push_back({"empty", {}});
  c.blocks.push_back({"optimizer/exp_avg", {0.125f, 0.5f}});
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

uint32_t crc(const unsigned char* p, size_t n) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), p, static_cast<uInt>(n)));
}

// Builds a checkpoint file by hand from the layout documented in checkpoint.h,
// with valid checksums, so that the loader's own consistency checks can be reached.
std::vector<unsigned char> build_raw(uint32_t version, const std::string& header, const std::vector<float>& data,
                                     uint64_t header_len_field = UINT64_MAX, uint64_t file_len_field = UINT64_MAX) {
  std::vector<unsigned char> f(36);
  std::memcpy(f.data(), "CLEAVECK", 8);
  const uint64_t file_len = 36 + header.size() + data.size() * 4 + 4;
  put_u32_le(f.data() + 8, version);
  put_u64_le(f.data() + 16, header_len_field == UINT64_MAX ? header.size() : header_len_field);
  put_u64_le(f.data() + 24, file_len_field == UINT64_MAX ? file_len : file_len_field);
  put_u32_le(f.data() + 32, crc(f.data(), 32));
  f.insert(f.end(), header.begin(), header.end());
  for (float x : data) {
    unsigned char b[4];
    put_u32_le(b, std::bit_cast<uint32_t>(x));
    f.insert(f.end(), b, b + 4);
  }
  unsigned char t[4];
  put_u32_le(t, crc(f.data(), f.size()));
  f.insert(f.end(), t, t + 4);
  return f;
}

}  // namespace

TEST_CASE("checkpoint round-trip is bit-exact", "[io][checkpoint]") {
  ScratchDir dir("ckpt");
  const std::string path = dir.file("a.ckpt");
  Checkpoint c = sample();
  c.blocks.push_back({"nan", {std::numeric_limits<float>::quiet_NaN()}});
  std::vector<float> big(300000);  // spans several write chunks
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.001f - 7.f;
  c.blocks.push_back({"big", big});
  save_checkpoint(path, c);
  const Checkpoint back = load_checkpoint(path);
  CHECK(back.meta == c.meta);
  REQUIRE(back.blocks.size() == c.blocks.size());
  for (size_t i = 0; i < c.blocks.size(); ++i) {
    CHECK(back.blocks[i].first == c.blocks[i].first);
    CHECK(same_bits(back.blocks[i].second, c.blocks[i].second));
  }
  CHECK(back.block("optimizer/exp_avg") == std::vector<float>{0.125f, 0.5f});
  CHECK(back.has_block("empty"));
  CHECK_FALSE(back.has_block("nope"));
  CHECK_THROWS_WITH(back.block("nope"), Catch::Contains("no block 'nope'") && Catch::Contains("params, empty"));
  CHECK(load_checkpoint_meta(path) == c.meta);
  CHECK(dir.entries() == std::vector<std::string>{"a.ckpt"});  // no temporary left behind
}

TEST_CASE("checkpoint files follow the documented layout", "[io][checkpoint]") {
  ScratchDir dir("ckpt");
  Checkpoint c;
  c.meta = {{"k", 1}};
  c.blocks.push_back({"w", {1.5f, -2.f}});
  save_checkpoint(dir.file("x"), c);
  const auto bytes = read_bytes(dir.file("x"));
  const std::string header = R"({"blocks":[{"count":2,"name":"w"}],"meta":{"k":1}})";
  CHECK(bytes == build_raw(1, header, {1.5f, -2.f}));
  CHECK(std::memcmp(bytes.data(), "CLEAVECK", 8) == 0);
  CHECK(get_u32_le(bytes.data() + 8) == kCheckpointVersion);
  CHECK(get_u64_le(bytes.data() + 24) == bytes.size());
}

TEST_CASE("saving replaces the old checkpoint atomically", "[io][checkpoint]") {
  ScratchDir dir("ckpt");
  const std::string path = dir.file("model.ckpt");
  Checkpoint old = sample();
  save_checkpoint(path, old);
  const auto old_bytes = read_bytes(path);

  SECTION("a second save replaces the file") {
    Checkpoint c;
    c.meta = {{"step", 43}};
    save_checkpoint(path, c);
    CHECK(load_checkpoint(path).meta == c.meta);
    CHECK(dir.entries() == std::vector<std::string>{"model.ckpt"});
  }
  SECTION("a write error mid-file (file size limit) leaves the old file and no temporary") {
    Checkpoint c;
    c.blocks.push_back({"big", std::vector<float>(1 << 20, 1.f)});  // 4 MiB
    struct rlimit saved {};
    REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    auto* old_handler = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = saved;
    small.rlim_cur = 64 * 1024;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string error;
    try {
      save_checkpoint(path, c);
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, old_handler);
    CHECK_THAT(error, Catch::Contains(path) && Catch::Contains("write failed"));
    CHECK(read_bytes(path) == old_bytes);
    CHECK(dir.entries() == std::vector<std::string>{"model.ckpt"});
  }
  SECTION("an invalid checkpoint is refused before touching the file") {
    Checkpoint c;
    c.blocks = {{"a", {1.f}}, {"a", {2.f}}};
    CHECK_THROWS_WITH(save_checkpoint(path, c), Catch::Contains("duplicate checkpoint block 'a'"));
    c.blocks = {{"", {1.f}}};
    CHECK_THROWS_WITH(save_checkpoint(path, c), Catch::Contains("must not be empty"));
    CHECK(read_bytes(path) == old_bytes);
    CHECK(dir.entries() == std::vector<std::string>{"model.ckpt"});
  }
  SECTION("a read-only directory is refused and the old file survives") {
    std::filesystem::permissions(dir.path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    if (::access(dir.path.c_str(), W_OK) == 0) {
      // Running as root: permissions do not stop us; the rlimit case above covers this.
      std::filesystem::permissions(dir.path, std::filesystem::perms::owner_all);
      SUCCEED("read-only directories are writable for root; skipped");
    } else {
      CHECK_THROWS_WITH(save_checkpoint(path, sample()), Catch::Contains("cannot create temporary file"));
      std::filesystem::permissions(dir.path, std::filesystem::perms::owner_all);
      CHECK(read_bytes(path) == old_bytes);
      CHECK(dir.entries() == std::vector<std::string>{"model.ckpt"});
    }
  }
  SECTION("a missing directory is named in the error") {
    CHECK_THROWS_WITH(save_checkpoint(dir.file("no/such/dir.ckpt"), sample()),
                      Catch::Contains("no/such/dir.ckpt") && Catch::Contains("No such file or directory"));
  }
}

TEST_CASE("truncated checkpoints are refused", "[io][checkpoint]") {
  ScratchDir dir("ckpt");
  const std::string path = dir.file("t.ckpt");
  save_checkpoint(path, sample());
  const auto full = read_bytes(path);
  const size_t n = full.size();
  for (size_t len : {size_t{0}, size_t{3}, size_t{8}, size_t{20}, size_t{35}, size_t{36}, size_t{39}, size_t{40},
                     size_t{60}, n / 2, n - 5, n - 4, n - 1}) {
    DYNAMIC_SECTION("length " << len) {
      const std::string cut = dir.file("cut.ckpt");
      write_bytes(cut, std::vector<unsigned char>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len)));
      CHECK_THROWS_WITH(load_checkpoint(cut), Catch::StartsWith(cut + ": truncated"));
    }
  }
}

TEST_CASE("every single-bit flip is refused", "[io][checkpoint]") {
  ScratchDir dir("ckpt");
  const std::string path = dir.file("f.ckpt");
  save_checkpoint(path, sample());
  const auto good = read_bytes(path);
  const std::string bad = dir.file("bad.ckpt");
  int refused = 0;
  for (size_t pos = 0; pos < good.size(); ++pos) {
    // Every bit of the fixed header; one bit (rotating) per byte after it.
    const int bits_here = pos < 36 ? 8 : 1;
    for (int k = 0; k < bits_here; ++k) {
      const int bit = pos < 36 ? k : static_cast<int>(pos % 8);
      auto bytes = good;
      bytes[pos] = static_cast<unsigned char>(bytes[pos] ^ (1u << bit));
      write_bytes(bad, bytes);
      std::string msg;
      try {
        (void)load_checkpoint(bad);
      } catch (const std::runtime_error& e) {
        msg = e.what();
      }
      INFO("byte " << pos << " bit " << bit << ": " << msg);
      if (pos < 8) {
        CHECK_THAT(msg, Catch::Equals(bad + ": not a cleave checkpoint (the file does not start with \"CLEAVECK\")"));
      } else {
        CHECK_THAT(msg, Catch::StartsWith(bad + ": checksum mismatch: the file is corrupted") &&
                            Catch::EndsWith("re-save it or use an older checkpoint"));
      }
      refused += msg.empty() ? 0 : 1;
    }
  }
  CHECK(refused == static_cast<int>(8 * 36 + good.size() - 36));
}

TEST_CASE("foreign, newer and inconsistent checkpoint files are refused", "[io][checkpoint]") {
  ScratchDir dir("ckpt");
  const std::string p = dir.file("x.ckpt");
  const std::string header = R"({"blocks":[{"count":2,"name":"w"}],"meta":{}})";

  write_bytes(p, build_raw(1, header, {1.f, 2.f}));
  CHECK(load_checkpoint(p).block("w") == std::vector<float>{1.f, 2.f});  // the hand-built file is valid

  write_bytes(p, {'{', '"', 'a', '"', ':', '1', '}', '\n', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ',
                  ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '});
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("not a cleave checkpoint"));

  write_bytes(p, build_raw(2, header, {1.f, 2.f}));
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Equals(p + ": unsupported checkpoint format version 2 (this build "
                                                          "reads version 1; use a newer cleave)"));

  auto extra = build_raw(1, header, {1.f, 2.f});
  extra.push_back(0);
  write_bytes(p, extra);
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("1 unexpected bytes after the end"));

  // A header length larger than the file, with consistent checksums: refused before any allocation.
  write_bytes(p, build_raw(1, header, {1.f, 2.f}, uint64_t{1} << 60));
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("header length 1152921504606846976 does not fit"));

  // A block claiming more floats than the data holds.
  write_bytes(p, build_raw(1, R"({"blocks":[{"count":4611686018427387904,"name":"w"}],"meta":{}})", {1.f, 2.f}));
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("block 'w' (4611686018427387904 floats) runs past the end"));

  write_bytes(p, build_raw(1, R"({"blocks":[{"count":1,"name":"w"}],"meta":{}})", {1.f, 2.f}));
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("the blocks cover 4 bytes but the data has 8"));

  write_bytes(p, build_raw(1, R"({"blocks":[{"count":1,"name":"w"},{"count":1,"name":"w"}]})", {1.f, 2.f}));
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("duplicate block name 'w'"));

  write_bytes(p, build_raw(1, R"({"blocks":[{"count":-1,"name":"w"}]})", {}));
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("needs a string name and a count"));

  write_bytes(p, build_raw(1, "{not json", {}));
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("invalid checkpoint header (not JSON"));

  write_bytes(p, build_raw(1, "[]", {}));
  CHECK_THROWS_WITH(load_checkpoint(p), Catch::Contains("expected an object with a \"blocks\" array"));

  CHECK_THROWS_WITH(load_checkpoint(dir.file("missing.ckpt")),
                    Catch::Contains("missing.ckpt: cannot open: No such file or directory"));
  CHECK_THROWS_WITH(load_checkpoint(dir.path.string()), Catch::Contains("not a regular file"));
}

TEST_CASE("check_writable says where a file cannot be written and leaves nothing behind", "[io][checkpoint]") {
  const auto dir = std::filesystem::temp_directory_path() / ("cleave-writable-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CHECK_NOTHROW(check_writable((dir / "new.ckpt").string()));
  CHECK(std::filesystem::is_empty(dir));  // the probe's temporary file is gone
  CHECK_THROWS_WITH(check_writable((dir / "missing" / "x.ckpt").string()), Catch::Contains("missing"));
  CHECK_THROWS_WITH(check_writable(dir.string()), Catch::Contains("is a directory"));
  CHECK_THROWS_WITH(check_writable("/proc/cleave-check.ckpt"), Catch::Contains("/proc/cleave-check.ckpt"));
  std::filesystem::remove_all(dir);
}
