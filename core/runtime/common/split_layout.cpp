// split_layout.cpp: see split_layout.h.
#include "core/runtime/common/split_layout.h"

#include <stdexcept>

#include "core/planner/profile.h"

namespace cleave {

namespace {

std::vector<int64_t> params_per_layer(const ModelSpec& spec) {
  std::vector<int64_t> out;
  for (const auto& l : profile_model(spec, "sgd", 0.0).layers) out.push_back(l.param_count);
  return out;
}

}  // namespace

nlohmann::json SplitLayout::to_json() const {
  nlohmann::json j = {{"cut", cut}, {"labels", labels_on_client ? "client" : "server"},
                      {"client_layers", {0, cut}}, {"server_layers", {server_begin(), server_end()}}};
  if (has_tail()) {
    j["cut_back"] = cut_back;
    j["client_tail_layers"] = {cut_back, num_layers};
  }
  return j;
}

int default_split_cut(const ModelSpec& spec) {
  const auto params = params_per_layer(spec);
  const int n = spec.num_layers();
  int first = 0;
  while (first < n && params[static_cast<size_t>(first)] == 0) ++first;
  if (first >= n - 1)
    throw std::invalid_argument(spec.source + ": no layer with parameters before the last layer to end the client's "
                                "part at; give --cut explicitly");
  int cut = first + 1;
  while (cut < n - 1 && params[static_cast<size_t>(cut)] == 0) ++cut;
  return cut;
}

int default_split_cut_back(const ModelSpec& spec) {
  const auto params = params_per_layer(spec);
  int last = spec.num_layers() - 1;
  while (last > 0 && params[static_cast<size_t>(last)] == 0) --last;
  return last;
}

SplitLayout make_split_layout(const ModelSpec& spec, int cut, int cut_back, bool labels_on_client) {
  const int n = spec.num_layers();
  const std::string layers = "the model (" + spec.source + ") has " + std::to_string(n) + " layers";
  if (n < (labels_on_client ? 3 : 2))
    throw std::invalid_argument("split learning needs at least " + std::string(labels_on_client ? "3" : "2") +
                                " layers (client and server parts" + (labels_on_client ? " and a client tail" : "") +
                                "): " + layers);
  SplitLayout s;
  s.num_layers = n;
  s.labels_on_client = labels_on_client;
  s.cut = cut < 0 ? default_split_cut(spec) : cut;
  if (s.cut < 1 || s.cut >= n)
    throw std::invalid_argument("--cut " + std::to_string(s.cut) + ": " + layers +
                                "; the client's part [0, cut) and the server's must each hold a layer, so cut must be "
                                "in [1, " + std::to_string(n - 1) + "]");
  if (!labels_on_client) {
    if (cut_back >= 0) throw std::invalid_argument("--cut-back applies to --labels client (U-shaped) only");
    s.cut_back = n;
    return s;
  }
  s.cut_back = cut_back < 0 ? std::max(default_split_cut_back(spec), s.cut + 1) : cut_back;
  if (s.cut_back <= s.cut || s.cut_back >= n)
    throw std::invalid_argument("--cut-back " + std::to_string(s.cut_back) + ": " + layers + " and --cut is " +
                                std::to_string(s.cut) + "; the server's middle [cut, cut_back) and the client's tail "
                                "[cut_back, " + std::to_string(n) + ") must each hold a layer, so cut-back must be in [" +
                                std::to_string(s.cut + 1) + ", " + std::to_string(n - 1) + "]");
  return s;
}

}  // namespace cleave
