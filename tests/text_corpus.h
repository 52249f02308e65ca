// text_corpus.h: a small generated English-like text for the --text tests
// (sentences of a few words drawn by a seeded generator): learnable in a few
// dozen steps, the same on every machine.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace cleave::test {

// About `bytes` bytes of sentences such as "the red cat sees a big dog. ".
inline std::string generated_text(int64_t bytes) {
  static const char* const kWords[4][4] = {{"the", "a", "one", "every"},
                                          {"red", "big", "small", "old"},
                                          {"cat", "dog", "bird", "fox"},
                                          {"sees", "likes", "finds", "hears"}};
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto pick = [&](int row) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return std::string(kWords[row][(state >> 33) % 4]);
  };
  std::string out;
  while (static_cast<int64_t>(out.size()) < bytes)
    out += pick(0) + " " + pick(1) + " " + pick(2) + " " + pick(3) + " " + pick(0) + " " + pick(1) + " " + pick(2) +
           ". ";
  out.resize(static_cast<size_t>(bytes));
  return out;
}

inline void write_generated_text(const std::string& path, int64_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out << generated_text(bytes);
}

}  // namespace cleave::test
