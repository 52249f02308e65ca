// cmd_keygen.cpp: `cleave keygen` — a CURVE key pair for a coordinator or a device.
#include <cstdio>
#include <filesystem>
#include <string>
#include <memory>

#include "apps/cleave/commands.h"
#include "transport/keys.h"

namespace cleave {

void add_keygen_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("keygen", "Write a CURVE key pair: DIR/NAME.key (secret, mode 0600) and DIR/NAME.pub");
  auto dir = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  cmd->add_option("--out", *dir, "Directory for the key files (created with mode 0700 if missing)")->required();
  cmd->add_option("--name", *name, "Key name: coordinator or device name ([A-Za-z0-9._-]+)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& in) -> std::string {
            const bool ok = !in.empty() && in.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                                "0123456789._-") == std::string::npos;
            return ok ? std::string() : "'" + in + "' must be letters, digits, '.', '_' or '-' (it names DIR/NAME.key)";
          },
          "NAME", "key name"));
  cmd->add_flag("--force", *force, "Overwrite existing key files");
  cmd->callback([dir, name, force]() {
    namespace fs = std::filesystem;
    if (!*force)
      for (const char* ext : {".key", ".pub"})
        if (const fs::path p = fs::path(*dir) / (*name + ext); fs::exists(p))
          throw CliError(p.string() + " already exists: refusing to replace a key (pass --force to overwrite it)");
    auto files = transport::write_keypair(*dir, *name, transport::generate_keypair(), *force);
    std::printf("wrote %s (secret) and %s (public)\n", files.secret.c_str(), files.public_.c_str());
  });
}

}  // namespace cleave
