// spawn() (apps/common/processes.h): a child outlives the thread that started
// it, and dies with the process (PR_SET_PDEATHSIG is set from a process-long
// thread, since the kernel ties it to the forking thread).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <chrono>
#include <thread>

#include "apps/common/processes.h"

TEST_CASE("a child spawned from a thread that has ended keeps running", "[apps][processes]") {
  pid_t pid = -1;
  std::thread([&] {
    pid = cleave::spawn({"/bin/sleep", "30"});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the child is past its prctl and exec
  }).join();
  REQUIRE(pid > 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int status = 0;
  CHECK(waitpid(pid, &status, WNOHANG) == 0);  // still running: no SIGTERM when its thread ended
  cleave::terminate(pid, 1000);
  CHECK(waitpid(pid, &status, WNOHANG) == -1);  // reaped
}

TEST_CASE("spawn says which program it could not start", "[apps][processes]") {
  const pid_t pid = cleave::spawn({"/nonexistent/cleaved"});
  REQUIRE(pid > 0);  // fork succeeded; exec failed in the child
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 127);
}
