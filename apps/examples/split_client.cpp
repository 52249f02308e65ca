// split_client.cpp: an app that keeps its own data in memory and joins a
// split-learning run (`cleave split`) as a data client through the SDK's
// header-only C++ wrapper (include/cleave/cleave.hpp) only.
//
//   split_client --coordinator tcp://HOST:PORT --key dev.key --coordinator-key coordinator.pub
//                --shard i/n [--data DIR] [--limit N] [--limit-test M] [--seed S] [--backend B] [--threads T]
//
// It reads Fashion-MNIST's training split from DIR (default
// /usr/share/datasets/fashion-mnist; IDX files, gzip or plain) with zlib, keeps
// shard i of n of the first N samples (contiguous without --seed; with it the
// shard `cleaved --shard i/n --partition iid --seed S --limit-train N` holds:
// the rule is spelled out in fed_client.c) and serves it from the data
// callback; the test split's shard i of n of the first M test samples likewise
// from the test-data callback (what `cleave split` evaluates this client's
// part on; the same samples as cleaved's with `cleave split --limit-test M`).
// The coordinator gives this client the model's first layers; a server daemon
// holds the rest. Progress (connected, job started and ended) is printed by
// the progress callback.
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "cleave/cleave.hpp"

namespace {

constexpr int64_t kPixels = 28 * 28;

// `n` bytes after `skip` bytes of DIR/NAME(.gz); throws naming the file.
std::vector<unsigned char> read_idx(const std::string& dir, const std::string& name, long skip, long n) {
  std::string path = dir + "/" + name + ".gz";
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) f = gzopen((path = dir + "/" + name).c_str(), "rb");
  std::vector<unsigned char> out(static_cast<size_t>(n));
  const bool ok = f && gzseek(f, skip, SEEK_SET) >= 0 && gzread(f, out.data(), static_cast<unsigned>(n)) == n;
  if (f) gzclose(f);
  if (!ok) throw std::runtime_error("cannot read " + path);
  return out;
}

// The sample indices (ascending) of cleaved's iid shard i of n of `total`
// samples for `seed` (core/data/shard.cpp; fed_client.c spells it out).
std::vector<long> iid_shard(uint64_t seed, long total, long i, long n) {
  auto splitmix = [](uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  uint64_t x = seed ^ 0x6a09e667f3bcc909ULL;
  uint64_t h = splitmix(x);  // derive_seed(seed, 0x1d1d, 0, 0)
  for (uint64_t key : {uint64_t{0x1d1d}, uint64_t{0}, uint64_t{0}}) {
    x = h ^ key;
    h = splitmix(x);
  }
  uint64_t s[4];
  for (uint64_t& w : s) w = splitmix(h);
  std::vector<long> order(static_cast<size_t>(total));
  std::iota(order.begin(), order.end(), 0L);
  for (long k = total - 1; k > 0; --k) {
    const uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    std::swap(order[static_cast<size_t>(k)], order[static_cast<size_t>(r % static_cast<uint64_t>(k + 1))]);
  }
  std::vector<long> shard(order.begin() + total * i / n, order.begin() + total * (i + 1) / n);
  std::sort(shard.begin(), shard.end());
  return shard;
}

struct Samples {
  std::vector<float> pixels;  // count x 784, in [0, 1]
  std::vector<float> labels;  // count class indices
  int64_t count() const { return static_cast<int64_t>(labels.size()); }
};

// `split` is "train" or "t10k" (the IDX files' prefixes).
Samples load_shard(const std::string& dir, const std::string& split, long limit, long i, long n, bool seeded,
                   uint64_t seed) {
  const std::vector<unsigned char> px = read_idx(dir, split + "-images-idx3-ubyte", 16, limit * kPixels);
  const std::vector<unsigned char> lb = read_idx(dir, split + "-labels-idx1-ubyte", 8, limit);
  std::vector<long> keep;
  if (seeded) {
    keep = iid_shard(seed, limit, i, n);
  } else {
    keep.resize(static_cast<size_t>((i + 1) * limit / n - i * limit / n));
    std::iota(keep.begin(), keep.end(), i * limit / n);
  }
  Samples out;
  for (long k : keep) {
    for (int64_t j = 0; j < kPixels; ++j) out.pixels.push_back(px[static_cast<size_t>(k * kPixels + j)] / 255.0f);
    out.labels.push_back(lb[static_cast<size_t>(k)]);
  }
  return out;
}

const char* event_name(cleave_event e) {
  switch (e) {
    case CLEAVE_EVENT_CONNECTED: return "connected";
    case CLEAVE_EVENT_JOB_STARTED: return "job started";
    case CLEAVE_EVENT_ROUND: return "round";
    case CLEAVE_EVENT_JOB_ENDED: return "job ended";
    case CLEAVE_EVENT_STEP: return "step";
  }
  return "?";
}

int run(const std::map<std::string, std::string>& flag) {
  auto get = [&flag](const std::string& name, const std::string& fallback = "") {
    const auto it = flag.find(name);
    return it == flag.end() ? fallback : it->second;
  };
  long i = 0, n = 0;
  const long limit = std::atol(get("--limit", "60000").c_str());
  const long limit_test = std::atol(get("--limit-test", "10000").c_str());
  if (get("--coordinator").empty() || get("--key").empty() || get("--coordinator-key").empty() ||
      std::sscanf(get("--shard").c_str(), "%ld/%ld", &i, &n) != 2 || n < 1 || i < 0 || i >= n || limit < n ||
      limit > 60000 || limit_test < n || limit_test > 10000) {
    std::cerr << "usage: split_client --coordinator URL --key FILE --coordinator-key FILE --shard i/n [--data DIR] "
                 "[--limit N] [--limit-test M] [--seed S] [--backend B] [--threads T]\n";
    return 2;
  }
  const bool seeded = flag.count("--seed") != 0;
  const uint64_t seed = std::strtoull(get("--seed", "0").c_str(), nullptr, 10);
  const std::string dir = get("--data", "/usr/share/datasets/fashion-mnist");
  const Samples data = load_shard(dir, "train", limit, i, n, seeded, seed);
  const Samples test = load_shard(dir, "t10k", limit_test, i, n, seeded, seed);
  std::cout << "split_client: cleave " << cleave::version() << ", shard " << get("--shard") << " ("
            << (seeded ? "iid" : "contiguous") << "): " << data.count() << " samples, " << test.count()
            << " test samples" << std::endl;
  // Copies the samples at `idx` out of `from` (the SDK's buffers, valid during the call).
  auto filler = [](const Samples& from) {
    return [&from](const int64_t* idx, int64_t count, float* inputs, float* labels) {
      for (int64_t k = 0; k < count; ++k) {
        if (idx[k] < 0 || idx[k] >= from.count()) throw std::out_of_range("sample index out of range");
        std::copy_n(from.pixels.data() + idx[k] * kPixels, kPixels, inputs + k * kPixels);
        labels[k] = from.labels[static_cast<size_t>(idx[k])];
      }
      return count;
    };
  };

  cleave::Options o;
  o.coordinator(get("--coordinator"))
      .key_files(get("--key"), get("--coordinator-key"))
      .backend(get("--backend", "auto"), std::atoi(get("--threads", "0").c_str()))
      .role(CLEAVE_ROLE_SPLIT_CLIENT)
      .max_jobs(1)
      .data(data.count(), {1, 28, 28}, 10, get("--shard"), filler(data))
      .test_data(test.count(), filler(test))
      .on_progress([](const cleave_progress& p) {
        if (p.event == CLEAVE_EVENT_STEP) {  // every batch: a line per 5 is plenty
          if ((p.step + 1) % 5 == 0) std::cout << "progress: step " << p.step + 1 << std::endl;
          return;
        }
        std::cout << "progress: " << event_name(p.event);
        if (p.event == CLEAVE_EVENT_ROUND) std::cout << " " << p.step + 1 << ", loss " << p.loss;
        std::cout << std::endl;
      });
  cleave::Client client(o);
  client.start();
  client.wait();
  const cleave_client_info info = client.status();
  std::cout << "split_client: done, " << info.jobs_done << " job(s)" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flag;
  for (int a = 1; a + 1 < argc; a += 2) flag[argv[a]] = argv[a + 1];
  try {
    return run(flag);
  } catch (const std::exception& e) {
    std::cerr << "split_client: " << e.what() << "\n";
    return 1;
  }
}
