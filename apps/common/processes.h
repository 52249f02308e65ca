// processes.h: child processes and Ctrl-C for commands that start daemons
// (`cleave demo`, benchmarks and integration tests), and what those read back.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace cleave {

// Installs SIGINT/SIGTERM handlers that set a flag instead of killing us.
void install_interrupt_handler();
bool interrupted();

// Path of the cleaved binary: next to this executable, in ../cleaved/ (build
// tree), or on PATH. Throws std::runtime_error when none is found.
std::string find_cleaved();
// The first of `names` that is an executable file in a directory of PATH
// (/usr/bin:/bin when PATH is unset), or "" when none is.
std::string find_on_path(const std::vector<std::string>& names);

// The whole file at `path` (a child's log or result, a /proc file), or ""
// when it cannot be read: a log its child has not written yet.
std::string read_text(const std::string& path);

// fork + exec `argv`; the child gets SIGTERM when this process dies
// (PR_SET_PDEATHSIG, set from one process-long thread, so not when the
// calling thread ends), and its stdout/stderr go to `log_path` ("" = inherit).
pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path = "");
// SIGTERM, wait up to `grace_ms`, then SIGKILL; reaps the child.
void terminate(pid_t pid, int grace_ms = 3000);

}  // namespace cleave
