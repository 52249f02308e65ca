// commands.h: the subcommands of the `cleave` coordinator CLI.
//
// Each command lives in its own cmd_<name>.cpp and registers its flags and its
// action on the root CLI11 app; main.cpp only calls the registrations.
//
// Exit status: 0 success; 2 a bad command line (unknown flag, missing or
// malformed value, flags that do not go together: CLI11's own errors and
// cleave::UsageError), printed with the usage hint; 1 the run failed
// (cleave::CliError or any other std::exception: a missing file, a daemon that
// died, ...), message printed.
#pragma once

#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

namespace cleave {

// The run failed: exit status 1.
struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The command line is wrong (flags that do not go together, a value the
// command refuses): exit status 2, like CLI11's own parse errors.
struct UsageError : CliError {
  using CliError::CliError;
};

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

void add_train_command(CLI::App& root);
void add_export_command(CLI::App& root);
void add_keygen_command(CLI::App& root);
void add_plan_command(CLI::App& root);
void add_profile_command(CLI::App& root);
void add_demo_command(CLI::App& root);
void add_fed_command(CLI::App& root);
void add_split_command(CLI::App& root);
void add_generate_command(CLI::App& root);

}  // namespace cleave
