// atomic_file.h: write a file so that readers see either the old or the new
// version, never a half-written one, and read files with bounded, checked reads.
//
// AtomicFileWriter writes to "PATH.tmp.<pid>" in the same directory, and commit()
// fsyncs it, renames it over PATH and fsyncs the directory. When anything fails,
// or the writer is destroyed without commit(), the temporary file is removed and
// PATH is left as it was. Every error is a std::runtime_error "PATH: what failed: why".
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cleave {

// Throws std::runtime_error "PATH: why" when no file could be written at
// `path` the way AtomicFileWriter writes one (its directory missing or
// read-only, PATH a directory), leaving PATH and its directory as they were.
// For flags such as --save, checked before a run's work, not after it.
void check_writable(const std::string& path);

class AtomicFileWriter {
 public:
  // Creates the temporary file (throws when the directory is missing or read-only).
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends `n` bytes (buffered).
  void write(const void* data, size_t n);
  // Bytes written so far.
  uint64_t size() const { return size_; }
  // Flushes, fsyncs, renames over the final path and fsyncs the directory.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  void flush();
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t size_ = 0;
  std::string buf_;
};

// A read-only file with checked positional reads (a short read is an error).
class InputFile {
 public:
  // Opens `path`; throws std::runtime_error "PATH: cannot open: <reason>".
  explicit InputFile(std::string path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly `n` bytes at `offset` into `dst` (throws when the file is shorter).
  void read_at(uint64_t offset, void* dst, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Little-endian encoding helpers shared by the file formats.
void put_u32_le(unsigned char* p, uint32_t v);
void put_u64_le(unsigned char* p, uint64_t v);
uint32_t get_u32_le(const unsigned char* p);
uint64_t get_u64_le(const unsigned char* p);
// Converts `n` floats between host order and little endian in place (no-op on LE hosts).
void floats_host_to_le(float* data, size_t n);
void floats_le_to_host(float* data, size_t n);

}  // namespace cleave
