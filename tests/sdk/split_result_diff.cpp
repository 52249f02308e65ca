// split_result_diff.cpp: `split_result_diff WANT.json GOT.json [TOLERANCE]`
// compares two `cleave split --json` results for the installed-package test
// (installed_package.sh): the same number of training steps, every training
// loss within TOLERANCE (default 1e-6) relative (max(1, |want|) as the
// denominator, as test_sdk_split_example.cpp), the same test samples and test
// accuracy, and the test loss within TOLERANCE. Exit 0 when they agree; 1
// otherwise, saying why; 2 for bad arguments or an unreadable file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return nlohmann::json::parse(in);
}

bool close(double want, double got, double tol) { return std::abs(got - want) <= tol * std::max(1.0, std::abs(want)); }

// "" when the results agree, else the first difference.
std::string difference(const nlohmann::json& want, const nlohmann::json& got, double tol) {
  const auto& a = want.at("losses");
  const auto& b = got.at("losses");
  if (a.size() != b.size() || a.empty())
    return "training steps differ: " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (!close(a[i].get<double>(), b[i].get<double>(), tol))
      return "the loss of step " + std::to_string(i) + " differs: " + a[i].dump() + " and " + b[i].dump();
  if (want.at("test_samples") != got.at("test_samples"))
    return "test samples differ: " + want.at("test_samples").dump() + " and " + got.at("test_samples").dump();
  if (want.at("test_accuracy") != got.at("test_accuracy"))
    return "test accuracy differs: " + want.at("test_accuracy").dump() + " and " + got.at("test_accuracy").dump();
  if (!close(want.at("test_loss").get<double>(), got.at("test_loss").get<double>(), tol))
    return "test loss differs: " + want.at("test_loss").dump() + " and " + got.at("test_loss").dump();
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: split_result_diff WANT.json GOT.json [TOLERANCE]\n");
    return 2;
  }
  try {
    const double tol = argc == 4 ? std::stod(argv[3]) : 1e-6;
    const nlohmann::json want = read_json(argv[1]), got = read_json(argv[2]);
    const std::string why = difference(want, got, tol);
    if (!why.empty()) {
      std::printf("split_result_diff: %s\n", why.c_str());
      return 1;
    }
    std::printf("split_result_diff: %zu steps, test accuracy %s: the same\n", want.at("losses").size(),
                want.at("test_accuracy").dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "split_result_diff: %s\n", e.what());
    return 2;
  }
}
