// keys.h: CURVE key pairs on disk and allow-lists of public keys.
//
// Keys are Z85 text (40 characters for 32 bytes), as ZeroMQ uses them.
// `NAME.key` holds the secret key (first line; file mode 0600) and `NAME.pub`
// the public key (first line). Secret key files readable by group or others
// are refused. An AllowList maps public keys to names: loaded from a
// directory of *.pub files (name = file stem) or from one file with one key per
// line ("KEY" or "NAME KEY"; a '#' at the start of a line or after
// whitespace starts a comment — '#' is also a Z85 character). Every loading error names
// the file and the line.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cleave::transport {

struct KeyPair {
  std::string public_key;  // Z85, 40 chars
  std::string secret_key;  // Z85, 40 chars
};

// Fresh CURVE key pair from the system's CSPRNG (zmq_curve_keypair).
KeyPair generate_keypair();
// The public key belonging to `secret_key` (zmq_curve_public). Throws on a malformed key.
std::string public_key_of(const std::string& secret_key);

// Paths written by write_keypair.
struct KeyFiles {
  std::filesystem::path secret;  // DIR/NAME.key, mode 0600
  std::filesystem::path public_;  // DIR/NAME.pub, mode 0644
};

// Writes DIR/NAME.key (created with mode 0600, never briefly world-readable)
// and DIR/NAME.pub. Creates DIR (mode 0700) if missing. Refuses (throws
// std::runtime_error) when either file exists unless `overwrite`, or when NAME
// is not [A-Za-z0-9._-]+ (no path separators).
KeyFiles write_keypair(const std::filesystem::path& dir, const std::string& name,
                       const KeyPair& keys, bool overwrite = false);

// Reads a secret key file (and derives its public key). Throws
// std::runtime_error naming the file when it is missing, malformed, or
// readable by group/others (fix: chmod 600 FILE).
KeyPair load_secret_key(const std::filesystem::path& path);
// Reads a public key file. Throws std::runtime_error naming the file when malformed.
std::string load_public_key(const std::filesystem::path& path);

// Public keys admitted by a server's ZAP handler, each with a name.
class AllowList {
 public:
  AllowList() = default;
  // A directory of *.pub files, or one file of keys. Throws std::runtime_error
  // naming the file (and line) for malformed keys, duplicate names, or an
  // empty list.
  static AllowList load(const std::filesystem::path& path);

  // Adds a key; throws std::invalid_argument on a malformed key or a name
  // already bound to a different key.
  void add(const std::string& name, const std::string& public_key_z85);
  // Name for the key, or nullopt when the key is not admitted.
  std::optional<std::string> name_of(const std::string& public_key_z85) const;
  // Key for the name, or nullopt.
  std::optional<std::string> key_of(const std::string& name) const;
  size_t size() const { return by_key_.size(); }
  bool empty() const { return by_key_.empty(); }
  std::vector<std::string> names() const;

 private:
  std::map<std::string, std::string> by_key_;   // z85 -> name
  std::map<std::string, std::string> by_name_;  // name -> z85
};

}  // namespace cleave::transport
