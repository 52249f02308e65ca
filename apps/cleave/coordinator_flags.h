// coordinator_flags.h: what the commands that run a coordinator (`cleave
// train` without --local, `profile`, `fed`, `split`) share: the flags that say
// where daemons dial in and who may, and the checks and Ctrl-C handling before
// the coordinator starts. Works with any of the drivers' option structs
// (ClusterOptions, FedOptions, SplitOptions): they all carry key_path,
// allow_path, listen, register_timeout_ms, insecure and interrupted.
#pragma once

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/cleave/commands.h"
#include "apps/common/processes.h"
#include "apps/flag_checks.h"

namespace cleave {

// Adds --key, --allow, --listen, --register-timeout and --insecure. `daemon`
// names what dials in ("client", "device", "daemon"); `prefix` starts every
// help text ("Pipeline: " for `cleave train`).
template <class Options>
void add_coordinator_flags(CLI::App& cmd, Options& o, const std::string& daemon, const std::string& prefix = "") {
  cmd.add_option("--key", o.key_path, prefix + "The coordinator's secret key (from `cleave keygen`)");
  cmd.add_option("--allow", o.allow_path, prefix + "Directory of admitted " + daemon + " .pub files (or one key file)");
  cmd.add_option("--listen", o.listen, prefix + "Where the " + daemon + "s dial in")->capture_default_str();
  cmd.add_option("--register-timeout", o.register_timeout_ms, prefix + "ms to wait for the " + daemon + "s")
      ->capture_default_str()
      ->check(flag_checks::positive());
  cmd.add_flag("--insecure", o.insecure, prefix + "Plain TCP without CURVE (logs a warning)");
}

// Before the coordinator starts: throws UsageError "`who` needs --key and
// --allow (or --insecure)`hint`" when they are missing, warns about
// --insecure, and lets Ctrl-C stop the run cleanly.
template <class Options>
void prepare_coordinator(Options& o, const std::string& who, const std::string& hint = "") {
  if (!o.insecure && (o.key_path.empty() || o.allow_path.empty()))
    throw UsageError(who + " needs --key and --allow (or --insecure)" + hint);
  if (o.insecure) std::fprintf(stderr, "cleave: WARNING: --insecure: links are not encrypted or authenticated\n");
  install_interrupt_handler();
  o.interrupted = interrupted;
}

}  // namespace cleave
