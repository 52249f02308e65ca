// processes.h: child processes and Ctrl-C for commands that start daemons
// (`cleave demo`, benchmarks and integration tests).
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

// fork + exec `argv`; the child gets SIGTERM when this process dies
// (PR_SET_PDEATHSIG, set from one process-long thread, so not when the
// calling thread ends), and its stdout/stderr go to `log_path` ("" = inherit).
pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path = "");
// SIGTERM, wait up to `grace_ms`, then SIGKILL; reaps the child.
void terminate(pid_t pid, int grace_ms = 3000);

}  // namespace cleave
