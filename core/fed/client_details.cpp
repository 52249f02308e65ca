// client_details.cpp: see client_details.h.
#include "core/fed/client_details.h"

#include <cctype>
#include <stdexcept>

#include "core/io/untrusted_json.h"

namespace cleave {

namespace {

// "i/N" with digits on both sides.
bool is_shard_text(const std::string& s) {
  const auto slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size()) return false;
  for (size_t i = 0; i < s.size(); ++i)
    if (i != slash && !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

FedClientDetails read_fields(const nlohmann::json& details) {
  FedClientDetails d;
  d.fed_client = json_bool(details, "fed_client", false);
  if (!d.fed_client) return d;
  if (!details.contains("samples"))
    throw std::invalid_argument("\"samples\" must be an integer (the shard's training samples), missing");
  d.samples = json_integer(details, "samples", 0, 0, int64_t{1} << 50, "an integer (the shard's training samples)");
  const std::string like = "a string like \"1/3\"";
  d.shard = json_string(details, "shard", d.shard, like);
  if (d.shard != "?" && !is_shard_text(d.shard))
    throw std::invalid_argument("\"shard\" must be " + like + ", got " + json_excerpt(nlohmann::json(d.shard)));
  d.partition = json_string(details, "partition", d.partition);
  d.dataset = json_string(details, "dataset", d.dataset);
  d.fed_jobs = json_bool(details, "fed_jobs", d.fed_jobs);
  d.split_jobs = json_bool(details, "split_jobs", d.split_jobs);
  return d;
}

}  // namespace

FedClientDetails read_fed_client_details(const nlohmann::json& details, const std::string& parse_error) {
  if (!parse_error.empty()) throw std::invalid_argument(parse_error);
  try {
    return read_fields(details);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("registration details: ") + e.what());
  }
}

}  // namespace cleave
