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
#include "core/monitor/listen_address.h"
#include "core/runtime/coordinator/session_monitor.h"

namespace cleave {

// --metrics-listen's value. The endpoint is the process's, not a driver's
// (session_monitor.h), so the value lives here, not in the option structs.
inline std::string& metrics_listen_flag() {
  static std::string value;
  return value;
}

// HOST:PORT (core/monitor/listen_address.h); anything else is a usage error.
inline CLI::Validator listen_address_check() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        try {
          monitor::parse_listen_address(in);
          return "";
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
      },
      "HOST:PORT", "listen address");
}

// Adds --key, --allow, --listen, --register-timeout, --insecure and --metrics-listen. `daemon`
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
  cmd.add_option("--metrics-listen", metrics_listen_flag(),
                 prefix + "Serve Prometheus metrics at http://HOST:PORT/metrics during the run, e.g. 127.0.0.1:9464 "
                 "(port 0: any free one, logged); unauthenticated, so keep it on loopback or firewalled (default: off)")
      ->check(listen_address_check());
}

// Before the coordinator starts: throws UsageError "`who` needs --key and
// --allow (or --insecure)`hint`" when they are missing, warns about
// --insecure, starts the metrics endpoint of --metrics-listen (throws
// std::runtime_error when it cannot listen) and lets Ctrl-C stop the run cleanly.
template <class Options>
void prepare_coordinator(Options& o, const std::string& who, const std::string& hint = "") {
  if (!o.insecure && (o.key_path.empty() || o.allow_path.empty()))
    throw UsageError(who + " needs --key and --allow (or --insecure)" + hint);
  if (o.insecure) std::fprintf(stderr, "cleave: WARNING: --insecure: links are not encrypted or authenticated\n");
  if (!metrics_listen_flag().empty())
    install_coordinator_monitor(std::make_shared<CoordinatorMonitor>(metrics_listen_flag(), "cleave"));
  install_interrupt_handler();
  o.interrupted = interrupted;
}

}  // namespace cleave
