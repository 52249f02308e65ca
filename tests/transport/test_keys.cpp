// test_keys.cpp: key files (modes, refusal to overwrite, permission checks) and allow-lists.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <fstream>

#include "tests/transport/temp_dir.h"
#include "transport/keys.h"

using namespace cleave::transport;
using cleave::transport::testing::TempDir;
namespace fs = std::filesystem;

TEST_CASE("keygen writes a 0600 secret and a public key, and refuses to overwrite", "[transport][keys]") {
  TempDir tmp;
  const KeyPair kp = generate_keypair();
  CHECK(kp.public_key.size() == 40);
  CHECK(public_key_of(kp.secret_key) == kp.public_key);
  const auto dir = tmp.path() / "keys";
  KeyFiles files = write_keypair(dir, "dev-a", kp);
  struct stat st {};
  REQUIRE(::stat(files.secret.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(load_public_key(files.public_) == kp.public_key);
  const KeyPair loaded = load_secret_key(files.secret);
  CHECK(loaded.secret_key == kp.secret_key);
  CHECK(loaded.public_key == kp.public_key);

  CHECK_THROWS_WITH(write_keypair(dir, "dev-a", generate_keypair()), Catch::Contains("already exists"));
  CHECK(load_secret_key(files.secret).secret_key == kp.secret_key);  // untouched
  const KeyPair other = generate_keypair();
  write_keypair(dir, "dev-a", other, /*overwrite=*/true);
  CHECK(load_secret_key(files.secret).secret_key == other.secret_key);
  CHECK_THROWS_WITH(write_keypair(dir, "../evil", kp), Catch::Contains("must be letters"));
}

TEST_CASE("secret keys readable by others are refused and malformed keys name the file", "[transport][keys]") {
  TempDir tmp;
  KeyFiles files = write_keypair(tmp.path(), "k", generate_keypair());
  fs::permissions(files.secret, fs::perms::group_read, fs::perm_options::add);
  CHECK_THROWS_WITH(load_secret_key(files.secret), Catch::Contains("chmod 600") && Catch::Contains("k.key"));
  const auto bad = tmp.path() / "bad.pub";
  std::ofstream(bad) << "not a key\n";
  CHECK_THROWS_WITH(load_public_key(bad), Catch::Contains("bad.pub") && Catch::Contains("Z85"));
  CHECK_THROWS_WITH(load_public_key(tmp.path() / "missing.pub"), Catch::Contains("missing.pub"));
}

TEST_CASE("allow-lists from a directory or a file", "[transport][keys]") {
  TempDir tmp;
  const auto dir = tmp.path() / "allow";
  const KeyPair a = generate_keypair(), b = generate_keypair(), c = generate_keypair();
  write_keypair(dir, "alpha", a);
  write_keypair(dir, "beta", b);
  AllowList list = AllowList::load(dir);
  CHECK(list.size() == 2);
  CHECK(list.name_of(a.public_key) == "alpha");
  CHECK(list.name_of(b.public_key) == "beta");
  CHECK(!list.name_of(c.public_key));
  CHECK(list.key_of("beta") == b.public_key);

  const auto file = tmp.path() / "clients.txt";
  std::ofstream(file) << "# devices\n" << a.public_key << "\n" << "gamma " << c.public_key << "  # jetson\n";
  AllowList from_file = AllowList::load(file);
  CHECK(from_file.name_of(a.public_key) == "clients");
  CHECK(from_file.name_of(c.public_key) == "gamma");

  // '#' starts a comment anywhere on a line (no real key can start with it:
  // its first Z85 group would exceed 2^32).
  std::ofstream(tmp.path() / "hash.txt") << "# comment line\n" << b.public_key << " # trailing\n";
  CHECK(AllowList::load(tmp.path() / "hash.txt").name_of(b.public_key) == "hash");

  std::ofstream(tmp.path() / "broken.txt") << a.public_key << "\nshort-key\n";
  CHECK_THROWS_WITH(AllowList::load(tmp.path() / "broken.txt"), Catch::Contains("broken.txt:2"));
  std::ofstream(dir / "zeta.pub") << "garbage\n";
  CHECK_THROWS_WITH(AllowList::load(dir), Catch::Contains("zeta.pub"));
  fs::create_directories(tmp.path() / "empty");
  CHECK_THROWS_WITH(AllowList::load(tmp.path() / "empty"), Catch::Contains("no *.pub"));
  CHECK_THROWS_AS(AllowList::load(tmp.path() / "nowhere"), std::runtime_error);
}
