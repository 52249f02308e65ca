// atomic_file.cpp: POSIX implementation of AtomicFileWriter and InputFile.
#include "core/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace cleave {

namespace {

constexpr size_t kBufferBytes = 1 << 20;

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

uint32_t bswap32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}

}  // namespace

void check_writable(const std::string& path) {
  if (!path.empty() && path.back() == '/') throw std::runtime_error(path + ": is a directory, not a file");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw std::runtime_error(path + ": is a directory, not a file");
  AtomicFileWriter probe(path);  // creates the temporary file; removed again uncommitted
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw std::runtime_error("cannot write a file with an empty path");
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw std::runtime_error(path_ + ": cannot create temporary file " + tmp_ + ": " + std::strerror(err));
  }
  buf_.reserve(kBufferBytes);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  throw std::runtime_error(path_ + ": " + what + ": " + std::strerror(err));
}

void AtomicFileWriter::flush() {
  const char* p = buf_.data();
  size_t left = buf_.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed", errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  buf_.clear();
}

void AtomicFileWriter::write(const void* data, size_t n) {
  if (fd_ < 0) throw std::runtime_error(path_ + ": write after commit or failure");
  const char* p = static_cast<const char*>(data);
  size_ += n;
  while (n > 0) {
    const size_t take = std::min(n, kBufferBytes - buf_.size());
    buf_.append(p, take);
    p += take;
    n -= take;
    if (buf_.size() == kBufferBytes) flush();
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw std::runtime_error(path_ + ": commit after commit or failure");
  flush();
  if (::fsync(fd_) != 0) fail("fsync failed", errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("close failed", errno);
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename " + tmp_ + " over it", errno);
  committed_ = true;
  // Make the rename itself durable. A directory that cannot be opened or synced
  // (some file systems refuse) does not undo the rename, so it is not an error.
  const int dfd = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    throw std::runtime_error(path_ + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw std::runtime_error(path_ + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw std::runtime_error(path_ + ": not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* dst, size_t n) const {
  if (offset > size_ || n > size_ - offset)
    throw std::runtime_error(path_ + ": truncated: needs bytes up to " + std::to_string(offset + n) +
                             " but the file has " + std::to_string(size_));
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw std::runtime_error(path_ + ": read failed: " + std::strerror(err));
    }
    if (got == 0)
      throw std::runtime_error(path_ + ": truncated: the file shrank while being read");
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

void put_u32_le(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64_le(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32_le(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void floats_host_to_le(float* data, size_t n) {
  if constexpr (std::endian::native == std::endian::little) {
    (void)data;
    (void)n;
  } else {
    for (size_t i = 0; i < n; ++i) data[i] = std::bit_cast<float>(bswap32(std::bit_cast<uint32_t>(data[i])));
  }
}
void floats_le_to_host(float* data, size_t n) { floats_host_to_le(data, n); }

}  // namespace cleave
