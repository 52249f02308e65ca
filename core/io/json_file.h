// json_file.h: result JSON files (`--json`), written atomically so that a
// script polling for the file never reads half of it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace cleave {

// Writes `doc` (indented, trailing newline) to `path` through AtomicFileWriter;
// an empty path writes nothing. Throws std::runtime_error "PATH: ...".
void write_json_file(const std::string& path, const nlohmann::json& doc);

}  // namespace cleave
