// run_record.h: the command line a run with checkpoints records beside them,
// so that `cleave SUB --resume DIR` runs it again with the same settings.
//
// DIR/command.json holds {"command": SUB, "flags": ["--name=value", ...]}:
// every flag given to SUB except --resume, --load and --init (a resumed run
// starts from its newest checkpoint). `cleave SUB --resume DIR
// [FLAGS]` becomes `cleave SUB FLAGS STORED --resume DIR`, where STORED are
// the stored flags whose names FLAGS does not give: flags given now replace
// stored ones (a new --listen, --json or --register-timeout, say).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace cleave {

// Writes DIR/command.json (atomically) for the parsed subcommand `cmd`.
void record_run_command(const std::string& dir, const CLI::App& cmd);

// `args` (argv) with a `--resume DIR` of a train or fed command expanded from
// DIR/command.json as above; unchanged otherwise. Throws UsageError when DIR
// holds no command record or one of another command.
std::vector<std::string> expand_resume(const std::vector<std::string>& args);

}  // namespace cleave
