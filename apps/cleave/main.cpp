// cleave: the coordinator CLI. Thin: every command lives in cmd_*.cpp over the libraries.
#include <cstdio>
#include <exception>

#include "apps/cleave/commands.h"
#include "device/cpu/openmp_policy.h"

int main(int argc, char** argv) {
  cleave::prefer_passive_openmp(argv);
  CLI::App app{"cleave: train one neural network across several small devices"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cleave 0.1.0");
#define CLEAVE_COMMAND(name) cleave::add_##name##_command(app);
#include "apps/cleave/command_list.inc"
#undef CLEAVE_COMMAND
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cleave: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
