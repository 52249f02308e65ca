// run_record.cpp: see run_record.h.
#include "apps/cleave/run_record.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "apps/cleave/commands.h"
#include "core/io/json_file.h"

namespace cleave {
namespace {

std::string record_path(const std::string& dir) { return (std::filesystem::path(dir) / "command.json").string(); }

// "--name" of a "--name=value" or "--name" token ("" for anything else).
std::string flag_name(const std::string& token) {
  if (token.rfind("--", 0) != 0 || token.size() == 2) return "";
  return token.substr(0, token.find('='));
}

}  // namespace

void record_run_command(const std::string& dir, const CLI::App& cmd) {
  nlohmann::json flags = nlohmann::json::array();
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->count() == 0 || opt->get_lnames().empty()) continue;
    const std::string name = "--" + opt->get_lnames().front();
    // A resumed run starts from its checkpoint, never from --load or --init.
    if (name == "--resume" || name == "--help" || name == "--load" || name == "--init") continue;
    for (const std::string& value : opt->results()) flags.push_back(name + "=" + value);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // a failure shows in the write's error
  write_json_file(record_path(dir), {{"command", cmd.get_name()}, {"flags", flags}});
}

std::vector<std::string> expand_resume(const std::vector<std::string>& args) {
  if (args.size() < 3 || (args[1] != "train" && args[1] != "fed")) return args;
  std::string dir;
  std::set<std::string> given;
  for (size_t i = 2; i < args.size(); ++i) {
    if (args[i] == "--resume" && i + 1 < args.size()) dir = args[i + 1];
    if (args[i].rfind("--resume=", 0) == 0) dir = args[i].substr(9);
    given.insert(flag_name(args[i]));
  }
  if (dir.empty()) return args;
  std::ifstream in(record_path(dir));
  if (!in)
    throw UsageError("--resume " + dir + ": no " + record_path(dir) +
                     " there: give the --checkpoint-dir of a run (it records its command line there)");
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(in);
    if (record.at("command").get<std::string>() != args[1])
      throw UsageError("--resume " + dir + " holds the checkpoints of `cleave " +
                       record.at("command").get<std::string>() + "`, not of `cleave " + args[1] + "`");
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(record_path(dir) + " is unreadable (" + e.what() + "): it is not a cleave command record");
  }
  std::vector<std::string> out(args.begin(), args.end());
  for (const auto& f : record.value("flags", nlohmann::json::array())) {
    const std::string token = f.get<std::string>();
    if (!given.count(flag_name(token))) out.push_back(token);
  }
  return out;
}

}  // namespace cleave
