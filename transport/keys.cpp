// keys.cpp: key generation, key files and allow-lists (see keys.h).
#include "transport/keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <zmq.h>

#include "transport/message.h"

namespace cleave::transport {
namespace fs = std::filesystem;

namespace {

std::runtime_error file_error(const fs::path& path, const std::string& what) {
  return std::runtime_error(path.string() + ": " + what);
}

// Whitespace-separated tokens of `line` up to a comment. '#' is a Z85
// character, but no 32-byte key can start with it: '#' is digit 84, and any
// 5-character group starting with it exceeds 2^32. So '#' always starts a comment.
std::vector<std::string> tokens(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  std::string t;
  while (in >> t) {
    if (t[0] == '#') break;
    out.push_back(t);
  }
  return out;
}

// First token of the first non-empty, non-comment line of a small key file.
std::string first_line(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw file_error(path, std::string("cannot open: ") + std::strerror(errno));
  std::string line;
  while (std::getline(in, line)) {
    auto t = tokens(line);
    if (!t.empty()) return t[0];
  }
  throw file_error(path, "no key found (empty file)");
}

bool valid_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

void write_file(const fs::path& path, const std::string& text, mode_t mode, bool overwrite) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  const int fd = ::open(path.c_str(), flags, mode);
  if (fd < 0) {
    if (errno == EEXIST)
      throw file_error(path, "already exists (refusing to overwrite a key; pass overwrite to replace it)");
    throw file_error(path, std::string("cannot create: ") + std::strerror(errno));
  }
  // O_CREAT's mode does not apply to an existing file, and umask may widen nothing
  // but can narrow; set the mode explicitly.
  if (::fchmod(fd, mode) != 0) {
    const int err = errno;
    ::close(fd);
    throw file_error(path, std::string("chmod failed: ") + std::strerror(err));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw file_error(path, std::string("write failed: ") + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) throw file_error(path, std::string("close failed: ") + std::strerror(errno));
}

}  // namespace

KeyPair generate_keypair() {
  char pub[41] = {};
  char sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    throw std::runtime_error(std::string("zmq_curve_keypair failed: ") + zmq_strerror(zmq_errno()) +
                             " (libzmq built without CURVE?)");
  return KeyPair{pub, sec};
}

std::string public_key_of(const std::string& secret_key) {
  if (!is_z85_key(secret_key)) throw std::invalid_argument("secret key is not 40 characters of Z85");
  char pub[41] = {};
  if (zmq_curve_public(pub, secret_key.c_str()) != 0)
    throw std::invalid_argument(std::string("zmq_curve_public failed: ") + zmq_strerror(zmq_errno()));
  return pub;
}

KeyFiles write_keypair(const fs::path& dir, const std::string& name, const KeyPair& keys,
                       bool overwrite) {
  if (!valid_name(name))
    throw std::runtime_error("key name '" + name + "' must be letters, digits, '.', '_' or '-'");
  if (!is_z85_key(keys.public_key) || !is_z85_key(keys.secret_key))
    throw std::runtime_error("write_keypair: malformed key pair");
  std::error_code ec;
  if (!fs::exists(dir)) {
    fs::create_directories(dir, ec);
    if (ec) throw file_error(dir, "cannot create directory: " + ec.message());
    fs::permissions(dir, fs::perms::owner_all, ec);
  } else if (!fs::is_directory(dir)) {
    throw file_error(dir, "is not a directory");
  }
  KeyFiles files{dir / (name + ".key"), dir / (name + ".pub")};
  if (!overwrite) {
    for (const auto& p : {files.secret, files.public_})
      if (fs::exists(p))
        throw file_error(p, "already exists (refusing to overwrite a key; pass overwrite to replace it)");
  }
  write_file(files.secret, keys.secret_key + "\n", 0600, overwrite);
  write_file(files.public_, keys.public_key + "\n", 0644, overwrite);
  return files;
}

KeyPair load_secret_key(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw file_error(path, std::string("cannot read secret key: ") + std::strerror(errno));
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw file_error(path, "secret key is accessible by group or others; run: chmod 600 " +
                               path.string());
  const std::string secret = first_line(path);
  if (!is_z85_key(secret))
    throw file_error(path, "not a CURVE secret key (expected 40 characters of Z85 text)");
  return KeyPair{public_key_of(secret), secret};
}

std::string load_public_key(const fs::path& path) {
  const std::string key = first_line(path);
  if (!is_z85_key(key))
    throw file_error(path, "not a CURVE public key (expected 40 characters of Z85 text)");
  return key;
}

void AllowList::add(const std::string& name, const std::string& public_key_z85) {
  if (!is_z85_key(public_key_z85))
    throw std::invalid_argument("allow-list entry '" + name + "': not a 40-character Z85 key");
  if (name.empty()) throw std::invalid_argument("allow-list entry with an empty name");
  if (auto it = by_name_.find(name); it != by_name_.end() && it->second != public_key_z85)
    throw std::invalid_argument("allow-list name '" + name + "' is bound to two different keys");
  if (auto it = by_key_.find(public_key_z85); it != by_key_.end() && it->second != name)
    throw std::invalid_argument("allow-list key of '" + name + "' is already listed as '" +
                                it->second + "'");
  by_key_[public_key_z85] = name;
  by_name_[name] = public_key_z85;
}

std::optional<std::string> AllowList::name_of(const std::string& key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> AllowList::key_of(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> AllowList::names() const {
  std::vector<std::string> out;
  for (const auto& [name, key] : by_name_) out.push_back(name);
  return out;
}

AllowList AllowList::load(const fs::path& path) {
  AllowList list;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.is_regular_file() && entry.path().extension() == ".pub") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const std::string key = load_public_key(f);
      try {
        list.add(f.stem().string(), key);
      } catch (const std::invalid_argument& e) {
        throw file_error(f, e.what());
      }
    }
    if (list.empty()) throw file_error(path, "allow-list directory holds no *.pub files");
    return list;
  }
  std::ifstream in(path);
  if (!in) throw file_error(path, "cannot open allow-list (no such file or directory)");
  std::string line;
  int lineno = 0;
  int keys_seen = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const std::vector<std::string> fields = tokens(line);
    if (fields.empty()) continue;
    const std::string where = path.string() + ":" + std::to_string(lineno);
    if (fields.size() > 2) throw std::runtime_error(where + ": expected 'KEY' or 'NAME KEY'");
    const std::string key = fields.back();
    const bool named = fields.size() == 2;
    // Bare keys are named after the file stem: STEM, STEM-2, STEM-3, ...
    ++keys_seen;
    std::string name = named ? fields[0] : path.stem().string();
    if (!named && keys_seen > 1) {
      name += '-';
      name += std::to_string(keys_seen);
    }
    if (!is_z85_key(key)) throw std::runtime_error(where + ": not a 40-character Z85 public key");
    try {
      list.add(name, key);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(where + ": " + e.what());
    }
  }
  if (list.empty()) throw file_error(path, "allow-list file holds no keys");
  return list;
}

}  // namespace cleave::transport
