// krum.h: Krum and multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer 2017,
// "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent").
//
// Of n updates, at most f of them Byzantine, each update is scored by the sum
// of its squared L2 distances to its n - f - 2 nearest other updates; Krum
// keeps the one with the lowest score, multi-Krum averages the m lowest
// (uniform weights). The bound behind it needs n >= 2f + 3.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace cleave {

// "" when Krum over `n` updates may assume `f` Byzantine ones and average `m`
// (m = 1: Krum; 0 < m <= n - f for multi-Krum); otherwise why not and what to do.
std::string krum_refusal(int n, int f, int m);

// The indices of the `m` updates with the lowest Krum scores, best first (ties
// by index). All blocks the same size. Throws std::invalid_argument when
// krum_refusal says no.
std::vector<size_t> krum_select(const std::vector<const std::vector<float>*>& blocks, int f, int m);

}  // namespace cleave
