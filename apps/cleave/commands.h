// commands.h: the subcommands of the `cleave` coordinator CLI.
//
// Each command lives in its own cmd_<name>.cpp and registers its flags and its
// action on the root CLI11 app; main.cpp only calls the registrations. A command
// reports failure by throwing cleave::CliError (message printed, exit code 1)
// or any std::exception (message printed, exit code 1).
#pragma once

#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

namespace cleave {

struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void add_train_command(CLI::App& root);
void add_export_command(CLI::App& root);
void add_keygen_command(CLI::App& root);
void add_plan_command(CLI::App& root);
void add_profile_command(CLI::App& root);
void add_demo_command(CLI::App& root);
void add_fed_command(CLI::App& root);
void add_split_command(CLI::App& root);

}  // namespace cleave
