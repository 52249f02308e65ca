// fed_state_diff.cpp: `fed_state_diff WANT GOT [TOLERANCE]` compares the global
// weights of two federated checkpoints (`cleave fed --save`) for the
// installed-package test (installed_package.sh). Exit 0 when both hold the same
// number of rounds and parameters and every parameter is within TOLERANCE
// (default 1e-6) relative, max(1e-3, |want|) as the denominator (as
// test_sdk_fed.cpp); 1 otherwise, saying why; 2 for bad arguments or an
// unreadable file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include "core/train/train_checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: fed_state_diff WANT.ckpt GOT.ckpt [TOLERANCE]\n");
    return 2;
  }
  try {
    const double tolerance = argc == 4 ? std::stod(argv[3]) : 1e-6;
    const cleave::FedState want = cleave::load_fed_state(argv[1]), got = cleave::load_fed_state(argv[2]);
    if (want.rounds_done != got.rounds_done || want.params.size() != got.params.size()) {
      std::fprintf(stderr, "fed_state_diff: %lld rounds / %zu parameters, want %lld / %zu\n",
                   static_cast<long long>(got.rounds_done), got.params.size(),
                   static_cast<long long>(want.rounds_done), want.params.size());
      return 1;
    }
    double worst = 0;
    for (size_t i = 0; i < got.params.size(); ++i) {
      const double w = want.params[i], g = got.params[i];
      worst = std::max(worst, std::abs(g - w) / std::max(1e-3, std::abs(w)));
    }
    std::printf("fed_state_diff: %zu parameters after %lld rounds, largest relative difference %.3g\n",
                got.params.size(), static_cast<long long>(got.rounds_done), worst);
    return worst <= tolerance ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fed_state_diff: %s\n", e.what());
    return 2;
  }
}
