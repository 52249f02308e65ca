// cleave: the coordinator CLI. Thin: every command lives in cmd_*.cpp over the libraries.
#include <csignal>
#include <cstdio>
#include <exception>
#include <algorithm>
#include <string>
#include <vector>

#include "apps/cleave/commands.h"
#include "apps/cleave/run_record.h"
#include "cleave/version.h"
#include "device/cpu/process_env.h"
#include "transport/allow_watch.h"

namespace {

// SIGHUP: every coordinator re-reads its allow-list (revoking removed keys)
// within 0.1 s; the handler only bumps a counter the endpoints poll.
void on_sighup(int) { cleave::transport::request_allow_list_reload(); }

// "cleave: error: WHAT\nRun `cleave SUB --help` for the flags.\n", naming the
// subcommand that was being parsed.
std::string usage_error(const CLI::App& root, const char* what) {
  std::string cmd = "cleave";
  for (const CLI::App* sub : root.get_subcommands()) {
    cmd += ' ';
    cmd += sub->get_name();
  }
  std::string msg = "cleave: error: ";
  msg += what;
  msg += "\nRun `";
  msg += cmd;
  msg += " --help` for the flags.\n";
  return msg;
}

}  // namespace

int main(int argc, char** argv) {
  cleave::restart_with_cpu_environment(argv);
  std::signal(SIGHUP, on_sighup);
  CLI::App app{"cleave: train one neural network across several small devices"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cleave " CLEAVE_VERSION_STRING);
  // Bad command lines: "cleave: error: WHAT" and where to find the flags.
  app.failure_message([](const CLI::App* root, const CLI::Error& e) { return usage_error(*root, e.what()); });
#define CLEAVE_COMMAND(name) cleave::add_##name##_command(app);
#include "apps/cleave/command_list.inc"
#undef CLEAVE_COMMAND
  // CLI11 answers an unknown command with "A subcommand is required": name it.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      found = found || sub->get_name() == argv[1];
      if (!known.empty()) known += ", ";
      known += sub->get_name();
    }
    if (!found) {
      const std::string what = std::string("unknown command '") + argv[1] + "' (commands: " + known + ")";
      std::fputs(usage_error(app, what.c_str()).c_str(), stderr);
      return cleave::kExitUsage;
    }
  }
  try {
    // `cleave train|fed --resume DIR`: the flags the run recorded in DIR, too (run_record.h).
    std::vector<std::string> args = cleave::expand_resume(std::vector<std::string>(argv, argv + argc));
    args.erase(args.begin());                // CLI11 takes the arguments without the program's name,
    std::reverse(args.begin(), args.end());  // last first
    app.parse(std::move(args));
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0; everything else CLI11
    // refuses is a bad command line (CLI11's own codes are 101-1xx).
    const int code = app.exit(e);
    return code == 0 ? 0 : cleave::kExitUsage;
  } catch (const cleave::UsageError& e) {
    std::fputs(usage_error(app, e.what()).c_str(), stderr);
    return cleave::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cleave: error: %s\n", e.what());
    return cleave::kExitFailure;
  }
  return 0;
}
