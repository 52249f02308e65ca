// test_cleaved_config.cpp: cleaved's configuration file (issue 19, part):
// `--config FILE` of KEY = VALUE lines, flags override it, an unknown key or
// a bad value is an error naming the line, `--check-config` validates without
// starting and says where every option came from, and a daemon started from
// the file uses it.
#include <catch2/catch.hpp>

#include <string>

#include "apps/cli_util.h"
#include "integration/daemon_cluster.h"
#include "transport/keys.h"

using namespace cleave::cli_test;

namespace {

std::string dead_coordinator() { return "tcp://127.0.0.1:" + std::to_string(cleave::testing::free_loopback_port()); }

}  // namespace

TEST_CASE("cleaved --check-config reads a configuration file, flags override it, and nothing starts", "[cli][cleaved]") {
  TempDir dir;
  cleave::transport::write_keypair(dir.str(), "board1", cleave::transport::generate_keypair(), true);
  cleave::transport::write_keypair(dir.str(), "coordinator", cleave::transport::generate_keypair(), true);
  const std::string conf = dir.file("cleaved.conf");
  write_text(conf, "# a board's daemon\n"
                   "coordinator = " + dead_coordinator() + "\n"
                   "key = " + dir.file("board1.key") + "   # the secret key\n"
                   "coordinator-key = " + dir.file("coordinator.pub") + "\n"
                   "\n"
                   "backend = cpu\n"
                   "threads = 1\n"
                   "memory-limit = 256M\n"
                   "verbose = true\n");
  const RunResult r = run_cleaved("--config '" + conf + "' --threads 2 --check-config");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("the options are valid") != std::string::npos);
  CHECK(r.output.find(conf + ":8: memory-limit") != std::string::npos);  // from the file, with its line
  CHECK(r.output.find("(--threads)") != std::string::npos);              // the flag overrides the file's
  CHECK(r.output.find(conf + ":7: threads") == std::string::npos);
  CHECK(r.output.find("GFLOP/s") == std::string::npos);  // no device was opened, nothing dialled

  // The same file starts a daemon that uses it: it dials the file's coordinator and gives up after the flag's timeout.
  const RunResult run = run_cleaved("--config '" + conf + "' --connect-timeout 1");
  INFO(run.output);
  CHECK(run.code == kExitUsage);
  CHECK(run.output.find("no connection to the coordinator at tcp://127.0.0.1:") != std::string::npos);
  CHECK(run.output.find("board1") != std::string::npos);  // the name is the file's key's stem
}

TEST_CASE("cleaved refuses a configuration file's unknown key, bad value, repeated key or missing file, naming the line",
          "[cli][cleaved]") {
  TempDir dir;
  const std::string conf = dir.file("c.conf");
  write_text(conf, "coordinator = tcp://127.0.0.1:9\ninsecure = true\ncolour = blue\n");
  require_cleaved_usage_error("--config '" + conf + "' --check-config", {conf + ":3", "unknown key 'colour'", "memory-limit"});
  write_text(conf, "coordinator = tcp://127.0.0.1:9\ninsecure = true\nmemory-limit = 12Q\n");
  require_cleaved_usage_error("--config '" + conf + "' --check-config", {conf + ":3: memory-limit", "12Q"});
  write_text(conf, "coordinator = tcp://127.0.0.1:9\ninsecure = maybe\n");
  require_cleaved_usage_error("--config '" + conf + "' --check-config", {conf + ":2: insecure", "true or false"});
  write_text(conf, "coordinator = tcp://127.0.0.1:9\ninsecure = true\nthreads = 1\nthreads = 2\n");
  require_cleaved_usage_error("--config '" + conf + "' --check-config", {conf + ":4", "already set at " + conf + ":3"});
  write_text(conf, "coordinator tcp://127.0.0.1:9\n");
  require_cleaved_usage_error("--config '" + conf + "' --check-config", {conf + ":1", "KEY = VALUE"});
  require_cleaved_usage_error("--config '" + dir.file("missing.conf") + "' --check-config",
                              {"missing.conf", "cannot read"});
  write_text(conf, "insecure = true\n");
  require_cleaved_usage_error("--config '" + conf + "' --check-config", {"--coordinator is required"});
  // A key file that is not there: the daemon cannot start (exit 1), named with its line.
  write_text(conf, "coordinator = tcp://127.0.0.1:9\nkey = /nonexistent/k.key\ncoordinator-key = /nonexistent/c.pub\n");
  const RunResult r = run_cleaved("--config '" + conf + "' --check-config");
  INFO(r.output);
  require_exit(r, kExitFailure, {conf + ":2: key", "/nonexistent/k.key"});
  // cleaved --version says the library's version.
  const RunResult v = run_cleaved("--version");
  CHECK(v.code == 0);
  CHECK(v.output.find("cleaved 0.") != std::string::npos);
}
